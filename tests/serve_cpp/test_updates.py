"""rec-server applying the update log (#34) with the real parts: a 2-rank `rec train --publish`
into our own redis-server, `rec export` of its middle checkpoint, rec-server replaying the log
into the TBE's storage while it serves.

The reference is the same model.pt in this process with the same records written into its
storage by rec.update_log.write_rows; its rows are checked bit for bit against the quantized
rows of the last checkpoint, and rec-server's scores against its scores.
"""

from __future__ import annotations

import copy
import socket
import struct
import threading
import time

import numpy as np
import pytest
import redis
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from clients import infer_inputs
from server import Server

from rec import run_dir
from rec.broker import RedisBroker, redis_server_path
from rec.config import config_from_dict
from rec.contract import AOTI_TABLES_FILE, read_manifest
from rec.contract.repository import ModelDir
from rec.contract.requests import random_request
from rec.contract.updates import UpdateRecord, encode
from rec.export.dcp_reader import CheckpointReader
from rec.export.stream import checkpoint_key
from rec.model import build_model, table_keys
from rec.quantize import fused_rows
from rec.update_log import read_records, write_rows
from tests.helpers import TINY, rec_in_process, run_rec, write_config

pytestmark = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server is not installed (make setup installs it)"
)
STEPS, EXPORTED = 60, 30
DTYPES = {"t2": "fp16", "t3": "int4"}
# t0 is large enough that writing all of it takes a forward pass's time: a reader that were not
# held off would see it half written.
T0_ROWS = 20000


class Fresh:
    """One training run that published, its export at step EXPORTED, and the broker."""

    def __init__(self, tmp) -> None:
        self.broker = RedisBroker(tmp / "redis")
        self.url = self.broker.url("rec:updates")
        cfg = copy.deepcopy(TINY)
        cfg["tables"] = cfg["tables"][:4]
        cfg["tables"][0]["rows"] = T0_ROWS
        cfg["training"].update(steps=STEPS, eval_every=STEPS)
        cfg["checkpoint"] = {"every_steps": EXPORTED, "keep_last": 3}
        cfg["sharding"] = {"constraints": {"t1": {"sharding_types": ["row_wise"]}}}
        cfg["export"] = {"table_dtypes": DTYPES, "eval_batches": 2}
        cfg["publish"] = {"url": self.url, "every_steps": 3, "every_seconds": 0}
        self.cfg = cfg
        self.run = tmp / "run"
        run_rec("train", "--config", str(write_config(tmp / "c.yaml", cfg)), "--run-dir",
                str(self.run), timeout=600)  # fmt: skip
        self.repo = tmp / "repo"
        rec_in_process("export", str(self.run), "--checkpoint", run_dir.step_dir_name(EXPORTED),
                       "--repo", str(self.repo), check=True)  # fmt: skip
        self.manifest = read_manifest(ModelDir.of(self.repo, "rec").manifest)
        self.updates = self.manifest.data["updates"]
        self.records = [r for _, r in read_records(self.url)]

    def reference(self, records) -> torch.jit.ScriptModule:
        """model.pt with `records` (those after the export's step) written into its storage."""
        module = torch.jit.load(str(ModelDir.of(self.repo, "rec").model_file(1)))
        buffers = dict(module.named_buffers())
        for r in records:
            if r.count and r.step > EXPORTED:
                place = self.updates["tables"][r.table]
                write_rows(buffers[place["buffer"]], place, r.ids, r.rows)
        return module

    def request(self, seed: int = 3, batch: int = 64) -> dict[str, np.ndarray]:
        return random_request(4, 4, batch, seed=seed, ids_per_bag=(1, 6))


def reference_scores(module, request) -> np.ndarray:
    with torch.inference_mode():
        args = [torch.from_numpy(request[n]) for n in ("dense_features", "sparse_lengths",
                                                         "sparse_values")]  # fmt: skip
        return module(*args).numpy()


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    f = Fresh(tmp_path_factory.mktemp("fresh"))
    yield f
    f.broker.stop()


def http_infer(server, request):
    with httpclient.InferenceServerClient(server.http) as c:
        result = c.infer("rec", infer_inputs(httpclient, request))
        return result.as_numpy("scores"), result.get_response().get("parameters", {})


def grpc_infer(server, request):
    with grpcclient.InferenceServerClient(server.grpc) as c:
        result = c.infer("rec", infer_inputs(grpcclient, request))
        params = result.get_response().parameters
        return result.as_numpy("scores"), {k: v.int64_param for k, v in params.items()}


