"""`rec train --publish URL`: every rank publishes the rows its steps changed to the update log.

TorchRec's ModelDeltaTracker records the ids each step looked up in this rank's shards (and so
changed: the fused optimizer updates exactly the rows a step looked up). Every
`publish.every_steps` steps or `publish.every_seconds` seconds the publisher takes those ids,
reads their rows from this rank's shards, quantizes them with rec.quantize (export's own
quantizer: a published row is bit for bit the row a full export of that step writes), and hands
the records (rec.contract.updates) to a sender thread, which XADDs them to the Redis stream.

Training never waits on the broker unless `publish.max_pending` publishes are already waiting
(the broker is down or slow): then it waits, since dropping a publish would lose rows. The
sender retries a broker that went away, and `close()` fails the run if what is pending cannot
be delivered within `publish.drain_timeout_s`.

A rank publishes only rows it owns whole: table_wise, row_wise and table_row_wise shards. With
publishing on, the planner is kept to those types (rec.train.sharding), so every table qualifies.

ZCH tables (rec.zch): every rank holds every id map, and an admission round changes the same
slots on all of them. Each rank publishes the changes of the slots whose rows it holds
(`publish_map`, right after the round reset those rows), a slot's new id in the same record as
its fresh row, so a replica never serves the new id with the old id's row or the reverse. Every
record of a ZCH table also says which raw id each of its rows' slots holds (format
rec.updates/3's `held`), so the embedding store, keyed by raw id, can place the rows. The
records go in the queue behind every publish before the round, and before any row trained
after it: the log holds a slot's rows in the order training wrote them.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torchrec.distributed.model_tracker.types import DeltaTrackerConfig, TrackingMode

from rec import run_dir
from rec.config import PublishConfig, RecConfig
from rec.contract.partitions import PartitionError, layout_key
from rec.contract.updates import UpdateRecord, encode, parse_url
from rec.logs.layout import LayoutError, connect, ensure_layout, read_layout
from rec.logs.route import RouteConfigError, RouteError, Router, describe
from rec.quantize import fused_rows
from rec.train.sharding import PUBLISHABLE_SHARDING_TYPES
from rec.train.zch import ZchTables
from rec.zch import Changes

RECORD_ROWS = 16384
"""Rows per record at most, so one stream entry stays a few MB."""
WAIT_TIMEOUT_MS = 1000
"""How long a sender waits for publish.wait_replicas replicas to hold a batch before it counts
the batch unreplicated and goes on: training must not stop for a replica that is away."""
LAG_SEAM = "REC_TEST_PUBLISH_LAG"
"""A test seam, not a setting: "RANK:SECONDS" makes rank RANK's sender wait SECONDS before it
sends each batch, so that rank's records reach the log behind the others' (a sender a round
behind: tests/train/test_publish_order.py)."""


class PublishError(RuntimeError):
    pass


def tracker_config() -> DeltaTrackerConfig:
    """Ids only (the rows are read at publish time), forgotten once read."""
    return DeltaTrackerConfig(tracking_mode=TrackingMode.ID_ONLY, delete_on_read=True)


@dataclass(frozen=True)
class Identity:
    """Who publishes: the run's id and this start's generation (run_dir.PUBLISH_FILE), and where:
    the update log's partition keys, fixed at the run's first start (() : the legacy layout,
    one stream)."""

    run: str
    gen: int
    keys: tuple[str, ...] = ()


def next_identity(run: Path, cfg: PublishConfig, world: int) -> Identity:
    """Rank 0, at every start of a run that publishes: the run's id (made once), the next
    generation and the log's partitions (chosen at the first start, then kept: a resume on
    another world writes where the first start did), saved before anything is published with
    them. Creates or checks the log's layout record (rec.logs.layout)."""
    path = run / run_dir.PUBLISH_FILE
    saved = json.loads(path.read_text()) if path.is_file() else {}
    url = parse_url(cfg.url)
    router = Router(url.nodes)
    # A run that published before partitions existed wrote one stream: it keeps doing so.
    partitions = saved.get("partitions", 0) if saved else None
    if partitions is not None and cfg.partitions and cfg.partitions != partitions:
        raise PublishError(f"publish.partitions={cfg.partitions}, but this run publishes to "
                           f"{partitions or 'one stream, no'} partitions since its first start "
                           f"({path}); a log's layout is fixed per run")  # fmt: skip
    import redis

    try:
        if partitions is None:
            router.refresh()
            partitions = cfg.partitions or (world if router.cluster else 0)
        keys = _layout_keys(router, url.stream, partitions)
    except (LayoutError, PartitionError, RouteConfigError, RouteError, redis.RedisError) as e:
        raise PublishError(f"publishing to {url}: {e}") from None
    ident = Identity(saved.get("run") or uuid.uuid4().hex, int(saved.get("gen", 0)) + 1, keys)
    record = {"run": ident.run, "gen": ident.gen, "partitions": partitions}
    run_dir.atomic_write(path, json.dumps(record) + "\n")
    return ident


