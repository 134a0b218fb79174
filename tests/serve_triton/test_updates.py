"""rec's Triton model applying the update log (#34, docs/update_log.md) with the real parts: our
own redis-server (rec.broker.RedisBroker), a tiny model exported by the real `rec export` with
an `updates` section, and the real tritonserver (nvidia-pytriton) serving it through
serve/triton_python_model.py, which reads the stream while it serves.

The reference is the same model.pt loaded in this process with the records Triton should have
applied written into its storage by rec.update_log.write_rows: Triton's scores must equal its
scores exactly. One Triton for the module; each test publishes records of later steps and waits
until the watermark Triton reports on /metrics has reached them. Unlike rec-server's, Triton's
responses carry no watermark: its (2.51) Python backend cannot set response parameters.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import struct
import threading
import time
import urllib.request

import fbgemm_gpu  # noqa: F401  (registers the ops model.pt calls)
import numpy as np
import pytest
import redis
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import rec.ops  # noqa: F401  (registers torch.ops.rec.linear, which model.pt calls)
from rec import run_dir
from rec.broker import RedisBroker
from rec.contract import DENSE, LENGTHS, VALUES
from rec.contract.repository import ModelDir
from rec.contract.requests import random_request
from rec.contract.updates import UpdateRecord, encode
from rec.quantize import fused_rows
from rec.serve.repository import ServeError, load_model
from rec.serve.triton import UPDATES_PARAMETER, python_backend_config, start_triton
from rec.update_log import write_rows
from tests.serve_triton.servers import TRITON_AND_REDIS
from tests.serve_triton.tiny_repo import NUM_DENSE, NUM_SPARSE, TINY, write_seeded_run

pytestmark = TRITON_AND_REDIS
RUN, GEN, EXPORTED = "triton-run", 1, 10
# t0 (feature "user") is large enough that writing all of it takes about a forward pass's time:
# a pass that were not held off would see it half written.
T0_ROWS = 20000
ROWS = {"t0": T0_ROWS, "t1": 120, "t2": 50}  # TINY's tables, int8, dim 8
USER = 1  # the sparse feature of t0
WATERMARK = ("embedding_watermark_gen", "embedding_watermark_step", "embedding_watermark_wall_ns")


def _rows(table: str, n: int, seed: int) -> bytes:
    """n distinct int8 rows for `table`, as the publisher sends them (codes, scale, bias)."""
    g = torch.Generator().manual_seed(seed)
    return fused_rows(torch.randn((n, 8), generator=g), "int8").numpy().tobytes()


def _record(step: int, table: str = "", ids=(), rows: bytes = b"", **kw) -> UpdateRecord:
    base = dict(run=RUN, gen=GEN, rank=0, world=1, step=step, wall_ns=time.time_ns(),
                last=True, table=table, dtype="int8", dim=8 if table else 0, ids=tuple(ids),
                rows=rows)  # fmt: skip
    base.update(kw)
    return UpdateRecord(**base)


def _whole(table: str, step: int, seed: int) -> UpdateRecord:
    """Every row of `table` rewritten: any request's scores depend on them."""
    return _record(step, table, range(ROWS[table]), _rows(table, ROWS[table], seed))