def test_the_replica_catches_up_to_the_last_step_with_the_rows_of_its_export(fresh):
    # The published rows of the steps after the export, written into model.pt's storage, are
    # bit for bit what a full export of the last step holds.
    reference = fresh.reference(fresh.records)
    cfg = config_from_dict(fresh.cfg)
    keys = table_keys(build_model(cfg, "meta"))
    last = CheckpointReader(run_dir.latest_checkpoint(fresh.run))
    storage = dict(reference.named_buffers())
    touched = 0
    for r in fresh.records:
        if not r.count or r.step <= EXPORTED:
            continue
        place = fresh.updates["tables"][r.table]
        rows = last.read_rows(checkpoint_key(keys[r.table]), 0, place["rows"])
        want = fused_rows(rows, DTYPES.get(r.table, "int8"))
        got = storage[place["buffer"]]
        width = want.shape[1]
        for row_id in r.ids:
            at = place["offset"] + row_id * place["row_stride"]
            stored = got[at : at + width]
            if place["scale_bias"] == "first":
                stored = torch.cat([stored[4:], stored[:4]])
            touched += 1
            assert torch.equal(stored, want[row_id]), (r.table, row_id)
    assert touched > 100

    server = Server(fresh.repo)  # the log's URL comes from rec.json
    try:
        assert server.wait_for_metric("rec_update_watermark_step", STEPS, timeout=60) == STEPS
        request = fresh.request()
        want = reference_scores(reference, request)
        exported = reference_scores(
            torch.jit.load(str(ModelDir.of(fresh.repo, "rec").model_file(1))), request
        )
        assert not np.array_equal(want, exported)  # the log changed what the request scores
        for infer in (http_infer, grpc_infer):
            scores, params = infer(server, request)
            np.testing.assert_array_equal(scores, want)
            assert params["embedding_watermark_step"] == STEPS
            assert params["embedding_watermark_gen"] == 1
            walls = [r.wall_ns for r in fresh.records if r.step == STEPS]
            assert params["embedding_watermark_wall_ns"] == min(walls)
        applied = sum(r.count for r in fresh.records if r.step > EXPORTED)
        assert server.metric("rec_update_rows_applied_total") == applied
        assert server.metric("rec_update_lag_ms_count") >= 2
    finally:
        assert server.stop() == 0, server.stderr()


def _rows(value: float, n: int) -> bytes:
    return fused_rows(torch.full((n, 8), value), "int8").numpy().tobytes()


def _record(fresh, step: int, rows: bytes, ids=None, **kw) -> dict:
    ids = tuple(range(T0_ROWS)) if ids is None else ids
    base = dict(run=fresh.updates["run"], gen=1, rank=0, world=1, step=step,
                wall_ns=time.time_ns(), last=True, table="t0", dtype="int8", dim=8, ids=ids,
                rows=rows)  # fmt: skip
    base.update(kw)
    return encode(UpdateRecord(**base))


def test_a_request_sees_a_row_wholly_old_or_wholly_new_under_concurrent_load(fresh):
    """A writer rewrites all of t0 back and forth between two values while four clients score
    a request whose bags hold many t0 rows: every score is one of the two states', never a mix."""
    stream = "torn"
    client = redis.Redis(port=fresh.broker.port)
    a, b = _rows(0.5, T0_ROWS), _rows(-0.25, T0_ROWS)
    reference = fresh.reference([])
    buffers = dict(reference.named_buffers())
    place = fresh.updates["tables"]["t0"]
    request = fresh.request(seed=11, batch=8)
    request["sparse_lengths"][:, 0] = 24  # 24 rows of t0 in every sample
    request["sparse_values"] = _rebuild_values(request, 0, T0_ROWS)
    states = {}
    for name, rows in (("a", a), ("b", b)):
        write_rows(buffers[place["buffer"]], place, tuple(range(T0_ROWS)), rows)
        states[name] = reference_scores(reference, request)
    assert not np.array_equal(states["a"], states["b"])
    server = Server(fresh.repo, "--updates", fresh.broker.url(stream), "--executor-threads", "2")
    try:
        stop = threading.Event()
        written = [0]

        def writer() -> None:
            step = EXPORTED + 1
            while not stop.is_set():
                client.xadd(stream, _record(fresh, step, a if step % 2 else b))
                step += 1
                written[0] += 1

        seen: list[str] = []
        bad: list[np.ndarray] = []

        def reader(i: int) -> None:
            infer = http_infer if i % 2 else grpc_infer
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                scores, _ = infer(server, request)
                match = [k for k, s in states.items() if np.array_equal(scores, s)]
                (seen.extend(match) if match else bad.append(scores))

        threads = [threading.Thread(target=writer)] + [
            threading.Thread(target=reader, args=(i,)) for i in range(4)
        ]
        threads[0].start()
        server.wait_for_metric("rec_update_rows_applied_total", T0_ROWS)  # t0 left the export's
        for t in threads[1:]:
            t.start()
        for t in threads[1:]:
            t.join()
        stop.set()
        threads[0].join()
        applied = server.metric("rec_update_records_total")
        assert not bad, f"{len(bad)} scores matched neither state (a torn row)"
        assert "a" in seen and "b" in seen, (seen[:5], written, applied)
        assert applied > 20
    finally:
        assert server.stop() == 0, server.stderr()
        client.delete(stream)
        client.close()


