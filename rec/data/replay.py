"""`rec stream replay`: feed an event stream (rec.contract.events) from a file or the synthetic
generator, so that stream training can be tried without an application producing events.

Sources, each read in file order (a file must already be in time order: the replayer does not
sort), and turned into events keyed by the feature spec's columns (rec.features.feature_spec of
the config), the same cells the file readers take:
  - CSV (data.source: csv): each row's cells as text, as the CSV reader sees them;
  - Parquet (data.source: parquet): each row's values (numbers, strings, lists, nulls);
  - Criteo TSV (data.source: criteo_tsv): label, I1..I13, C1..C26 as text;
  - synthetic: positions [start, start + n) of the generator's train split (its churn and drift
    included, as data.synthetic sets them): labels 0/1, the dense values, the ids as integers.
A row with a missing or extra cell is sent as it is; the reader refuses and parks it, which is
how a bad row looks in a stream.

Partitions (rec.contract.partitions): `partitions` P creates the stream's layout record (SET NX)
or checks the one there (the same P, and `key` if given); without it a layout already there is
followed. Each event goes to partition crc32(utf8(str(event[key]))) mod P (event_partition), an
entry cut as below then split by partition, each part its own entry in order; without a key
column, each entry goes to the next partition in turn (round robin). One sender per partition
dials the partition's node (rec.logs.route.Router) and resends after an outage as for one stream.

Replication (`wait_replicas`): Redis replicates asynchronously, so a master that dies can take
the entries it acknowledged last with it; its replica, promoted, never had them. Each round trip
ends in WAIT N (timeout `wait_timeout_s`) and its entries count as sent only once WAIT answers,
so an outage before then resends what the promoted replica lacks. None ("auto") is 1 when the
partition's master reports connected_slaves >= 1 at connect, else 0 (no WAIT). A WAIT that times
out with fewer replicas counts its entries `unreplicated`, warns, and goes on.

Pacing: `rate` sends R events per second on a fixed schedule; `speed` replays a file's own
clock X times faster, from its `time_column` (seconds, e.g. Unix time): an event is sent
(t - t_first) / X after the start. Neither: as fast as the broker takes them. An entry holds
up to `per_entry` events (64) or 50 ms of the schedule, whichever comes first, so a paced
replay adds at most 50 ms to an event's delay.
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rec.config import RecConfig, StreamConfig
from rec.contract.events import MAX_EVENTS, encode, parse_url
from rec.contract.partitions import Layout, event_partition, layout_key, make_layout, parse_layout
from rec.data.backoff import Backoff
from rec.data.errors import DataError
from rec.features import feature_spec
from rec.logs.route import Router

WAIT_TIMEOUT_S = 1.0
"""How long a round trip's WAIT waits for its replicas before its entries count unreplicated."""
CHUNK = 4096
"""Events read from a source at a time."""
PIPELINE = 1024
"""Events sent in one round trip at most, when they are already due."""
SPAN_S = 0.05
"""An entry holds at most this much of the schedule (with --rate or --speed)."""
_RETRY = StreamConfig()
"""The reconnection backoff's defaults: the stream reader's (data.stream.retry_s, max_retry_s)."""

Chunk = tuple[list[dict[str, Any]], list[float] | None]
"""Events, and each one's file time in seconds (None without a time column)."""


@dataclass
class ReplayStats:
    events: int = 0
    entries: int = 0
    seconds: float = 0.0
    unreplicated: int = 0
    """Entries whose WAIT timed out before `wait_replicas` replicas had them."""

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


def spec_columns(cfg: RecConfig) -> list[str]:
    spec = feature_spec(cfg)
    return list(spec.labels) + [d.column for d in spec.dense] + [s.column for s in spec.sparse]


def file_events(cfg: RecConfig, path: Path, time_column: str = "") -> tuple[int, Iterator[Chunk]]:
    """(events in the file, its chunks) of a CSV, Parquet or Criteo TSV file as data.source
    says; DataError for a missing file or column."""
    if not Path(path).is_file():
        raise DataError(f"{path}: no such file")
    source = cfg.data.source
    if source == "csv":
        return _csv(cfg, Path(path), time_column)
    if source == "parquet":
        return _parquet(cfg, Path(path), time_column)
    if source == "criteo_tsv":
        if time_column:
            raise DataError("Criteo TSV has no time column; replay it with --rate")
        return _criteo(cfg, Path(path))
    raise DataError(
        f"data.source={source!r}: a file replays as csv, parquet or criteo_tsv; for the "
        "synthetic generator use --synthetic N"
    )