def _layout_keys(router: Router, stream: str, partitions: int) -> tuple[str, ...]:
    """The partition keys the run writes (() : the one stream), its layout record created or
    checked; a legacy run refused where a layout record would hide its stream from readers."""
    if partitions:
        return ensure_layout(router, stream, partitions).keys
    if read_layout(router, stream) is not None:
        raise LayoutError(f"{layout_key(stream)} exists: the log's readers read its "
                          "partitions only, not the one stream this run writes")  # fmt: skip
    return ()


def last_gen(run: Path) -> int | None:
    """The generation that published last (run_dir.PUBLISH_FILE), None if none ever did."""
    path = run / run_dir.PUBLISH_FILE
    return int(json.loads(path.read_text())["gen"]) if path.is_file() else None


def log_holds(meta: dict) -> bool:
    """Whether the update log holds every row the checkpoint with this meta.json trained: it
    was written by a start that published (which closed any gap before training). Checkpoints
    older than the `published` key: those with a publishing generation."""
    return bool(meta.get("published", meta.get("publish_gen") is not None))


@dataclass
class _Shard:
    table: str
    dtype: str
    dim: int
    weight: torch.Tensor  # this rank's rows of the table: a view into the TBE's weights
    row_offset: int


def _local_shards(dmp, cfg: RecConfig) -> dict[str, _Shard]:
    """Tracker FQN -> this rank's whole-row shard of that table."""
    tracker = dmp.get_delta_tracker()
    state = dmp.state_dict()
    dims = {t.name: t.dim for t in cfg.tables}
    out = {}
    for table, fqn in tracker.table_to_fqn.items():
        weight = state.get(f"{fqn}.weight")
        if weight is None or not hasattr(weight, "local_shards"):
            raise PublishError(
                f"table {table!r}: no sharded weight at {fqn}.weight to publish from"
            )
        for shard in weight.local_shards():
            rows_at, cols_at = shard.metadata.shard_offsets
            if cols_at != 0 or shard.tensor.shape[1] != dims[table]:
                raise PublishError(
                    f"table {table!r} is split by columns on this rank; publishing needs whole "
                    f"rows ({', '.join(PUBLISHABLE_SHARDING_TYPES)})"
                )
            dtype = cfg.export.table_dtypes.get(table, cfg.export.quantize)
            out[fqn] = _Shard(table, dtype, dims[table], shard.tensor, int(rows_at))
    return out