def _rebuild_values(request, feature: int, rows: int) -> np.ndarray:
    """sparse_values for `request`'s lengths: distinct spread ids for `feature`, small ids else."""
    rng = np.random.default_rng(5)
    out = []
    for lengths in request["sparse_lengths"]:
        for f, n in enumerate(lengths):
            pool = rows if f == feature else 50
            out.extend(rng.choice(pool, size=n, replace=False) if f == feature else
                       rng.integers(0, pool, size=n))  # fmt: skip
    return np.asarray(out, dtype=np.int64)


def test_bad_updates_are_refused_counted_and_never_applied(fresh):
    stream = "bad"
    client = redis.Redis(port=fresh.broker.port)
    ok = _record(fresh, EXPORTED + 1, _rows(0.5, T0_ROWS))
    bad = {
        "unknown_table": _record(fresh, EXPORTED + 2, _rows(0.5, 1), ids=(1,), table="t9"),
        "row_format": _record(
            fresh, EXPORTED + 2, _rows(0.5, 1)[:8] + b"\0\0", ids=(1,), dtype="fp16", dim=5
        ),  # fmt: skip
        "id_range": _record(fresh, EXPORTED + 2, _rows(0.5, 1), ids=(T0_ROWS,)),
        "other_run": _record(fresh, EXPORTED + 2, _rows(0.5, 1), ids=(1,), run="someone-else"),
        "backwards": _record(fresh, EXPORTED, _rows(0.5, 1), ids=(1,)),
    }
    malformed = dict(_record(fresh, EXPORTED + 3, _rows(0.5, 2), ids=(2, 3)))
    malformed["ids"] = struct.pack("<2q", 3, 2)  # not increasing
    huge = dict(_record(fresh, EXPORTED + 3, b"", ids=(), table="", dtype="fp32", dim=0))
    huge["count"] = str(1 << 61)  # 8 x count wraps to 0 in 64 bits: refused before any use
    for fields in (ok, *bad.values(), malformed, huge):
        client.xadd(stream, fields)
    reference = fresh.reference([])
    t0 = fresh.updates["tables"]["t0"]
    storage = dict(reference.named_buffers())[t0["buffer"]]
    write_rows(storage, t0, tuple(range(T0_ROWS)), _rows(0.5, T0_ROWS))
    server = Server(fresh.repo, "--updates", fresh.broker.url(stream))
    try:
        server.wait_for_metric("rec_update_records_total", len(bad) + 3)
        text = _metrics(server)
        for outcome in bad:
            assert f'outcome="{outcome}"}} 1' in text, outcome
        assert 'outcome="malformed"} 2' in text
        assert 'outcome="applied"} 1' in text
        request = fresh.request(seed=4)
        scores, params = http_infer(server, request)
        np.testing.assert_array_equal(scores, reference_scores(reference, request))
        assert params["embedding_watermark_step"] == EXPORTED + 1
        log = server.stderr()
        assert "refused update log entry" in log and "'t9' is not in the served model" in log
    finally:
        assert server.stop() == 0, server.stderr()
        client.delete(stream)
        client.close()


def _metrics(server) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://{server.metrics}/metrics", timeout=10) as r:
        return r.read().decode()


def test_a_restarted_replica_and_a_restarted_broker_lose_nothing(fresh):
    stream = "restarts"
    client = redis.Redis(port=fresh.broker.port)
    for r in fresh.records:  # the run's log, copied to a stream of this test's own
        client.xadd(stream, encode(r))
    url = fresh.broker.url(stream)
    first = Server(fresh.repo, "--updates", url)
    first.wait_for_metric("rec_update_rows_applied_total", 1)
    first.process.proc.kill()  # mid-stream, or just after: no clean shutdown either way
    first.process.proc.wait()
    first.process.stop()  # already dead: only removes its log folder
    second = Server(fresh.repo, "--updates", url)
    try:
        assert second.wait_for_metric("rec_update_watermark_step", STEPS) == STEPS
        request = fresh.request(seed=8)
        want = reference_scores(fresh.reference(fresh.records), request)
        np.testing.assert_array_equal(http_infer(second, request)[0], want)
        # The broker dies (SIGKILL) and comes back; the replica reconnects from its cursor and
        # takes what was published after, while what was published before is still there.
        client.close()
        fresh.broker.stop(kill=True)
        fresh.broker.start()
        client = redis.Redis(port=fresh.broker.port)
        assert client.xlen(stream) == len(fresh.records)
        run = fresh.updates["run"]
        for rank in (0, 1):
            client.xadd(stream, encode(UpdateRecord(run, 1, rank, 2, STEPS + 1, time.time_ns(),
                                                    True, "", "fp32", 0, (), b"")))  # fmt: skip
        assert second.wait_for_metric("rec_update_watermark_step", STEPS + 1) == STEPS + 1
        assert second.metric("rec_update_log_connected") == 1
        assert "unreachable" in second.stderr() or "reading update log" in second.stderr()
    finally:
        assert second.stop() == 0, second.stderr()
        client.delete(stream)
        client.close()