def _need(path: Path, have: list[str], need: list[str]) -> None:
    missing = [c for c in need if c not in have]
    if missing:
        raise DataError(
            f"{path}: no column {missing[0]!r} (it has {have}); the config's "
            "data.columns maps the features to columns"
        )


def _csv(cfg: RecConfig, path: Path, time_column: str) -> tuple[int, Iterator[Chunk]]:
    from rec.data.text import count_lines

    cols = spec_columns(cfg)
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        header = [h.strip() for h in next(csv.reader(f, delimiter=cfg.data.delimiter), [])]
    _need(path, header, cols + ([time_column] if time_column else []))
    keep = [(c, header.index(c)) for c in cols]

    def chunks() -> Iterator[Chunk]:
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            rows = csv.reader(f, delimiter=cfg.data.delimiter)
            next(rows)
            t = header.index(time_column) if time_column else -1
            events, times = [], []
            for row in rows:
                events.append({c: row[j] for c, j in keep if j < len(row)})
                if t >= 0:
                    times.append(_seconds(path, row[t] if t < len(row) else "", len(times)))
                if len(events) == CHUNK:
                    yield events, times if t >= 0 else None
                    events, times = [], []
            if events:
                yield events, times if t >= 0 else None

    return count_lines(str(path), header=True), chunks()


def _seconds(path: Path, cell: Any, i: int) -> float:
    """A time cell as seconds: a number (Unix time, or any origin), or an ISO 8601 date and
    time (`2026-11-01T00:00:08.44`, `2026-11-01 00:00:08+01:00`; without an offset: UTC)."""
    try:
        value = float(cell)
    except (TypeError, ValueError):
        value = _iso_seconds(cell)
    if not math.isfinite(value):
        raise DataError(f"{path}: event {i + 1}: time {cell!r} is neither a number of seconds "
                        "nor an ISO 8601 date and time")  # fmt: skip
    return value


def _iso_seconds(cell: Any) -> float:
    import datetime as dt

    if isinstance(cell, dt.datetime):  # a Parquet timestamp column
        when = cell
    else:
        try:
            when = dt.datetime.fromisoformat(str(cell))
        except ValueError:
            return math.nan
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()


def _parquet(cfg: RecConfig, path: Path, time_column: str) -> tuple[int, Iterator[Chunk]]:
    import pyarrow.parquet as pq

    cols = spec_columns(cfg)
    pf = pq.ParquetFile(path)
    _need(path, pf.schema_arrow.names, cols + ([time_column] if time_column else []))
    read = list(dict.fromkeys(cols + ([time_column] if time_column else [])))

    def chunks() -> Iterator[Chunk]:
        done = 0
        for batch in pf.iter_batches(CHUNK, columns=read):
            rows = batch.to_pylist()
            events = [{c: _json_safe(r[c]) for c in cols} for r in rows]
            times = None
            if time_column:
                times = [_seconds(path, r[time_column], done + i) for i, r in enumerate(rows)]
            done += len(rows)
            yield events, times

    return pf.metadata.num_rows, chunks()


