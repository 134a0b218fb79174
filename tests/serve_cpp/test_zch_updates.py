"""rec-server applying a ZCH table's id map changes from the update log (format rec.updates/2,
docs/update_log.md) with the real parts: our own redis-server, a ZCH model exported by the real
`rec export` (TorchScript and AOTInductor), records written to the stream as a publisher writes
them. The reference is model.pt in this process with the same records written into it
(tests/zch_log.py); a real train -> publish -> serve run is in tests/export/test_zch_trained.py."""

from __future__ import annotations

import dataclasses
import time
import urllib.request

import numpy as np
import pytest
import redis
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from clients import infer_inputs
from server import Server

from rec.broker import redis_server_path
from rec.contract.updates import encode
from tests.helpers import scores_under_writes
from tests.zch_log import T0_SLOTS, ZchLog, admit, record, request, rows, scores

pytestmark = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server is not installed (make setup installs it)"
)


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    z = ZchLog(tmp_path_factory.mktemp("zch_log"), aoti=True)
    yield z
    z.stop()


def infer(server, req, model: str = "rec", grpc: bool = False) -> np.ndarray:
    if grpc:
        with grpcclient.InferenceServerClient(server.grpc) as c:
            return c.infer(model, infer_inputs(grpcclient, req)).as_numpy("scores")
    with httpclient.InferenceServerClient(server.http) as c:
        return c.infer(model, infer_inputs(httpclient, req)).as_numpy("scores")


def publish(log, stream: str, records) -> None:
    client = redis.Redis(port=log.broker.port)
    for r in records:
        client.xadd(stream, encode(r))
    client.close()


def metrics_text(server) -> str:
    with urllib.request.urlopen(f"http://{server.metrics}/metrics", timeout=10) as r:
        return r.read().decode()


def test_admissions_and_evictions_are_served_as_the_model_with_them_written(log):
    """Ids admitted with their rows, a slot changing hands, a lone eviction: rec-server
    (TorchScript and AOTInductor) scores as model.pt with the same records applied."""
    from rec.export.verify import AOTI_TOLERANCE

    x, y = log.x, log.y
    records = [
        admit(11, range(100), x[:100], np.linspace(-0.2, 0.2, 100)),
        admit(12, range(50), y[:50], 0.1, evict_ids=x[:50]),  # slots 0-49 change hands
        record(13, evicted=[(s, int(x[s])) for s in range(50, 60)]),  # x[50:60] leave
    ]
    stream = "applied"
    publish(log, stream, records)
    req = request([x[:8].tolist(), x[45:65].tolist(), y[:50].tolist(), x[90:100].tolist(),
                   [int(y[70])], [5, 6]])  # fmt: skip
    want = scores(log.reference(records), req)
    assert not np.allclose(want, scores(log.reference([]), req), atol=1e-4)
    assert not np.allclose(want, scores(log.reference(records[:2]), req), atol=1e-4)
    servers = {fmt: Server(repo, "--updates", log.url(stream)) for fmt, repo in log.repos.items()}
    try:
        ts, aoti = servers["torchscript"], servers["aoti"]
        assert ts.wait_for_metric("rec_update_watermark_step", 13) == 13
        np.testing.assert_array_equal(infer(ts, req), want)
        np.testing.assert_array_equal(infer(ts, req, grpc=True), want)
        model = next(iter(log.repos["aoti"].glob("*/1"))).parent.name
        deadline = time.monotonic() + 60
        while aoti.metric("rec_update_watermark_step", model) < 13:
            assert time.monotonic() < deadline, aoti.stderr()
            time.sleep(0.05)
        np.testing.assert_allclose(infer(aoti, req, model), want, rtol=0, atol=AOTI_TOLERANCE)
        assert ts.metric("rec_update_records_total", outcome="applied") == 3
        assert ts.metric("rec_update_rows_applied_total") == 150
    finally:
        for s in servers.values():
            assert s.stop() == 0, s.stderr()


def test_a_slot_is_never_served_with_its_new_id_and_old_row_under_concurrent_load(log):
    """A writer moves every slot of t0 back and forth between the X ids (rows 0.1) and the Y ids
    (rows -0.1), each record evicting the other set, while four clients score requests whose
    bags mix X and Y ids: every score is one of the two states', never a mix (a new id with the
    old row would read the other set's value)."""
    slots = range(T0_SLOTS)
    to_x = admit(0, slots, log.x, 0.1, evict_ids=log.y)
    to_y = admit(0, slots, log.y, -0.1, evict_ids=log.x)
    first = admit(11, slots, log.x, 0.1)
    rng = np.random.default_rng(3)
    pick = lambda ids: rng.choice(ids, 12, replace=False).tolist()  # noqa: E731
    req = request([pick(log.x) + pick(log.y) for _ in range(8)])
    states = {"x": scores(log.reference([first]), req),
              "y": scores(log.reference([first, to_y]), req)}  # fmt: skip
    assert not np.array_equal(states["x"], states["y"])
    stream = "torn"
    publish(log, stream, [first])
    server = Server(log.repos["torchscript"], "--updates", log.url(stream),
                    "--executor-threads", "2")  # fmt: skip
    client = redis.Redis(port=log.broker.port)
    try:
        server.wait_for_metric("rec_update_rows_applied_total", T0_SLOTS)
        written = [12]  # the next record's step
        encoded = {"x": encode(to_x), "y": encode(to_y)}

        def write() -> None:
            step = written[0]
            client.xadd(stream, dict(encoded["y" if step % 2 == 0 else "x"], step=str(step)))
            written[0] += 1

        seen, bad = scores_under_writes(
            write, lambda grpc: infer(server, req, grpc=grpc), states, readers=4
        )
        applied = server.metric("rec_update_records_total", outcome="applied")
        assert not bad, f"{len(bad)} scores matched neither state (a torn slot)"
        assert "x" in seen and "y" in seen, (seen[:5], written, applied)
        assert applied > 10
        assert server.metric("rec_update_records_total", outcome="map_mismatch") == 0
    finally:
        assert server.stop() == 0, server.stderr()
        client.delete(stream)
        client.close()