def _ready(server) -> tuple[int, int, bool]:
    """(server ready, model ready) over HTTP, and server ready over gRPC."""
    import urllib.error
    import urllib.request

    codes = []
    for route in ("/v2/health/ready", "/v2/models/rec/ready"):
        try:
            with urllib.request.urlopen(f"http://{server.http}{route}", timeout=10) as r:
                codes.append(r.status)
        except urllib.error.HTTPError as e:
            codes.append(e.code)
    with grpcclient.InferenceServerClient(server.grpc) as c:
        return codes[0], codes[1], c.is_server_ready()


def test_a_replica_behind_its_log_is_not_ready_until_it_catches_up(fresh, tmp_path):
    """--updates-max-behind-s 1 with the broker down: not ready once past the bound (it cannot
    know what it misses); the broker comes up with the log: it catches up and is ready."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"redis://127.0.0.1:{port}/rec:updates"
    server = Server(fresh.repo, "--updates", url, "--updates-max-behind-s", "1")
    broker = None
    try:
        deadline = time.monotonic() + 30
        while _ready(server) != (503, 503, False):
            assert time.monotonic() < deadline, _ready(server)
            time.sleep(0.1)
        assert server.metric("rec_update_behind_ms") > 1000
        broker = RedisBroker(tmp_path / "late", port=port)
        client = redis.Redis(port=port)
        for r in fresh.records:
            client.xadd("rec:updates", encode(r))
        client.close()
        while _ready(server) != (200, 200, True):
            assert time.monotonic() < deadline + 30, _ready(server)
            time.sleep(0.1)
        assert server.metric("rec_update_watermark_step") == STEPS
        log = server.stderr()
        assert "behind its update log (bound 1 s" in log and "caught up with its update log" in log
    finally:
        assert server.stop() == 0, server.stderr()
        if broker is not None:
            broker.stop()


def test_an_aoti_replica_applies_the_log_into_its_mapped_tables(fresh, tmp_path):
    """The same export step as an AOTInductor package: rec-server writes the log's rows into its
    private mapping of tables.bin (copy on write; the file stays as exported) and scores as the
    TorchScript replica does, to AOTInductor's tolerance."""
    from rec.export.verify import AOTI_TOLERANCE

    repo = tmp_path / "aoti"
    rec_in_process("export", str(fresh.run), "--checkpoint", run_dir.step_dir_name(EXPORTED),
                   "--repo", str(repo), "--format", "aoti", check=True)  # fmt: skip
    tables = next(repo.glob(f"*/1/{AOTI_TABLES_FILE}"))
    before = tables.read_bytes()
    model = tables.parent.parent.name
    aoti, torchscript = Server(repo), Server(fresh.repo)
    try:
        assert torchscript.wait_for_metric("rec_update_watermark_step", STEPS) == STEPS
        deadline = time.monotonic() + 60
        while aoti.metric("rec_update_watermark_step", model) < STEPS:
            assert time.monotonic() < deadline, aoti.stderr()
            time.sleep(0.05)
        request = fresh.request(seed=21)
        with httpclient.InferenceServerClient(aoti.http) as c:
            result = c.infer(model, infer_inputs(httpclient, request))
            got, params = result.as_numpy("scores"), result.get_response()["parameters"]
        want, _ = http_infer(torchscript, request)
        np.testing.assert_allclose(got, want, rtol=0, atol=AOTI_TOLERANCE)
        exported = reference_scores(fresh.reference([]), request)
        assert np.abs(got - exported).max() > 10 * AOTI_TOLERANCE  # the rows did change
        assert params["embedding_watermark_step"] == STEPS
        assert tables.read_bytes() == before
    finally:
        for server in (aoti, torchscript):
            assert server.stop() == 0, server.stderr()
