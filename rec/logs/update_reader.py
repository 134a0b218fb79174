"""Reading the update log in any layout (#60): one stream (legacy) or P partitions, each on the
master of its slot.

A publishing rank r writes partition r mod P only (train.publish), so each rank's records keep
their order in one partition. Within a generation (one start of the run) a row belongs to one
rank, so any interleaving of the partitions is a valid order (the map rules of rec.served_map
decide by (gen, step)). Across generations it is not: a resume, maybe on another world, re-sends
at their checkpoint values the rows the dead generation published past it, and a dead rank's
record read after them would undo that. So no record of generation g is returned while a
partition not yet read to its end may still hold older ones: such a partition's entries of a
newer generation are held back (its cursor stays before them, and it is not read again until the
others have caught up), and each read's entries are returned in generation order (stable, so
each partition's order stays). The one stream's order is the log's, as before.

`PartitionedLogReader` keeps a cursor per partition. A read is one pipelined non-blocking XREAD
per node (its partitions' keys each their own command: one XREAD of keys in several slots is a
CROSSSLOT error on a cluster); when every partition is empty it blocks BLOCK_MS on one partition,
a different one each time, so news on any of them waits at most about P * BLOCK_MS while an idle
reader costs one round trip per BLOCK_MS. One stream (the legacy layout, or P = 1) is one XREAD
that blocks `block_ms`, as rec.update_log.LogReader always did.

Until it knows the layout (a reader may start before the first publisher creates it), each read
also asks for the layout record; reading an entry of the plain stream settles the legacy layout.

Example:
    >>> reader = PartitionedLogReader("redis://127.0.0.1:6379/rec:updates")  # doctest: +SKIP
    >>> for entries in reader.follow(stop): ...                             # doctest: +SKIP
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from rec.contract.partitions import Layout, PartitionError, layout_key, parse_layout
from rec.contract.updates import UpdateError, UpdateRecord, decode, parse_url
from rec.logs.route import Node, Router, describe

Entry = tuple[str, UpdateRecord | UpdateError]
"""One log entry: its id and its record, or why it is malformed."""
BLOCK_MS = 50
"""How long a partitioned reader with nothing to read blocks on one partition."""


def entry_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id ("ms-seq") as what orders it."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class PartitionedLogReader:
    """The update log at `url`, read after entry `cursor` of the legacy stream, or after
    `cursors[k]` of partition k ("0", from the start, for each partition not named).

    `read()` reads up to `count` entries per partition (waiting as the module docstring says;
    block_ms None: not at all), each decoded, and moves the cursors past them. `until`: the last
    entry to read of each stream (the legacy one is 0), for a replay up to a saved place;
    entries past it are dropped and that stream is read no more. `follow(stop)`, `on_event`,
    `retry_s`, `max_retry_s` and `redis_retries` as rec.update_log.LogReader's."""

    def __init__(self, url: str, cursor: str = "0", *, cursors: dict[int, str] | None = None,
                 count: int = 256, block_ms: int | None = 300, retry_s: float = 0.2,
                 max_retry_s: float = 0.2, redis_retries: bool = False,
                 until: dict[int, str] | None = None,
                 on_event: Callable[[str, str], None] | None = None) -> None:  # fmt: skip
        self.where, self.url = parse_url(url), url
        self.router = Router(self.where.nodes)
        self.cursor, self.cursors = cursor, dict(cursors or {})
        self.count, self.block_ms = count, block_ms
        self.retry_s, self.max_retry_s = retry_s, max_retry_s
        self.redis_retries = redis_retries
        self.until = {k: entry_key(v) for k, v in (until or {}).items()}
        self.done: set[int] = set()  # streams read up to `until`
        self.on_event = on_event or (lambda kind, message: None)
        self.layout: Layout | None = None
        self.settled = cursor != "0"  # a legacy cursor past the start: entries were read
        self.clients: dict[Node, object] = {}
        self.up: bool | None = None
        self._turn = 0
        self.caught: set[int] = set()  # partitions read to their end by their last read
        self.next_gen: dict[
            int, int
        ] = {}  # the generation of a partition's next unread entry, at least

    @property
    def partitions(self) -> int:
        """P of a partitioned log; 0 for the legacy layout (or while not known)."""
        return self.layout.partitions if self.layout else 0

    def places(self) -> dict[int, str]:
        """Where the reader is: the cursor of each partition ({0: cursor} for the legacy one)."""
        if self.layout is None:
            return {0: self.cursor}
        return {k: self.cursors.get(k, "0") for k in range(self.layout.partitions)}

    def read(self) -> list[Entry]:
        """One read of every stream after its cursor (class docstring); redis-py's error if a
        node fails it, a routing one (MOVED, a lost node) included."""
        if not self.settled:
            self._look_for_layout()
        streams = [(k, key) for k, key in self._streams() if k not in self.done]
        held: list[int] = []
        if self.layout is not None:  # a partition held back waits until the others catch up
            low = self._low()
            held = [k for k, _ in streams if self.next_gen.get(k, 0) > low]
            streams = [(k, key) for k, key in streams if k not in held]
        if not streams:
            return []
        if len(streams) == 1:
            got = {streams[0][0]: self._xread(*streams[0], self.block_ms)}
        else:
            got = self._sweep(streams)
            if not any(got.values()) and self.block_ms is not None:
                k, key = streams[self._turn % len(streams)]
                self._turn += 1
                got = {k: self._xread(k, key, min(self.block_ms, BLOCK_MS))}
        if self.up is not True:
            self.up = True
            self.on_event("up", f"reading update log {self.where} from {self._where_from()}")
        taken = {k: self._take(k, raw) for k, raw in got.items()}
        if self.layout is None:
            entries = taken.get(0, [])
            if entries:
                self.cursor, self.settled = entries[-1][0], True
            return entries
        entries = self._in_generation_order(taken, {k: len(raw) for k, raw in got.items()})
        if not entries and any(self.next_gen[k] <= self._low() for k in held):
            return self.read()  # the others caught up: the partitions held back go on now
        return entries

    def _low(self) -> int | float:
        """The oldest generation a partition not read to its end may still hold."""
        behind = [self.next_gen.get(k, 0) for k in range(self.partitions)
                  if k not in self.caught and k not in self.done]  # fmt: skip
        return min(behind, default=float("inf"))

    def _in_generation_order(self, taken: dict[int, list[Entry]],
                             fetched: dict[int, int]) -> list[Entry]:  # fmt: skip
        """The entries of one read that no unread older record can precede, in generation
        order; the rest held back (module docstring), the cursors moved past what is returned."""
        gens: dict[int, list[int]] = {}
        for k, entries in taken.items():
            gen, gens[k] = self.next_gen.get(k, 0), []
            for _, rec in entries:
                gen = rec.gen if isinstance(rec, UpdateRecord) else gen  # malformed: no gen
                gens[k].append(gen)
            self.next_gen[k] = gen
            self.caught.discard(k)
            if fetched[k] < self.count:
                self.caught.add(k)
        low = self._low()
        out: list[tuple[int, Entry]] = []
        for k, entries in taken.items():
            cut = next((i for i, g in enumerate(gens[k]) if g > low), len(entries))
            if cut < len(entries):  # held back: read again once the others caught up
                self.next_gen[k] = gens[k][cut]
                self.caught.discard(k)
                self.done.discard(k)
            if cut:
                self.cursors[k] = entries[cut - 1][0]
            out += zip(gens[k][:cut], entries[:cut], strict=True)
        out.sort(key=lambda pair: pair[0])  # stable: each partition keeps its order
        return [entry for _, entry in out]

    def _streams(self) -> list[tuple[int, str]]:
        if self.layout is None:
            return [(0, self.where.stream)]
        return list(enumerate(self.layout.keys))

    def _look_for_layout(self) -> None:
        key = layout_key(self.where.stream)
        text = self._client(self.router.node_for(key)).get(key)
        if text is not None:
            self.layout, self.settled = parse_layout(text, key), True

    def _client(self, node: Node):
        client = self.clients.get(node)
        if client is None:
            import redis

            options = {}
            if not self.redis_retries:
                from redis.backoff import NoBackoff
                from redis.retry import Retry

                options["retry"] = Retry(NoBackoff(), 0)
            client = redis.Redis(host=node[0], port=node[1], socket_connect_timeout=1,
                                 socket_timeout=5 + (self.block_ms or 0) / 1000,
                                 **options)  # fmt: skip
            self.clients[node] = client
        return client

    def _cursor(self, k: int) -> str:
        return self.cursor if self.layout is None else self.cursors.get(k, "0")

    def _xread(self, k: int, key: str, block_ms: int | None) -> list:
        client = self._client(self.router.node_for(key))
        got = client.xread({key: self._cursor(k)}, count=self.count, block=block_ms)
        return got[0][1] if got else []

    def _sweep(self, streams: list[tuple[int, str]]) -> dict[int, list]:
        """One pipelined non-blocking XREAD per node of its streams' keys."""
        by_node: dict[Node, list[tuple[int, str]]] = {}
        for k, key in streams:
            by_node.setdefault(self.router.node_for(key), []).append((k, key))
        got: dict[int, list] = {}
        for node, mine in by_node.items():
            pipe = self._client(node).pipeline(transaction=False)
            for k, key in mine:
                pipe.xread({key: self._cursor(k)}, count=self.count)
            for (k, _), reply in zip(mine, pipe.execute(), strict=True):
                got[k] = reply[0][1] if reply else []
        return got

    def _take(self, k: int, raw: list) -> list[Entry]:
        entries: list[Entry] = []
        bound = self.until.get(k)
        for entry_id, fields in raw:
            entry_id = entry_id.decode()
            if bound is not None and entry_key(entry_id) > bound:
                self.done.add(k)
                break
            try:
                entries.append((entry_id, decode(fields)))
            except UpdateError as e:
                entries.append((entry_id, e))
        if bound is not None and (not raw or entries and entry_key(entries[-1][0]) == bound):
            self.done.add(k)  # read up to its bound (or it holds nothing more)
        return entries

    def _where_from(self) -> str:
        if self.layout is None:
            return f"entry {self.cursor}"
        moved = {k: c for k, c in self.places().items() if c != "0"}
        return f"{self.layout.partitions} partitions, " + (
            ", ".join(f"partition {k} after {c}" for k, c in moved.items()) or "each from its start"
        )

    def follow(self, stop: threading.Event) -> Iterator[list[Entry]]:
        """read() until `stop` is set, riding out a node that goes away or a slot that moves:
        every client closed, the route looked up afresh and the same cursors read again."""
        import redis

        delay = self.retry_s
        try:
            while not stop.is_set():
                try:
                    entries = self.read()
                except Exception as e:
                    if self.router.reroutes(e):
                        self.close()
                        self.router.invalidate()
                        if self.up is not False:
                            self.up = False
                            self.on_event("down", f"update log {self.where} unreachable "
                                          f"({describe(e)}); retrying from "
                                          f"{self._where_from()}")  # fmt: skip
                        stop.wait(delay)
                        delay = min(delay * 2, self.max_retry_s)
                        continue
                    if not isinstance(e, (redis.ResponseError, PartitionError)):
                        raise
                    self.on_event("error", f"update log {self.where}: {e}")
                    stop.wait(0.5)
                    continue
                delay = self.retry_s
                yield entries
        finally:
            self.close()

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.clients = {}