def test_bad_map_changes_are_refused_counted_and_change_nothing(log):
    """After one good record, each bad one (carrying a row of another slot too) is refused whole
    under its outcome; the scores stay the good record's."""
    x, y = log.x, log.y
    good = admit(11, range(0, 40, 4), x[0:40:4], 0.1)  # slots 0, 4, ..., 36; 1-3, 5-7... free
    other = rows(0.3, 1)  # a row of slot 200 that must not land either
    bad = {
        # slot T0_SLOTS is the default row, not a slot
        "slot_range": record(
            12, [200, T0_SLOTS], other + rows(0.2, 1), admitted=[(T0_SLOTS, int(y[5]))]
        ),  # fmt: skip
        # x[0] held since step 11, this record's own: two holders (a later one would vacate it)
        "id_held": record(11, [1, 200], rows(0.2, 1) + other, admitted=[(1, int(x[0]))]),
        "map_mismatch": record(12, [200], other, evicted=[(4, int(y[4]))]),
    }
    bad["slot_range_window"] = record(12, [9, 200], rows(0.2, 1) + other,
                                      admitted=[(9, int(x[100]))])  # fmt: skip
    bad["map_mismatch_held"] = record(12, [8, 200], rows(0.2, 1) + other,
                                      admitted=[(8, int(y[8]))])  # fmt: skip
    stream = "bad"
    publish(log, stream, [good, *bad.values()])
    req = request([x[0:40:4].tolist(), [int(x[100]), int(y[5]), int(y[8])], x[:12].tolist()])
    want = scores(log.reference([good]), req)
    server = Server(log.repos["torchscript"], "--updates", log.url(stream))
    try:
        server.wait_for_metric("rec_update_records_total", 1 + len(bad))
        counts = {o: server.metric("rec_update_records_total", outcome=o)
                  for o in ("applied", "slot_range", "id_held", "map_mismatch")}  # fmt: skip
        assert counts == {"applied": 1, "slot_range": 2, "id_held": 1, "map_mismatch": 2}
        np.testing.assert_array_equal(infer(server, req), want)
        assert server.metric("rec_update_watermark_step") == 11
        text = server.stderr()
        assert "is already held by slot 0 of 't0'" in text and "is not in id" in text
        assert 'outcome="map_mismatch"' in metrics_text(server)
    finally:
        assert server.stop() == 0, server.stderr()


def test_an_admission_ahead_of_the_eviction_it_follows_is_served_as_the_final_map(log):
    """Round 12: rank 0 evicts x[s] from slot s and gives it to y[s]; round 14: rank 1 admits
    x[s] into slot s + 1. Rank 0's sender a round behind, rank 1's record reaches the log first:
    rec-server refuses neither (rec.served_map's rule) and scores as model.pt with the records
    applied in training order, bit for bit."""
    x, y = log.x, log.y
    evens = list(range(0, 40, 2))
    first = admit(11, evens, x[evens], np.linspace(-0.3, 0.3, 20))
    rank0 = admit(12, evens, y[evens], 0.2, evict_ids=x[evens])
    rank1 = admit(14, [s + 1 for s in evens], x[evens], np.linspace(0.5, -0.5, 20))
    first, rank0, rank1 = (dataclasses.replace(r, rank=rank, world=2)
                           for r, rank in ((first, 0), (rank0, 0), (rank1, 1)))  # fmt: skip
    records = [first, rank0, rank1]
    req = request([x[evens].tolist(), y[evens].tolist(), x[evens[:5]].tolist() + [int(y[1])]])
    want = scores(log.reference(records), req)
    assert not np.allclose(want, scores(log.reference([first, rank0]), req), atol=1e-4)
    stream = "lagging"
    publish(log, stream, [first, rank1, rank0])
    server = Server(log.repos["torchscript"], "--updates", log.url(stream))
    try:
        server.wait_for_metric("rec_update_records_total", 3)
        assert server.metric("rec_update_records_total", outcome="applied") == 3, server.stderr()
        np.testing.assert_array_equal(infer(server, req), want)
    finally:
        assert server.stop() == 0, server.stderr()