def _json_safe(value: Any) -> Any:
    """NaN and infinities have no JSON form: sent as text, the reader refuses them by name."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _criteo(cfg: RecConfig, path: Path) -> tuple[int, Iterator[Chunk]]:
    from rec.data.text import count_lines

    cols = spec_columns(cfg)

    def chunks() -> Iterator[Chunk]:
        with open(path, encoding="utf-8", errors="replace") as f:
            events = []
            for line in f:
                cells = line.rstrip("\n").split("\t")
                events.append(dict(zip(cols, cells, strict=False)))
                if len(events) == CHUNK:
                    yield events, None
                    events = []
            if events:
                yield events, None

    return count_lines(str(path), header=False), chunks()


def synthetic_events(cfg: RecConfig, n: int, start: int = 0) -> tuple[int, Iterator[Chunk]]:
    """Positions [start, start + n) of the synthetic train split, as events."""
    from rec.data.synthetic import SyntheticSource

    spec = feature_spec(cfg)
    src = SyntheticSource(cfg, "train")
    labels, dense = spec.labels, [d.column for d in spec.dense]
    sparse = [s.column for s in spec.sparse]

    def chunks() -> Iterator[Chunk]:
        for lo in range(start, start + n, CHUNK):
            rows = src.take(lo, min(lo + CHUNK, start + n)).rows
            yield _rows_to_events(rows, labels, dense, sparse), None

    return n, chunks()


def _rows_to_events(rows, labels, dense, sparse) -> list[dict[str, Any]]:
    lab = rows.labels.astype(int).tolist()
    den = rows.dense.astype(float).tolist()  # an f32 widened to f64 prints exactly
    lengths = rows.lengths.tolist()
    values = rows.values.tolist()
    out, at = [], 0
    for i in range(len(lab)):
        event = dict(zip(labels, lab[i], strict=True))
        event.update(zip(dense, den[i], strict=True))
        for column, k in zip(sparse, lengths[i], strict=True):
            event[column] = values[at : at + k]
            at += k
        out.append(event)
    return out


def replay(
    chunks: Iterator[Chunk],
    url: str,
    rate: float | None = None,
    speed: float | None = None,
    per_entry: int = 64,
    progress: Callable[[ReplayStats], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    retry_s: float = _RETRY.retry_s,
    max_retry_s: float = _RETRY.max_retry_s,
    log: Callable[[str], None] = print,
    partitions: int = 0,
    key: str = "",
    wait_replicas: int | None = None,
    wait_timeout_s: float = WAIT_TIMEOUT_S,
) -> ReplayStats:
    """Sends the chunks' events to the stream at `url`, paced as the module docstring says;
    `progress(stats)` about once a second and at the end. While the broker is away it waits
    as the stream reader does (retry_s, doubling up to max_retry_s; data.stream's), saying so
    through `log`, and goes on where the broker stopped taking entries. `partitions`, `key`:
    the stream's partitions and the column events are partitioned by; `wait_replicas` (None:
    auto), `wait_timeout_s`: the WAIT ending each round trip (module docstring)."""
    if rate is not None and speed is not None:
        raise ValueError("give --rate or --speed, not both")
    if not 0 < per_entry <= MAX_EVENTS:
        raise ValueError(f"per_entry={per_entry} must be in [1, {MAX_EVENTS}]")
    router, backoff = Router(parse_url(url).nodes), Backoff(retry_s, max_retry_s)
    layout = _layout_when_up(url, router, partitions, key, backoff, log)
    wait = _Wait(wait_replicas, wait_timeout_s, log)
    sender: _Sender | _Fanout = (_Sender(url, backoff, log, router=router, wait=wait)
                                 if layout is None
                                 else _Fanout(url, layout, backoff, log, router, wait))  # fmt: skip
    if layout is not None:
        how = f"by crc32 of column {layout.key!r}" if layout.key else "round robin"
        log(f"{parse_url(url)}: {layout.partitions} partitions ({how})")
    stats, t0, first_time = ReplayStats(), clock(), None
    ticker = _Ticker(stats, t0, progress, clock)
    try:
        for events, times in chunks:
            if speed is not None and times is None:
                raise DataError("--speed replays the file's clock: name its --time-column")
            if speed is not None and first_time is None and times:
                first_time = times[0]
            due = _schedule(len(events), stats.events, times, t0, rate, speed, first_time)
            _send(sender, events, due, per_entry, ticker)
    finally:
        sender.close()
    stats.unreplicated = wait.unreplicated
    ticker(final=True)
    return stats


def _layout_when_up(url: str, router: Router, partitions: int, key: str, backoff: Backoff,
                    log: Callable[[str], None]) -> Layout | None:  # fmt: skip
    """ensure_layout, waiting with `backoff` while the broker is away (as the senders do)."""
    import redis

    away = False
    while True:
        try:
            layout = ensure_layout(url, router, partitions, key)
            backoff.reset()
            return layout
        except (redis.RedisError, OSError) as e:
            if not router.reroutes(e):
                raise
            router.invalidate()
            if not away:
                away = True
                log(f"the stream {url} is unreachable ({e}); waiting for it")
            backoff.wait()


def ensure_layout(url: str, router: Router, partitions: int = 0, key: str = "") -> Layout | None:
    """The stream's layout: created (SET NX) when `partitions` is given and there is none,
    checked against `partitions` and `key` when there is one; None for one stream (no layout
    and no `partitions`). A ValueError naming both when they differ."""
    import redis

    where = parse_url(url)
    name = layout_key(where.stream)
    host, port = router.node_for(name)
    client = redis.Redis(host=host, port=port, socket_connect_timeout=2, socket_timeout=10)
    try:
        if partitions:
            client.set(name, make_layout(where.stream, partitions, key).to_json(), nx=True)
        text = client.get(name)
    finally:
        client.close()
    if text is None:
        return None
    layout = parse_layout(text, f"{where} {name}")
    if partitions and (layout.partitions, layout.key) != (partitions, key):
        raise ValueError(f"{where} is already {layout.partitions} partitions keyed by "
                         f"{layout.key or '(round robin)'!r} ({name}); asked for {partitions} "
                         f"keyed by {key or '(round robin)'!r}: a partitioned stream keeps its "
                         "layout (replay into another stream name to change it)")  # fmt: skip
    if key and layout.key != key:
        raise ValueError(f"{where} is partitioned by {layout.key or '(round robin)'!r}, "
                         f"not {key!r} ({name})")  # fmt: skip
    return layout


class _Wait:
    """The WAIT ending each round trip (module docstring), shared by a replay's senders: the
    replicas asked for (None: auto, per master) and what timed out."""

    def __init__(self, replicas: int | None, timeout_s: float, log: Callable[[str], None]):
        self.replicas, self.timeout_ms = replicas, max(1, int(timeout_s * 1000))
        self.log = log
        self.unreplicated = 0
        self.warned = -math.inf

    def resolve(self, client: Any) -> int:
        """Replicas to wait for on the master `client` talks to (auto: 1 if it has one)."""
        if self.replicas is not None:
            return self.replicas
        return 1 if int(client.info("replication").get("connected_slaves", 0)) >= 1 else 0

    def check(self, key: str, want: int, got: int, entries: int) -> None:
        """A WAIT's answer: fewer than `want` replicas counts `entries` unreplicated, warned
        about at most every 10 s; the replay goes on."""
        if got >= want:
            return
        self.unreplicated += entries
        now = time.monotonic()
        if now - self.warned >= 10.0:
            self.warned = now
            self.log(f"warning: {key}: WAIT {want} answered {got} within "
                     f"{self.timeout_ms} ms; {self.unreplicated:,} entries unreplicated so far "
                     "(a failover now could lose them); going on")  # fmt: skip


class _Sender:
    """XADDs entries to the stream in pipelined round trips. When the broker goes away (a
    restart, a network break) it closes the connection, waits with `backoff`, reconnects, and
    sends again the entries of the failed round trip the broker had not taken: those after
    the last entry it acknowledged that are not yet in the stream. The broker appends a
    pipeline's commands in order, so what it took is a prefix of them; matching that prefix by
    the entries' fields keeps an entry from being sent twice (another producer's entries in
    between do not match and are passed over). Each round trip ends in `wait`'s WAIT (module
    docstring); an error before its answer keeps the entries queued, to be matched as above."""

    def __init__(self, url: str, backoff: Backoff, log: Callable[[str], None],
                 key: str = "", router: Router | None = None,
                 wait: _Wait | None = None) -> None:  # fmt: skip
        self.url, self.where, self.backoff, self.log = url, parse_url(url), backoff, log
        self.wait = wait or _Wait(0, WAIT_TIMEOUT_S, log)
        self.replicas = 0
        """WAIT's replica count on the master connected to (resolved at connect)."""
        self.key = key or self.where.stream
        """The stream key: the URL's stream, or one of its partitions."""
        self.router = router or Router(self.where.nodes)
        self.client: Any = None
        self.queued: list[dict[str, str]] = []
        self.last_id: bytes | None = None
        """The newest entry of the stream known to hold everything sent before `queued`."""

    def add(self, fields: dict[str, str]) -> None:
        self.queued.append(fields)

    def put(self, events: list[dict[str, Any]]) -> int:
        """Queues the events as one entry; the entries queued (1)."""
        self.add(encode(events))
        return 1

    def flush(self) -> None:
        import redis

        away = False
        while self.queued:
            try:
                if self.client is None:
                    self._connect()
                pipe = self.client.pipeline(transaction=False)
                for fields in self.queued:
                    pipe.xadd(self.key, fields)
                if self.replicas:
                    pipe.wait(self.replicas, self.wait.timeout_ms)
                replies = pipe.execute()
                if self.replicas:
                    self.wait.check(self.key, self.replicas, int(replies.pop()), len(replies))
                self.last_id = replies[-1]
                self.queued = []
            except (redis.RedisError, OSError) as e:
                if not self.router.reroutes(e):
                    raise
                self.close()
                self.router.invalidate()
                if not away:
                    away = True
                    self.log(f"the stream {self.url} is unreachable ({e}); waiting for it, "
                             f"retrying every {self.backoff.first:g} s doubling to "
                             f"{self.backoff.most:g} s")  # fmt: skip
                self.backoff.wait()
        if away:
            self.log(f"the stream {self.url} is back; replay goes on")
        self.backoff.reset()

    def _connect(self) -> None:
        """A connection (with no retries of its own: flush does them), then what the stream
        took since `last_id` dropped from `queued`; at the first, the stream's newest entry."""
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        host, port = self.router.node_for(self.key)
        client = redis.Redis(host=host, port=port, socket_connect_timeout=2, socket_timeout=10,
                             retry=Retry(NoBackoff(), 0))  # fmt: skip
        try:
            self.replicas = self.wait.resolve(client)
            if self.last_id is None:
                newest = client.xrevrange(self.key, count=1)
                self.last_id = newest[0][0] if newest else b"0-0"
            else:
                self._drop_taken(client)
        except Exception:
            client.close()
            raise
        self.client = client

    def _drop_taken(self, client: Any) -> None:
        taken = client.xrange(self.key, min=b"(" + self.last_id)
        mine = [{k.encode(): v.encode() for k, v in f.items()} for f in self.queued]
        done = 0
        for entry_id, fields in taken:
            if done < len(mine) and fields == mine[done]:
                done += 1
            self.last_id = entry_id
        if done:
            self.log(f"the stream had taken {done} of the {len(mine)} entries in flight; "
                     "sending the rest")  # fmt: skip
        self.queued = self.queued[done:]

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