class Fresh:
    """The broker, the tiny export (gen GEN, step EXPORTED, run RUN, publish.url the broker's
    stream), what has been published, and the records Triton should have applied."""

    def __init__(self, tmp) -> None:
        self.broker = RedisBroker(tmp / "redis")
        self.url = self.broker.url("rec:updates")
        cfg = copy.deepcopy(TINY)
        cfg["tables"][0]["rows"] = T0_ROWS
        assert {t["name"]: t["rows"] for t in cfg["tables"]} == ROWS
        cfg["publish"] = {"url": self.url}
        run = write_seeded_run(tmp / "run", cfg)
        # As a run that published: its id in publish.json, the generation in the step's meta.
        (run / run_dir.PUBLISH_FILE).write_text(json.dumps({"run": RUN}))
        run_dir.commit_checkpoint(run, EXPORTED, {"world_size": 1, "publish_gen": GEN})
        from rec.export.pipeline import export_run

        self.repo = tmp / "repo"
        export_run(run, self.repo, log=lambda _msg: None)
        self.model_pt = ModelDir.of(self.repo, "rec").model_file(1)
        self.updates = json.loads(ModelDir.of(self.repo, "rec").version_manifest(1).read_text())[
            "updates"
        ]
        self.client = redis.Redis(host=self.broker.host, port=self.broker.port)
        self.applied: list[UpdateRecord] = []

    def publish(self, *records, applied: bool = False) -> None:
        for r in records:
            self.client.xadd("rec:updates", encode(r) if isinstance(r, UpdateRecord) else r)
            if applied:
                self.applied.append(r)

    def reference(self) -> torch.jit.ScriptModule:
        """model.pt with the applied records' rows written into its storage, in log order."""
        module = torch.jit.load(str(self.model_pt))
        buffers = dict(module.named_buffers())
        for r in self.applied:
            if r.count:
                place = self.updates["tables"][r.table]
                write_rows(buffers[place["buffer"]], place, r.ids, r.rows)
        return module


def scores_of(module, request) -> np.ndarray:
    with torch.inference_mode():
        return module(*(torch.from_numpy(request[n]) for n in (DENSE, LENGTHS, VALUES))).numpy()


def _inputs(module, request) -> list:
    out = []
    for name, datatype in ((DENSE, "FP32"), (LENGTHS, "INT32"), (VALUES, "INT64")):
        i = module.InferInput(name, list(request[name].shape), datatype)
        i.set_data_from_numpy(request[name])
        out.append(i)
    return out


def http_infer(server, request) -> tuple[np.ndarray, dict]:
    with httpclient.InferenceServerClient(server.endpoints.http) as c:
        result = c.infer("rec", _inputs(httpclient, request))
        return result.as_numpy("scores"), result.get_response().get("parameters", {})


def grpc_infer(server, request) -> tuple[np.ndarray, dict]:
    with grpcclient.InferenceServerClient(server.endpoints.grpc) as c:
        result = c.infer("rec", _inputs(grpcclient, request))
        params = result.get_response().parameters
        return result.as_numpy("scores"), {k: v.int64_param for k, v in params.items()}


def metrics(server) -> dict[str, float]:
    """Triton's rec_update_* metrics of model rec: {"name" or "name{outcome}": value}."""
    with urllib.request.urlopen(f"http://{server.endpoints.metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for m in re.finditer(r"^(rec_update_\w+)\{([^}]*)\} (\S+)$", text, re.MULTILINE):
        outcome = re.search(r'outcome="(\w+)"', m[2])
        out[m[1] + (f"{{{outcome[1]}}}" if outcome else "")] = float(m[3])
    return out