class UpdatePublisher:
    """One rank's publisher. Call `after_step(step)` after every optimizer step and `close()` at
    the end (it publishes what is left and waits for the broker to take it)."""

    def __init__(self, cfg: RecConfig, dmp, rank: int, world: int, ident: Identity,
                 log=print, zch: ZchTables | None = None) -> None:  # fmt: skip
        self.cfg, self.rank, self.world, self.ident, self.log = cfg, rank, world, ident, log
        self.zch = zch  # the run's id maps: a resume restores the slots a dead run changed
        self.url = parse_url(cfg.publish.url)
        # Rank r writes one partition, so its records keep its order (a replica's rule).
        self.key = ident.keys[rank % len(ident.keys)] if ident.keys else self.url.stream
        self.router = Router(self.url.nodes)
        self.tracker = dmp.get_delta_tracker() or dmp.init_torchrec_delta_tracker(tracker_config())
        self.shards = _local_shards(dmp, cfg)
        self.pending: queue.Queue = queue.Queue(maxsize=cfg.publish.max_pending)
        self._last_slot = self._slot()  # publish.every_seconds' grid: time.time() // it
        self.steps_since = 0
        self.published_rows = 0
        self.publish_seconds = 0.0  # time the training loop spent publishing (the cost)
        self.error: BaseException | None = None
        self.unreplicated = 0  # batches no replica confirmed within WAIT_TIMEOUT_MS
        lag_rank, _, lag_s = os.environ.get(LAG_SEAM, "").partition(":")
        self._lag_s = float(lag_s) if lag_rank and int(lag_rank) == rank else 0.0
        self._sender = threading.Thread(target=self._send_loop, name="rec-publish", daemon=True)
        self._sender.start()

    # ---- the training side ------------------------------------------------------------------
    def after_step(self, step: int) -> None:
        self.steps_since += 1
        p = self.cfg.publish
        due_steps = p.every_steps and self.steps_since >= p.every_steps
        # On a grid of wall-clock time every rank shares, not from this rank's last publish:
        # ranks whose own clocks drifted a step apart published at different steps, and the
        # watermark (the slowest rank's) then waited a step longer at every publish.
        due_time = p.every_seconds and self._slot() > self._last_slot
        if due_steps or due_time:
            self.publish(step)

    def before_pause(self, step: int) -> None:
        """Before a pause (an evaluation, a checkpoint, the step profiler's window closing) and
        the end of training: what changed goes out now, not after the pause (rows trained just
        before a 7 s evaluation waited all of it)."""
        if self.steps_since:
            self.publish(step)

    def _slot(self) -> int:
        every = self.cfg.publish.every_seconds
        return int(time.time() // every) if every else 0

    def publish(self, step: int, changes: dict[str, Changes] | None = None) -> None:
        """Reads and queues the rows changed since the last publish, as of `step`; after a ZCH
        round (`changes`), with this rank's share of its id map changes (publish_map)."""
        if self.error is not None:
            raise PublishError(f"publishing to {self.url} failed: {self.error}") from self.error
        t0 = time.perf_counter()
        wall_ns = time.time_ns()
        records = []
        maps = _slot_changes(self.shards, changes or {})
        # No step since the last publish (a ZCH round's publish_map right after after_step's
        # publish): nothing to read, and TorchRec's tracker fails on a table with no lookup
        # since its last read (torch.cat of an empty list in _compute_unique_rows).
        changed = self.tracker.get_unique_ids() if self.steps_since else {}
        for fqn, ids in changed.items():
            shard = self.shards.get(fqn)
            if shard is None or ids.numel() == 0:
                continue
            local = torch.unique(ids.to(torch.int64))  # sorted
            if fqn in maps:  # a changed slot's row goes with its new id, below
                moved = torch.tensor(sorted(maps[fqn][0] | maps[fqn][1]), dtype=torch.int64)
                local = local[~torch.isin(local + shard.row_offset, moved)]
            rows = fused_rows(shard.weight.index_select(0, local), shard.dtype)
            global_ids = (local + shard.row_offset).tolist()
            for at in range(0, len(global_ids), RECORD_ROWS):
                chunk = global_ids[at : at + RECORD_ROWS]
                data = rows[at : at + RECORD_ROWS].numpy().tobytes()
                records.append(self._record(step, wall_ns, shard.table, shard.dtype, shard.dim,
                                            tuple(chunk), data))  # fmt: skip
            self.published_rows += len(global_ids)
        for fqn, (evicted, admitted) in maps.items():
            records += self._map_records(step, wall_ns, self.shards[fqn], evicted, admitted)
        if not records:  # nothing changed here: still advance this rank's watermark
            records.append(self._record(step, wall_ns, "", "fp32", 0, (), b""))
        records[-1] = _marked_last(records[-1])
        self.steps_since, self._last_slot = 0, self._slot()
        self.publish_seconds += time.perf_counter() - t0
        waited = time.perf_counter()
        self._put([encode(r) for r in records])  # waits only when max_pending are queued
        self.publish_seconds += time.perf_counter() - waited

    def publish_map(self, step: int, changes: dict[str, Changes]) -> None:
        """After the ZCH round at `step` (the admitted slots' rows reset): a publish at `step`
        of what changed since the last one, with this rank's share of the round's id map
        changes, each slot's new id in one record with its fresh row. Rows a changed slot had
        before the round are not sent: its row now is the fresh one, and the old id leaves in
        the same record. A complete publish (`last`), so a replica's watermark reaches `step`
        only with the round's changes applied, as an export of `step` holds them."""
        if any(changes.values()):
            self.publish(step, changes)

    def _map_records(self, step: int, wall_ns: int, shard: _Shard, evicted: dict[int, int],
                     admitted: dict[int, int]) -> list[UpdateRecord]:  # fmt: skip
        """Records of `shard`'s slot changes ({slot: raw id}), an admitted slot's current row
        with its id, at most RECORD_ROWS slots a record."""
        slots = sorted(set(evicted) | set(admitted))
        out = []
        for at in range(0, len(slots), RECORD_ROWS):
            chunk = slots[at : at + RECORD_ROWS]
            rowed = [s for s in chunk if s in admitted]
            data = b""
            if rowed:
                local = torch.tensor(rowed, dtype=torch.int64) - shard.row_offset
                data = fused_rows(shard.weight.index_select(0, local), shard.dtype)
                data = data.numpy().tobytes()
            rec = self._record(step, wall_ns, shard.table, shard.dtype, shard.dim, tuple(rowed),
                               data)  # fmt: skip
            out.append(replace(rec, evicted=tuple((s, evicted[s]) for s in chunk if s in evicted),
                               admitted=tuple((s, admitted[s]) for s in rowed)))  # fmt: skip
            self.published_rows += len(rowed)
        return out

    def republish_all(self, step: int) -> int:
        """After a resume from a checkpoint trained without publishing (a gap: the log lacks
        what those steps changed, yet a replica's watermark would pass them): every row of this
        rank's shards at its value now (the checkpoint's), as this generation's publish at
        `step`, before any training; returns the rows. Whole tables, not the rows changed since
        the last published step: finding those needs that step's checkpoint, which keep_last
        may have removed, and a replica may serve an export of any step in between. A ZCH
        table's records say which id each slot holds (`held`), which a replica checks against
        the map it serves: one serving an export of this checkpoint takes them (a run that
        published before is refused such a resume: rec.train.resume)."""
        wall_ns, rows_sent = time.time_ns(), 0
        batches = [[self._rows_record(step, wall_ns, shard, local)]
                   for shard in self.shards.values()
                   for local in torch.arange(shard.weight.shape[0]).split(RECORD_ROWS)]  # fmt: skip
        if not batches:
            batches = [[self._record(step, wall_ns, "", "fp32", 0, (), b"")]]
        batches[-1][-1] = _marked_last(batches[-1][-1])
        for batch in batches:  # one record a batch: max_pending bounds what is held
            rows_sent += sum(r.count for r in batch)
            self._put([encode(r) for r in batch])
        self.tracker.get_unique_ids()  # forget lookups made while restoring
        return rows_sent

    def _rows_record(self, step: int, wall_ns: int, shard: _Shard,
                     local: torch.Tensor) -> UpdateRecord:  # fmt: skip
        """One record of `shard`'s rows at local indices `local` (at most RECORD_ROWS)."""
        data = fused_rows(shard.weight.index_select(0, local), shard.dtype).numpy().tobytes()
        ids = tuple((local + shard.row_offset).tolist())
        return self._record(step, wall_ns, shard.table, shard.dtype, shard.dim, ids, data)

    def republish_undone(self, step: int) -> int:
        """After a resume from `step`: the rows earlier generations published at later steps
        (trained after the checkpoint, then lost with the killed run) hold values no checkpoint
        has. Publishes this rank's share of them at their values now (the checkpoint's), as this
        generation's publish at `step`, before any training; returns the rows."""
        from rec.served_map import replayed
        from rec.update_log import read_records

        touched: dict[str, set[int]] = {}
        dead: dict[str, list[UpdateRecord]] = {}
        for _, rec in read_records(str(self.url)):
            if rec.run == self.ident.run and rec.gen < self.ident.gen and rec.step > step:
                touched.setdefault(rec.table, set()).update(rec.ids)
                if rec.evicted or rec.admitted:
                    dead.setdefault(rec.table, []).append(rec)
        # The dead run's slots: the id a replica holds after its records, by the replicas' own
        # order rule (rec.served_map) from the checkpoint's map, which the log held in full when
        # the checkpoint committed. A slot vacated for an eviction its rank never sent is free.
        maps = self.zch.maps if self.zch is not None else {}
        served = {t: replayed(maps[t].keys, maps[t].used, maps[t].cfg.probes, recs)
                  for t, recs in dead.items() if t in maps}  # fmt: skip
        records, rows_sent, wall_ns = [], 0, time.time_ns()
        for shard in self.shards.values():
            restored = self._restore_map(shard, served.get(shard.table, {}), step, wall_ns)
            records += restored
            rows_sent += sum(r.count for r in restored)
            for rec in restored:  # their rows ride with their ids (a freed slot's below)
                touched[shard.table] -= set(rec.ids)
            ids = torch.tensor(sorted(touched.get(shard.table, ())), dtype=torch.int64)
            mine = ids[(ids >= shard.row_offset) & (ids < shard.row_offset + shard.weight.shape[0])]
            if mine.numel() == 0:
                continue
            rows = fused_rows(shard.weight.index_select(0, mine - shard.row_offset), shard.dtype)
            for at in range(0, mine.numel(), RECORD_ROWS):
                chunk = tuple(mine[at : at + RECORD_ROWS].tolist())
                data = rows[at : at + RECORD_ROWS].numpy().tobytes()
                records.append(self._record(step, wall_ns, shard.table, shard.dtype, shard.dim,
                                            chunk, data))  # fmt: skip
            rows_sent += mine.numel()
        if not records:
            records.append(self._record(step, wall_ns, "", "fp32", 0, (), b""))
        records[-1] = _marked_last(records[-1])
        self._put([encode(r) for r in records])
        self.tracker.get_unique_ids()  # forget lookups made while restoring
        return rows_sent

    def _restore_map(self, shard: _Shard, served: dict[int, int | None], step: int,
                     wall_ns: int) -> list[UpdateRecord]:  # fmt: skip
        """Records that set `shard`'s slots a dead generation changed (`served`: the id each
        holds in a replica that applied the whole log) back to the checkpoint's map."""
        if self.zch is None or shard.table not in self.zch.maps or not served:
            return []
        m, hi = self.zch.maps[shard.table], shard.row_offset + shard.weight.shape[0]
        evicted, admitted = {}, {}
        for slot, now in served.items():
            want = int(m.keys[slot]) if bool(m.used[slot]) else None
            if shard.row_offset <= slot < hi and now != want:
                if now is not None:
                    evicted[slot] = now
                if want is not None:
                    admitted[slot] = want
        return self._map_records(step, wall_ns, shard, evicted, admitted)

    def _record(self, step, wall_ns, table, dtype, dim, ids, rows) -> UpdateRecord:
        held = self._held(table, ids)
        return UpdateRecord(self.ident.run, self.ident.gen, self.rank, self.world, step, wall_ns,
                            False, table, dtype, dim, ids, rows, held=held)  # fmt: skip

    def _held(self, table: str, ids: tuple[int, ...]) -> tuple[tuple[int, int], ...] | None:
        """A ZCH table's rows: the raw id each slot of `ids` holds in the map now, which is the
        map after the record (a round's records are made after its changes, a resume's from the
        checkpoint's map they restore); slots holding none (the default row, a free slot) are
        left out. None for any other table (format version 1 or 2)."""
        if self.zch is None or table not in self.zch.maps:
            return None
        m = self.zch.maps[table]
        slots = torch.tensor(ids, dtype=torch.int64)
        slots = slots[slots < m.slots]  # the default row (slot == slots) holds no id
        slots = slots[m.used[slots]]
        return tuple(zip(slots.tolist(), m.keys[slots].tolist(), strict=True))

    def _check_sender(self) -> None:
        if self.error is not None:
            raise PublishError(f"publishing to {self.url} failed: {self.error}") from self.error
        if not self._sender.is_alive():
            raise PublishError(f"the sender of the update log at {self.url} stopped")

    def _put(self, batch, deadline: float | None = None) -> None:
        """Queues `batch`, waiting while max_pending are queued, failing if the sender died (it
        would never take it) or `deadline` (time.monotonic) passed."""
        while True:
            self._check_sender()
            try:
                self.pending.put(batch, timeout=0.5)
                return
            except queue.Full:
                if deadline is not None and time.monotonic() > deadline:
                    raise self._late() from None

    def _late(self) -> PublishError:
        return PublishError(
            f"the update log at {self.url} did not take {self.pending.qsize()} pending publishes "
            f"within publish.drain_timeout_s={self.cfg.publish.drain_timeout_s}; their rows are "
            "not in the log (a checkpoint is not written past them; the last one has them)"
        )

    def flush(self, step: int) -> None:
        """Publishes what changed up to `step` and waits until the broker has every record: a
        checkpoint is committed only once the log holds all it trained, so a resume from it never
        has rows to re-send that the log lacks."""
        deadline = time.monotonic() + self.cfg.publish.drain_timeout_s
        if self.steps_since:
            self.publish(step)
        while self.pending.unfinished_tasks:
            self._check_sender()
            if time.monotonic() > deadline:
                raise self._late()
            time.sleep(0.01)

    def close(self, step: int) -> None:
        """Publishes the rest (as of `step`) and waits until the broker has every record."""
        self.flush(step)
        self._put(None, deadline=time.monotonic() + self.cfg.publish.drain_timeout_s)
        self._sender.join(timeout=self.cfg.publish.drain_timeout_s)
        if self._sender.is_alive():
            raise self._late()
        if self.error is not None:
            raise PublishError(f"publishing to {self.url} failed: {self.error}") from self.error

    # ---- the sender thread ------------------------------------------------------------------
    def _send_loop(self) -> None:
        client, wait = None, 0
        down_since = None
        try:
            while (batch := self.pending.get()) is not None:
                time.sleep(self._lag_s)  # LAG_SEAM, in tests only
                while True:
                    try:
                        if client is None:
                            client = connect(self.router.node_for(self.key), 10.0)
                            wait = self._replicas_to_wait(client)
                        pipe = client.pipeline(transaction=False)
                        for fields in batch:
                            pipe.xadd(self.key, fields)
                        if wait:  # task_done below then means "replicated"
                            pipe.execute_command("WAIT", wait, WAIT_TIMEOUT_MS)
                        replies = pipe.execute()
                        if wait and int(replies[-1]) < wait:
                            self._unreplicated(int(replies[-1]), wait)
                        break
                    except Exception as e:
                        if not self.router.reroutes(e):
                            raise
                        # The broker is restarting or unreachable, or the partition's slot moved
                        # (MOVED, a failover): route afresh, keep the batch and retry. Records
                        # that landed before the error are sent again, right after themselves and
                        # before anything newer: a row is its whole value, not a delta, so
                        # applying it twice changes nothing.
                        client = _closed(client)
                        self.router.invalidate()
                        if down_since is None:
                            down_since = time.monotonic()
                            self.log(f"rank {self.rank}: update log {self.url} ({self.key}) "
                                     f"unreachable ({describe(e)}); retrying, training "
                                     "continues")  # fmt: skip
                        time.sleep(0.2)
                self.pending.task_done()  # the broker has every record of the batch
                if down_since is not None:
                    self.log(f"rank {self.rank}: update log {self.url} back after "
                             f"{time.monotonic() - down_since:.1f} s")  # fmt: skip
                    down_since = None
        except Exception as e:  # noqa: BLE001 - reported to the training loop
            self.error = e
        finally:
            _closed(client)

    def _replicas_to_wait(self, client) -> int:
        """publish.wait_replicas, its -1 resolved on the partition's master now."""
        want = self.cfg.publish.wait_replicas
        if want >= 0:
            return want
        return min(1, int(client.info("replication").get("connected_slaves", 0)))

    def _unreplicated(self, held: int, wait: int) -> None:
        self.unreplicated += 1
        if self.unreplicated == 1 or self.unreplicated % 100 == 0:  # a dead replica: not a flood
            self.log(f"rank {self.rank}: {self.unreplicated} batch(es) of {self.key} reached "
                     f"{held} of {wait} replicas within {WAIT_TIMEOUT_MS} ms (publish."
                     "wait_replicas); a failover of its master now could lose them")  # fmt: skip


def _closed(client) -> None:
    if client is not None:
        client.close()


def _slot_changes(shards: dict[str, _Shard],
                  changes: dict[str, Changes]) -> dict[str, tuple[dict, dict]]:  # fmt: skip
    """Per shard (tracker FQN) with slots a round changed: ({slot: evicted id}, {slot: admitted
    id}) of the slots whose rows it holds."""
    out = {}
    for fqn, shard in shards.items():
        change = changes.get(shard.table)
        if not change:
            continue
        lo, hi = shard.row_offset, shard.row_offset + shard.weight.shape[0]
        pairs = zip(change.evicted_slots, change.evicted_ids, strict=True)
        evicted = {s: i for s, i in pairs if lo <= s < hi}
        pairs = zip(change.admitted_slots, change.admitted_ids, strict=True)
        admitted = {s: i for s, i in pairs if lo <= s < hi}
        if evicted or admitted:
            out[fqn] = (evicted, admitted)
    return out


def _marked_last(rec: UpdateRecord) -> UpdateRecord:
    return replace(rec, last=True)