class _Fanout:
    """A partitioned stream's senders, one per partition (module docstring)."""

    def __init__(self, url: str, layout: Layout, backoff: Backoff, log: Callable[[str], None],
                 router: Router, wait: _Wait) -> None:  # fmt: skip
        self.layout = layout
        self.senders = [_Sender(url, backoff, log, key, router, wait) for key in layout.keys]
        self.turn = 0

    def put(self, events: list[dict[str, Any]]) -> int:
        """Queues the events to their partitions; the entries queued."""
        if not self.layout.key:
            self.senders[self.turn].put(events)
            self.turn = (self.turn + 1) % len(self.senders)
            return 1
        parts: dict[int, list[dict[str, Any]]] = {}
        for event in events:
            k = event_partition(event.get(self.layout.key), self.layout.partitions)
            parts.setdefault(k, []).append(event)
        for k, part in parts.items():
            self.senders[k].put(part)
        return len(parts)

    def flush(self) -> None:
        for sender in self.senders:
            if sender.queued:
                sender.flush()

    def close(self) -> None:
        for sender in self.senders:
            sender.close()


class _Ticker:
    """Keeps stats.seconds current and calls progress about once a second, and at the end."""

    def __init__(self, stats: ReplayStats, t0: float, progress, clock) -> None:
        self.stats, self.t0, self.progress, self.clock = stats, t0, progress, clock
        self.shown = t0

    def __call__(self, final: bool = False) -> None:
        now = self.clock()
        self.stats.seconds = now - self.t0
        if self.progress is not None and (final or now - self.shown >= 1.0):
            self.shown = now
            self.progress(self.stats)