def wait_for_step(server, step: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while metrics(server).get("rec_update_watermark_step", -1) < step:
        assert time.monotonic() < deadline, (metrics(server), server.log_tail())
        time.sleep(0.05)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    f = Fresh(tmp_path_factory.mktemp("fresh"))
    # Before Triton starts: records the export holds (skipped; they would change t0 and t1) and
    # one after it. Triton replays the stream from its start.
    f.publish(_whole("t0", 8, seed=1), _whole("t1", EXPORTED, seed=2))
    f.publish(_whole("t0", EXPORTED + 1, seed=3), applied=True)
    f.server = start_triton(f.repo, http_port=0, grpc_port=0, metrics_port=0)
    yield f
    code = f.server.stop()  # model.py's finalize() stops the reader: a clean exit
    f.client.close()
    f.broker.stop()
    assert code == 0, f.server.log_tail()


def test_the_export_carries_where_the_log_is_and_what_it_holds(fresh):
    assert fresh.updates["url"] == fresh.url
    assert (fresh.updates["run"], fresh.updates["gen"], fresh.updates["step"]) == (
        RUN, GEN, EXPORTED)  # fmt: skip
    assert {fresh.updates["tables"][t]["scale_bias"] for t in ROWS} == {"first"}


def test_start_triton_stages_an_updates_override_and_refuses_a_bad_one(fresh):
    """rec-server's `--updates URL|none` is start_triton(updates=...): the staged config's
    `updates_url` parameter, which model.py takes over rec.json's url; None leaves rec.json's."""
    served = load_model(fresh.repo)
    assert UPDATES_PARAMETER not in python_backend_config(served).parameters
    for url in ("none", "redis://10.0.0.5:6379/other"):
        assert python_backend_config(served, updates=url).parameters[UPDATES_PARAMETER] \
            .string_value == url  # fmt: skip
    with pytest.raises(ServeError, match="looks like a Redis database number"):
        start_triton(fresh.repo, http_port=0, grpc_port=0, metrics_port=0,
                     updates="redis://127.0.0.1:6379/0")  # fmt: skip


def test_triton_replays_the_log_and_scores_as_the_rows_written_in_python(fresh):
    """Records published while Triton serves are applied, and its scores equal model.pt's with
    the same rows written by write_rows; records refused (unknown table, other run, wrong row
    format, an id outside the table, backwards, malformed) leave every score as it was."""
    server = fresh.server
    wait_for_step(server, EXPORTED + 1)
    request = random_request(NUM_DENSE, NUM_SPARSE, 32, seed=3, ids_per_bag=(1, 5))
    exported = scores_of(torch.jit.load(str(fresh.model_pt)), request)
    want = scores_of(fresh.reference(), request)
    assert not np.array_equal(want, exported)  # the log changed what the request scores
    for infer in (http_infer, grpc_infer):
        scores, params = infer(server, request)
        np.testing.assert_array_equal(scores, want)
        # pb_utils.InferenceResponse of Triton 2.51 takes no parameters (triton_python_model.py)
        assert not set(WATERMARK) & set(params), params
    seen = metrics(server)
    assert seen["rec_update_watermark_step"] == EXPORTED + 1
    assert seen["rec_update_watermark_wall_ms"] == fresh.applied[-1].wall_ns // 1_000_000
    assert seen["rec_update_records_total{skipped}"] == 2
    assert seen["rec_update_records_total{applied}"] == 1
    assert seen["rec_update_rows_applied_total"] == ROWS["t0"]
    assert seen["rec_update_log_connected"] == 1

    # While serving: t1 rewritten, then refused records that would each change rows, then an
    # empty record that moves the watermark past them.
    step = EXPORTED + 2
    fresh.publish(_whole("t1", step, seed=4), applied=True)
    other_run = _whole("t0", step + 1, seed=5)
    malformed = encode(_record(step + 1, "t2", (2, 3), _rows("t2", 2, seed=6)))
    malformed["ids"] = struct.pack("<2q", 3, 2)  # not increasing
    refused = {
        "unknown_table": _record(step + 1, "t9", (1,), _rows("t9", 1, seed=7)),
        "other_run": dataclasses.replace(other_run, run="someone-else"),
        "row_format": _record(step + 1, "t2", (1,), bytes(16), dtype="fp16"),
        "id_range": _record(step + 1, "t2", range(ROWS["t2"] + 1), _rows("t2", 51, seed=8)),
        "backwards": _whole("t2", EXPORTED + 1, seed=9),
        "malformed": malformed,
    }
    fresh.publish(*refused.values())
    fresh.publish(_record(step + 1), applied=True)
    wait_for_step(server, step + 1)
    want = scores_of(fresh.reference(), request)
    np.testing.assert_array_equal(http_infer(server, request)[0], want)
    seen = metrics(server)
    assert seen["rec_update_watermark_step"] == step + 1
    for outcome in refused:
        assert seen[f"rec_update_records_total{{{outcome}}}"] == 1, (outcome, seen)
    assert seen["rec_update_rows_applied_total"] == ROWS["t0"] + ROWS["t1"]
    log = server.log_path.read_text(errors="replace")
    assert "refused update log entry" in log and "'t9' is not in the served model" in log


def test_triton_reconnects_to_a_restarted_broker_from_its_cursor(fresh):
    """The broker is killed and comes back on its append-only file: the reader reconnects and
    takes what is published after, from the entry it had reached (nothing applied twice)."""
    server = fresh.server
    last = max(r.step for r in fresh.applied)
    wait_for_step(server, last)
    before = metrics(server)["rec_update_records_total{applied}"]
    fresh.client.close()
    fresh.broker.stop(kill=True)
    fresh.broker.start()
    fresh.client = redis.Redis(host=fresh.broker.host, port=fresh.broker.port)
    fresh.publish(_whole("t2", last + 1, seed=10), applied=True)
    wait_for_step(server, last + 1)
    request = random_request(NUM_DENSE, NUM_SPARSE, 16, seed=12, ids_per_bag=(1, 5))
    scores, _ = grpc_infer(server, request)
    np.testing.assert_array_equal(scores, scores_of(fresh.reference(), request))
    seen = metrics(server)
    assert seen["rec_update_records_total{applied}"] == before + 1
    assert seen["rec_update_log_connected"] == 1
    log = server.log_path.read_text(errors="replace")
    assert re.search(r"reading update log \S+ from entry [1-9]", log), log[-3000:]


def test_a_request_sees_a_row_wholly_old_or_wholly_new_under_concurrent_load(fresh):
    """A writer rewrites all of t0 back and forth between two states while two clients score a
    request whose bags hold many t0 rows: every score is one of the two states', never a mix
    (the model's lock keeps a record's write and a forward pass apart)."""
    server = fresh.server
    step = max(r.step for r in fresh.applied) + 1
    wait_for_step(server, step - 1)
    states = {"a": _whole("t0", step, seed=20), "b": _whole("t0", step, seed=21)}
    request = random_request(NUM_DENSE, NUM_SPARSE, 8, seed=13, ids_per_bag=(1, 4))
    request[LENGTHS][:, USER] = 24  # 24 distinct t0 rows in every sample, the rest small ids
    rng = np.random.default_rng(5)
    values = [rng.choice(T0_ROWS, size=n, replace=False) if f == USER else
              rng.integers(0, 50, size=n)
              for lengths in request[LENGTHS] for f, n in enumerate(lengths)]  # fmt: skip
    request[VALUES] = np.concatenate(values).astype(np.int64)
    want = {}
    for name, r in states.items():
        fresh.applied.append(r)
        want[name] = scores_of(fresh.reference(), request)
        fresh.applied.pop()
    assert not np.array_equal(want["a"], want["b"])

    stop, written = threading.Event(), []

    def writer() -> None:
        client = redis.Redis(host=fresh.broker.host, port=fresh.broker.port)
        while not stop.is_set():
            n = step + len(written)
            r = dataclasses.replace(states["ab"[n % 2]], step=n, wall_ns=time.time_ns())
            client.xadd("rec:updates", encode(r))
            written.append(r)
            time.sleep(0.01)  # the broker, Triton and the clients share 2 cores
        client.close()

    seen, bad = [], []

    def reader(i: int) -> None:
        infer = (http_infer, grpc_infer)[i % 2]
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            scores, _ = infer(server, request)
            match = [k for k, w in want.items() if np.array_equal(scores, w)]
            (seen.extend(match) if match else bad.append(scores))

    threads = [threading.Thread(target=writer)]
    threads[0].start()
    wait_for_step(server, step)  # t0 has left its earlier state
    threads += [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for t in threads[1:]:
        t.start()
    for t in threads[1:]:
        t.join()
    stop.set()
    threads[0].join()
    fresh.applied.append(written[-1])
    wait_for_step(server, written[-1].step)
    assert not bad, f"{len(bad)} of {len(bad) + len(seen)} scores matched neither state (torn)"
    assert "a" in seen and "b" in seen, (len(seen), len(written))
    assert len(written) > 20
    np.testing.assert_array_equal(http_infer(server, request)[0], scores_of(fresh.reference(),
                                                                             request))  # fmt: skip
