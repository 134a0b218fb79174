"""rec's Triton model applying a ZCH table's id map changes from the update log (format
rec.updates/2) with the real parts: tritonserver, our own redis-server, a ZCH model exported by
the real `rec export`. The reference is model.pt in this process with the same records written
into it (tests/zch_log.py); rec-server's twin is tests/serve_cpp/test_zch_updates.py.

One Triton for the module, reading one stream; each test publishes records of later steps and
waits until the watermark on /metrics reaches them."""

from __future__ import annotations

import time

import numpy as np
import pytest
import redis
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from rec.contract import DENSE, LENGTHS, VALUES
from rec.contract.updates import encode
from rec.serve.triton import start_triton
from tests.helpers import scores_under_writes
from tests.serve_triton.servers import TRITON_AND_REDIS
from tests.serve_triton.test_updates import metrics, wait_for_step
from tests.zch_log import T0_SLOTS, ZchLog, admit, record, request, rows, scores

pytestmark = TRITON_AND_REDIS
STREAM = "zch"


class Served:
    def __init__(self, tmp) -> None:
        self.log = ZchLog(tmp)
        self.client = redis.Redis(port=self.log.broker.port)
        self.applied = []  # the records Triton should have applied, in log order
        self.server = start_triton(self.log.repos["torchscript"], http_port=0, grpc_port=0,
                                   metrics_port=0, updates=self.log.url(STREAM))  # fmt: skip

    def publish(self, *records, applied: bool = True) -> None:
        for r in records:
            self.client.xadd(STREAM, encode(r))
            if applied:
                self.applied.append(r)

    def infer(self, req, grpc: bool = False) -> np.ndarray:
        module = grpcclient if grpc else httpclient
        inputs = []
        for name, datatype in ((DENSE, "FP32"), (LENGTHS, "INT32"), (VALUES, "INT64")):
            i = module.InferInput(name, list(req[name].shape), datatype)
            i.set_data_from_numpy(req[name])
            inputs.append(i)
        ends = self.server.endpoints
        with module.InferenceServerClient(ends.grpc if grpc else ends.http) as c:
            return c.infer("rec", inputs).as_numpy("scores")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    s = Served(tmp_path_factory.mktemp("zch_triton"))
    yield s
    code = s.server.stop()
    s.client.close()
    s.log.stop()
    assert code == 0, s.server.log_tail()


def test_triton_serves_admissions_and_evictions_as_the_model_with_them_written(served):
    x, y = served.log.x, served.log.y
    served.publish(
        admit(11, range(100), x[:100], np.linspace(-0.2, 0.2, 100)),
        admit(12, range(50), y[:50], 0.1, evict_ids=x[:50]),
        record(13, evicted=[(s, int(x[s])) for s in range(50, 60)]),
    )
    wait_for_step(served.server, 13)
    req = request([x[:8].tolist(), x[45:65].tolist(), y[:50].tolist(), [int(y[70])], [5, 6]])
    want = scores(served.log.reference(served.applied), req)
    assert not np.allclose(want, scores(served.log.reference([]), req), atol=1e-4)
    np.testing.assert_array_equal(served.infer(req), want)
    np.testing.assert_array_equal(served.infer(req, grpc=True), want)


def test_triton_refuses_bad_map_changes_counts_them_and_changes_nothing(served):
    x, y = served.log.x, served.log.y
    wait_for_step(served.server, 13)
    before = metrics(served.server)
    other = rows(0.3, 1)  # a row of slot 300 that must not land either
    served.publish(
        record(14, [300, T0_SLOTS], other + rows(0.2, 1), admitted=[(T0_SLOTS, int(y[5]))]),
        # y[48] admitted twice, into slots 50 and 51 (freed above, in its window)
        record(
            14, [50, 51, 300], rows(0.2, 2) + other, admitted=[(50, int(y[48])), (51, int(y[48]))]
        ),
        record(14, [300], other, evicted=[(70, int(y[70]))]),  # slot 70 is free
        applied=False,
    )
    served.publish(record(15))  # advances the watermark past the refused ones
    wait_for_step(served.server, 15)
    after = metrics(served.server)
    for outcome in ("slot_range", "id_held", "map_mismatch"):
        key = f"rec_update_records_total{{{outcome}}}"
        assert after.get(key, 0) - before.get(key, 0) == 1, (outcome, after)
    req = request([x[45:65].tolist(), [int(y[5]), int(y[48]), int(y[70])], y[:10].tolist()])
    np.testing.assert_array_equal(served.infer(req), scores(served.log.reference(served.applied),
                                                            req))  # fmt: skip


def test_triton_never_serves_a_new_id_with_its_old_row_under_concurrent_load(served):
    """As rec-server's test: every slot moves between the X ids and the Y ids, record after
    record, while clients score bags mixing both; every score is one state's."""
    log = served.log
    slots = range(T0_SLOTS)
    wait_for_step(served.server, 15)
    # From the state the earlier tests left: every slot to X.
    x_state = [(s, int(log.x[s])) for s in slots]
    first = record(16, list(slots), rows(0.1, T0_SLOTS), admitted=x_state,
                   evicted=_held(served.applied))  # fmt: skip
    to_y = admit(0, slots, log.y, -0.1, evict_ids=log.x)
    to_x = admit(0, slots, log.x, 0.1, evict_ids=log.y)
    rng = np.random.default_rng(3)
    pick = lambda ids: rng.choice(ids, 12, replace=False).tolist()  # noqa: E731
    req = request([pick(log.x) + pick(log.y) for _ in range(8)])
    base = [*served.applied, first]
    states = {"x": scores(log.reference(base), req),
              "y": scores(log.reference([*base, to_y]), req)}  # fmt: skip
    served.publish(first)
    wait_for_step(served.server, 16)
    steps = [17]  # the next record's step

    def write() -> None:
        step = steps[0]
        served.client.xadd(STREAM, dict(encode(to_y if step % 2 else to_x), step=str(step)))
        steps[0] += 1
        time.sleep(0.05)  # Triton applies a record in ~0.1 s: do not bury it

    seen, bad = scores_under_writes(
        write, lambda grpc: served.infer(req, grpc=grpc), states, readers=2
    )
    assert not bad, f"{len(bad)} scores matched neither state (a torn slot)"
    assert "x" in seen and "y" in seen, seen[:5]
    assert metrics(served.server).get("rec_update_records_total{map_mismatch}", 0) == 1


def _held(records) -> list[tuple[int, int]]:
    """(slot, id) of every slot that `records` leave holding an id."""
    held: dict[int, int] = {}
    for r in records:
        for s, _ in r.evicted:
            held.pop(s, None)
        held.update(dict(r.admitted))
    return sorted(held.items())