def _send(sender: _Sender | _Fanout, events: list, due: list[float], per_entry: int,
          tick: _Ticker) -> None:  # fmt: skip
    """XADDs the events as entries, each when its last event is due; entries already due go
    in one pipelined round trip (up to PIPELINE events)."""
    queued = 0
    for lo, hi in _entries(due, per_entry):
        if queued and (due[hi - 1] > tick.clock() or queued >= PIPELINE):
            sender.flush()
            queued = 0
            tick()
        _sleep_until(due[hi - 1], tick.clock)
        tick.stats.entries += sender.put(events[lo:hi])
        queued += hi - lo
        tick.stats.events += hi - lo
    if queued:
        sender.flush()
        tick()


def _schedule(n: int, sent: int, times, t0: float, rate, speed, first_time) -> list[float]:
    """When each of the next n events is due, on the clock."""
    if rate is not None:
        return [t0 + (sent + i) / rate for i in range(n)]
    if speed is not None:
        return [t0 + (t - first_time) / speed for t in times]
    return [t0] * n


def _entries(due: list[float], per_entry: int) -> Iterator[tuple[int, int]]:
    """[lo, hi) events per entry: up to per_entry, spanning at most SPAN_S of the schedule."""
    lo = 0
    while lo < len(due):
        hi = lo + 1
        while hi < len(due) and hi - lo < per_entry and due[hi] - due[lo] <= SPAN_S:
            hi += 1
        yield lo, hi
        lo = hi


def _sleep_until(when: float, clock: Callable[[], float]) -> None:
    left = when - clock()
    if left > 0:
        time.sleep(left)


def progress_line(stats: ReplayStats, total: int) -> str:
    """`12,800/100,000 events in 200 entries, 3,200 events/s, ETA 27 s`."""
    rate = stats.rate
    left = max(total - stats.events, 0)
    eta = f"ETA {left / rate:,.0f} s" if rate > 0 and left else "done" if not left else "ETA ?"
    done = f"{stats.events:,}/{total:,} events in {stats.entries:,} entries"
    return f"{done}, {rate:,.0f} events/s, {eta}"
