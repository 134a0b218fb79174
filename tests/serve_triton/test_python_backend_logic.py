"""rec's Triton model without Triton: rec.serve.python_backend, which serve/triton_python_model.py
(the staged model.py) only adapts to pb_utils, run in this process on the real parts: a tiny
model exported by the real `rec export`, its staged config as Triton hands it to model.py, and
for the update log our own redis-server (rec.broker.RedisBroker).

The references are the same model.pt's own forward in this process, and rec-server's messages
(cpp/src/model/request.cpp) for the requests it refuses. Through a real tritonserver the same
paths are tested by test_triton.py and test_updates.py.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from pathlib import Path

import fbgemm_gpu  # noqa: F401  (registers the ops model.pt calls)
import numpy as np
import pytest
import redis
import torch
from google.protobuf import json_format

import rec.ops  # noqa: F401  (registers torch.ops.rec.linear, which model.pt calls)
from rec import run_dir
from rec.broker import RedisBroker, redis_server_path
from rec.contract import DENSE, LENGTHS, NUMPY_DTYPES, VALUES, parse_manifest
from rec.contract.context import offsets
from rec.contract.repository import ModelDir
from rec.contract.requests import random_request
from rec.contract.updates import UpdateRecord, encode
from rec.features import FeatureSpec
from rec.quantize import fused_rows
from rec.serve.python_backend.config import InstanceConfig, LoadError
from rec.serve.python_backend.context_inputs import ContextModel
from rec.serve.python_backend.inputs import (
    INTERNAL,
    INVALID_ARG,
    UNAVAILABLE,
    Failure,
    Inputs,
    concatenate,
)
from rec.serve.python_backend.instance import ModelInstance
from rec.serve.python_backend.metrics import MemoryMetrics
from rec.serve.repository import load_model
from rec.serve.triton import python_backend_config
from rec.update_log import write_rows
from tests.serve_triton.servers import tiny_repository
from tests.serve_triton.tiny_repo import (
    MAX_BATCH_SIZE,
    NUM_DENSE,
    NUM_SPARSE,
    TINY,
    write_seeded_run,
)


def staged_config(repo, **options) -> InstanceConfig:
    """The InstanceConfig model.py makes of the config rec.serve.triton stages for `repo`, via
    the JSON Triton gives model.py (args["model_config"])."""
    config = python_backend_config(load_model(repo), **options)
    as_triton = json_format.MessageToDict(config, preserving_proto_field_name=True)
    return InstanceConfig.from_triton(json.loads(json.dumps(as_triton)), "rec", "1")


class Served:
    """One ModelInstance of the tiny repository, its metrics and what it logged."""

    def __init__(self, config: InstanceConfig) -> None:
        self.metrics, self.said = MemoryMetrics(), []
        self.instance = ModelInstance(config, self.metrics, lambda *m: self.said.append(m))
        self.model = torch.jit.load(config.model_path)


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory):
    return tiny_repository(tmp_path_factory)


@pytest.fixture(scope="module")
def served(tiny_repo):
    s = Served(staged_config(tiny_repo, intra_op_threads=0))
    yield s
    s.instance.close()


def inputs(request: dict) -> Inputs:
    return Inputs.flat(request[DENSE], request[LENGTHS], request[VALUES])


def forward(model, request: dict) -> np.ndarray:
    with torch.inference_mode():
        return model(*(torch.from_numpy(request[n]) for n in (DENSE, LENGTHS, VALUES))).numpy()


def test_the_staged_config_reads_back(tiny_repo):
    config = staged_config(tiny_repo, updates="none", store_cache_bytes=0)
    served = load_model(tiny_repo)
    assert config.model_path == str(served.model_path.resolve())
    assert (config.name, config.version, config.max_rows) == ("rec", "1", MAX_BATCH_SIZE)
    assert (config.updates_url, config.store_cache_bytes, config.intra_op_threads) == (
        "none", 0, 1)  # fmt: skip
    assert config.feature_spec == served.feature_spec and not config.allow_batch_variant


def test_a_batch_of_requests_scores_as_the_models_own_forward(served):
    """Requests of several sizes, run as one concatenated batch, each get the scores model.pt
    gives it alone, bit for bit (the export's batch probe passed on this CPU at load)."""
    requests = [random_request(NUM_DENSE, NUM_SPARSE, b, seed=b) for b in (1, 7, 64, 3)]
    got = served.instance.execute([inputs(r) for r in requests])
    for request, scores in zip(requests, got, strict=True):
        want = forward(served.model, request)
        assert scores.dtype == np.float32 and scores.shape == want.shape
        assert np.array_equal(scores, want)
    assert served.metrics.value("rec_model_batch_variant", model="rec", version="1") == 0
    # Ragged ids as batching clients send them, [1, N], are the same request.
    one = requests[1]
    flat = served.instance.execute([Inputs.flat(one[DENSE], one[LENGTHS], one[VALUES][None, :])])
    assert np.array_equal(flat[0], got[1])


def bad_requests() -> dict[str, tuple[Inputs, str]]:
    """Each request the logic refuses, with rec-server's message for it."""
    ok = random_request(NUM_DENSE, NUM_SPARSE, 4, seed=2, ids_per_bag=(1, 3))
    dense, lengths, values = ok[DENSE], ok[LENGTHS], ok[VALUES]
    total = int(lengths.sum())
    nan, inf, negative = dense.copy(), dense.copy(), lengths.copy()
    nan[1, 2], inf[3, 0], negative[2, 1] = np.nan, -np.inf, -1
    big = random_request(NUM_DENSE, NUM_SPARSE, MAX_BATCH_SIZE + 1, seed=3)
    return {
        "neither": (Inputs.flat(dense, lengths), "a request carries either 'sparse_values' (INT64 "
                    "ids) or 'sparse_strings' (BYTES tokens); this one has neither"),
        "both": (Inputs.flat(dense, lengths, values, np.array([b"1"] * total, dtype=object)),
                 "this one has both"),
        "empty": (Inputs.flat(dense[:0], lengths[:0], values[:0]),
                  f"input 'dense_features': expected shape [B,{NUM_DENSE}] with B >= 1, got "
                  f"[0,{NUM_DENSE}]"),
        "too_many": (inputs(big), f"input 'dense_features': batch size {MAX_BATCH_SIZE + 1} "
                                  f"exceeds max_batch_size {MAX_BATCH_SIZE}"),
        "uneven": (Inputs.flat(dense[:3], lengths, values), "input 'sparse_lengths': batch size 4 "
                                                       "differs from other inputs' 3"),
        "nan": (Inputs.flat(nan, lengths, values), "input 'dense_features': value nan at [1, 2]: "
                                              "every value must be a finite number"),
        "-inf": (Inputs.flat(inf, lengths, values), "input 'dense_features': value -inf at [3, 0]"),
        "negative": (Inputs.flat(dense, negative, values),
                     f"input 'sparse_lengths': negative length -1 at flat index "
                     f"{2 * NUM_SPARSE + 1}"),
        "short": (Inputs.flat(dense, lengths, values[:-1]),
                  f"input 'sparse_values': has {total - 1} values but sum of 'sparse_lengths' "
                  f"is {total}"),
        "short_strings": (Inputs.flat(dense, lengths, strings=np.array([b"7"] * (total + 1),
                                                                       object)),
                          f"input 'sparse_strings': has {total + 1} values but sum of "
                          f"'sparse_lengths' is {total}"),
    }  # fmt: skip


def test_bad_requests_are_refused_each_with_its_message_and_the_rest_served(served):
    cases = bad_requests()
    good = random_request(NUM_DENSE, NUM_SPARSE, 5, seed=9)
    got = served.instance.execute([inputs(good), *(i for i, _ in cases.values())])
    assert np.array_equal(got[0], forward(served.model, good))  # its neighbours' errors are theirs
    for (case, (_, message)), result in zip(cases.items(), got[1:], strict=True):
        assert isinstance(result, Failure) and result.code == INVALID_ARG, (case, result)
        assert message in result.message, (case, result.message)


# ---- tests/data/request_golden.json: a context model's requests, decoded as rec-server does --
GOLDEN = json.loads((Path(__file__).parents[1] / "data" / "request_golden.json").read_text())


def golden_arrays(tensors: dict) -> dict[str, np.ndarray]:
    """KServe JSON tensors as model.py gets them from Triton (BYTES: an object array of bytes)."""
    out = {}
    for name, t in tensors.items():
        data = t["data"]
        if t["datatype"] == "BYTES":
            data = [d.encode() for d in data]
        out[name] = np.asarray(data, dtype=NUMPY_DTYPES[t["datatype"]]).reshape(t["shape"])
    return out


def golden_model() -> ContextModel:
    m = parse_manifest(GOLDEN["manifest"])
    spec = FeatureSpec.from_dict(m.feature_spec)
    return ContextModel(m.context, m.serving_max_batch_size, spec)


@pytest.mark.parametrize("case", GOLDEN["valid"], ids=lambda c: c["name"])
def test_golden_requests_give_the_golden_model_inputs(case):
    """Either form, ids or each side's strings: the model's inputs in forward order, strings
    encoded with their side's features, candidate_offsets filled, as the golden file holds."""
    heard = []
    feed = golden_model().decode(Inputs(golden_arrays(case["inputs"])),
                                 lambda lengths, tokens, spec: heard.append(spec))  # fmt: skip
    assert not isinstance(feed, Failure), feed
    want = golden_arrays(case["model_inputs"])
    assert list(feed.tensors) == list(want) and feed.rows == case["candidates"]
    for name, a in want.items():
        got = feed.tensors[name]
        assert got.dtype == a.dtype and np.array_equal(got, a), (name, got, a)
    strings = [n for n in case["inputs"] if n.endswith("_strings")]
    # A side's tokens are heard with that side's features (the negative-id counts by name).
    sides = {"context_strings": ["user", "history"], "candidate_strings": ["item", "tags"],
             "sparse_strings": ["user", "item", "history", "tags"]}  # fmt: skip
    assert [[f.name for f in spec.sparse] for spec in heard] == [sides[n] for n in strings]


@pytest.mark.parametrize("case", GOLDEN["refused"], ids=lambda c: c["name"])
def test_golden_refusals_have_rec_servers_text(case):
    failure = golden_model().decode(Inputs(golden_arrays(case["inputs"])))
    assert isinstance(failure, Failure) and failure.code == INVALID_ARG
    assert failure.message == case["error"]


def test_context_requests_the_shared_checks_cannot_see_are_refused_as_rec_server_does():
    """What rec-server's ValidateContextRequest refuses past request_form, in its words."""
    case = golden_arrays(GOLDEN["valid"][0]["inputs"])
    nan = case["candidate_dense"].copy()
    nan[2, 0] = np.nan
    negative = case["context_lengths"].copy()
    negative[0, 1] = -1
    strings = np.array([b"1", b"2", b"3"], dtype=object)
    bad = {
        "input 'candidate_dense': missing": {"candidate_dense": None},
        "a request carries either 'candidate_values' (INT64 ids) or 'candidate_strings' (BYTES "
        "tokens); this one has neither": {"candidate_values": None},
        "input 'candidate_dense': value nan at [2, 0]: every value must be a finite number":
            {"candidate_dense": nan},
        "input 'candidate_dense': 2 candidates, other inputs have 3":
            {"candidate_dense": case["candidate_dense"][:2]},
        "input 'context_lengths': expected shape [1, 2], got [1, 3]":
            {"context_lengths": np.ones((1, 3), np.int32)},
        "input 'context_lengths': negative length -1 at flat index 1":
            {"context_lengths": negative},
        "input 'candidate_values': has 5 values but sum of 'candidate_lengths' is 6":
            {"candidate_values": case["candidate_values"][:5]},
        "input 'context_strings': has 3 values but sum of 'context_lengths' is 2":
            {"context_values": None, "context_strings": strings,
             "context_lengths": np.array([[1, 1]], np.int32)},
        "a request carries either 'context_values' (INT64 ids) or 'context_strings' (BYTES "
        "tokens); this one has both": {"context_strings": strings},
        "input 'candidate_strings': sample 0, feature 'item', value at flat index 0: 'zz' is "
        "not hex": {"candidate_values": None,
                    "candidate_strings": np.array([b"zz"] + [b"1"] * 5, dtype=object)},
        "input 'sparse_strings_': unexpected input name": {"sparse_strings_": strings},
    }  # fmt: skip
    model = golden_model()
    for message, change in bad.items():
        tensors = {k: v for k, v in {**case, **change}.items() if v is not None}
        failure = model.decode(Inputs(tensors))
        assert isinstance(failure, Failure) and message in failure.message, (message, failure)
    # Ids as batching clients send them, [1, n], are the same request.
    ragged = {**case, "candidate_values": case["candidate_values"][None, :]}
    assert np.array_equal(model.decode(Inputs(ragged)).tensors["candidate_values"],
                          case["candidate_values"])  # fmt: skip


def test_requests_join_with_their_candidate_offsets_continued():
    feeds = [golden_model().decode(Inputs(golden_arrays(c["inputs"]))) for c in GOLDEN["valid"]]
    joined = concatenate(feeds)
    counts = []
    for c in GOLDEN["valid"]:
        counts += [c["candidates"]] if c["form"] == "context" else [1] * c["candidates"]
    assert joined["candidate_offsets"].tolist() == offsets(counts, 2).tolist()
    assert joined["candidate_offsets"].dtype == np.int32
    assert len(joined["context_dense"]) == len(counts)
    assert len(joined["candidate_lengths"]) == sum(f.rows for f in feeds) == sum(counts)


def test_a_model_failure_fails_its_batch_not_the_instance(served):
    """What the checks cannot see (here a dense width Triton's own shape check refuses) fails
    in the model: the batch's requests get "model failed", INTERNAL, and the next batch runs."""
    request = random_request(NUM_DENSE + 1, NUM_SPARSE, 2, seed=4)
    (failure,) = served.instance.execute([inputs(request)])
    assert isinstance(failure, Failure) and failure.code == INTERNAL
    assert failure.message.startswith("model failed: ")
    good = random_request(NUM_DENSE, NUM_SPARSE, 2, seed=4)
    assert np.array_equal(served.instance.execute([inputs(good)])[0], forward(served.model, good))


def test_string_ids_score_as_their_encoded_ids_and_negative_tokens_are_counted(served):
    spec = served.instance.spec
    assert spec is not None, "the tiny export carries a feature_spec"
    request = random_request(NUM_DENSE, NUM_SPARSE, 6, seed=5, ids_per_bag=(1, 3))
    tokens = [str(v) for v in request[VALUES].tolist()]
    tokens[0] = "-4"  # a negative integer token of the first sample's first feature
    strings = np.array([t.encode() for t in tokens], dtype=object)
    negative = spec.negative_counts(request[LENGTHS], tokens)
    assert sum(negative.values()) >= 1
    (got,) = served.instance.execute(
        [Inputs.flat(request[DENSE], request[LENGTHS], strings=strings)]
    )
    encoded = dict(request, **{VALUES: spec.encode_values(request[LENGTHS], tokens)})
    assert np.array_equal(got, forward(served.model, encoded))
    for feature, n in negative.items():
        labels = {"model": "rec", "version": "1", "reason": "negative", "feature": feature}
        if n:
            assert served.metrics.value("rec_questionable_ids_total", **labels) == n


def test_the_updates_url_parameter_overrides_rec_json(tiny_repo, tmp_path):
    """rec-server's --updates: a bad URL fails the load; a URL is followed (here a broker that
    does not answer: not connected, said, no watermark); a model whose rec.json has no
    "updates" section is served as exported, with a warning."""
    with pytest.raises(LoadError, match="model 'rec': .*looks like a Redis database number"):
        ModelInstance(staged_config(tiny_repo, updates="redis://127.0.0.1:6379/0"))
    nobody = "redis://127.0.0.1:1/rec:updates"
    s = Served(staged_config(tiny_repo, updates=nobody))
    try:
        labels = {"model": "rec", "version": "1"}
        deadline = time.monotonic() + 10
        while not any(level == "warn" for level, _ in s.said):
            assert time.monotonic() < deadline, s.said
            time.sleep(0.05)
        assert s.metrics.value("rec_update_log_connected", **labels) == 0
        assert s.metrics.value("rec_update_watermark_step", **labels) == -1
    finally:
        s.instance.close()
    from tests.serve_cpp.tiny_model import write_model

    path = write_model(tmp_path)
    s = Served(InstanceConfig("rec", "1", str(path), updates_url=nobody))
    assert s.instance.reader is None and s.instance.tables is None
    assert ("warn", "model 'rec' version 1 cannot take updates (rec's Triton model applies the "
            'update log to a TorchScript export with rec.json "updates" only); serving it as '
            "exported") in s.said  # fmt: skip


def test_a_batch_variant_model_fails_its_load_unless_allowed(tmp_path):
    from tests.serve_cpp.tiny_model import write_model

    path = write_model(tmp_path, batch_probe="variant")
    config = InstanceConfig("rec", "1", str(path), max_rows=64)
    with pytest.raises(LoadError) as failed:
        ModelInstance(config)
    message = str(failed.value)
    assert "model 'rec' version 1 is not batch invariant on this CPU" in message
    assert message.endswith(". Serve it anyway with --allow-batch-variant")
    s = Served(InstanceConfig("rec", "1", str(path), max_rows=64, allow_batch_variant=True))
    assert s.metrics.value("rec_model_batch_variant", model="rec", version="1") == 1
    assert s.said[-1][0] == "warn" and s.said[-1][1].endswith("(--allow-batch-variant)")


RUN, GEN, EXPORTED = "logic-run", 1, 10
ROWS = {t["name"]: t["rows"] for t in TINY["tables"]}


def _record(step: int, table: str, seed: int, **kw) -> UpdateRecord:
    """Every row of `table` (int8, dim 8) rewritten at `step`."""
    g = torch.Generator().manual_seed(seed)
    rows = fused_rows(torch.randn((ROWS[table], 8), generator=g), "int8").numpy().tobytes()
    base = dict(run=RUN, gen=GEN, rank=0, world=1, step=step, wall_ns=time.time_ns(),
                last=True, table=table, dtype="int8", dim=8, ids=tuple(range(ROWS[table])),
                rows=rows)  # fmt: skip
    return UpdateRecord(**(base | kw))


@pytest.mark.skipif(redis_server_path() is None, reason="redis-server is not installed")
def test_the_update_log_is_applied_counted_and_scored(tmp_path):
    """The instance follows our own redis-server's stream from its start: records the export
    holds are skipped, later ones applied (its scores are model.pt's with the same rows written
    by write_rows), bad ones refused, counted by outcome and logged."""
    with RedisBroker(tmp_path / "redis") as broker:
        url = broker.url("rec:updates")
        cfg = copy.deepcopy(TINY) | {"publish": {"url": url}}
        run = write_seeded_run(tmp_path / "run", cfg)
        (run / run_dir.PUBLISH_FILE).write_text(json.dumps({"run": RUN}))
        run_dir.commit_checkpoint(run, EXPORTED, {"world_size": 1, "publish_gen": GEN})
        from rec.export.pipeline import export_run

        export_run(run, tmp_path / "repo", log=lambda _msg: None)
        applied = [_record(EXPORTED + 1, "t0", seed=3), _record(EXPORTED + 2, "t1", seed=4)]
        unknown = dataclasses.replace(_record(EXPORTED + 2, "t2", seed=5), table="t9")
        other_run = _record(EXPORTED + 2, "t2", seed=6, run="other")
        log = [_record(EXPORTED, "t0", seed=1), applied[0], unknown, other_run, {b"junk": b"1"},
               applied[1]]  # fmt: skip
        client = redis.Redis(host=broker.host, port=broker.port)
        for r in log:
            client.xadd("rec:updates", encode(r) if isinstance(r, UpdateRecord) else r)
        client.close()
        s = Served(staged_config(tmp_path / "repo"))
        try:
            deadline = time.monotonic() + 30
            labels = {"model": "rec", "version": "1"}
            while s.metrics.value("rec_update_watermark_step", **labels) < EXPORTED + 2:
                assert time.monotonic() < deadline, s.said
                time.sleep(0.05)
            request = random_request(NUM_DENSE, NUM_SPARSE, 16, seed=7)
            (got,) = s.instance.execute([inputs(request)])
        finally:
            s.instance.close()
    updates = json.loads(ModelDir.of(tmp_path / "repo", "rec").version_manifest(1).read_text())
    buffers = dict(s.model.named_buffers())
    for r in applied:
        place = updates["updates"]["tables"][r.table]
        write_rows(buffers[place["buffer"]], place, r.ids, r.rows)
    assert np.array_equal(got, forward(s.model, request))
    outcomes = ("applied", "skipped", "unknown_table", "other_run", "malformed")
    counts = {o: s.metrics.value("rec_update_records_total", **labels, outcome=o)
              for o in outcomes}  # fmt: skip
    assert counts == {"applied": 2, "skipped": 1, "unknown_table": 1, "other_run": 1,
                      "malformed": 1}  # fmt: skip
    rows = s.metrics.value("rec_update_rows_applied_total", **labels)
    assert rows == ROWS["t0"] + ROWS["t1"]
    assert s.metrics.value("rec_update_watermark_wall_ms", **labels) == applied[1].wall_ns // 10**6
    assert s.metrics.value("rec_update_log_connected", **labels) == 1
    refused = [m for level, m in s.said if level == "warn" and "refused update log entry" in m]
    assert len(refused) == 3 and any("(unknown_table)" in m for m in refused)


@pytest.mark.skipif(redis_server_path() is None, reason="redis-server is not installed")
def test_an_instance_past_a_trim_of_the_log_is_not_ready(tmp_path):
    """The log trimmed (rec.logs.update_trim) past an export's records after a newer checkpoint:
    the instance, reading from the log's start, answers UNAVAILABLE naming the trim and the
    recovery (a newer export) rather than serve rows that miss records."""
    from rec.config import PublishConfig
    from rec.logs.update_trim import register, tails, trim_log

    with RedisBroker(tmp_path / "redis") as broker:
        url = broker.url("rec:updates")
        run = write_seeded_run(tmp_path / "run", copy.deepcopy(TINY) | {"publish": {"url": url}})
        (run / run_dir.PUBLISH_FILE).write_text(json.dumps({"run": RUN}))
        run_dir.commit_checkpoint(run, EXPORTED, {"world_size": 1, "publish_gen": GEN})
        from rec.export.pipeline import export_run

        export_run(run, tmp_path / "repo", log=lambda _msg: None)
        client = redis.Redis(host=broker.host, port=broker.port)
        ids = [client.xadd("rec:updates", encode(_record(EXPORTED + s, "t0", seed=s))).decode()
               for s in range(1, 4)]  # fmt: skip
        register(url, "newer", {0: ids[2]})
        trim_log(PublishConfig(url=url, keep_s=0), tails(url), gen=GEN, step=EXPORTED + 3)
        client.close()
        s = Served(staged_config(tmp_path / "repo"))
        try:
            deadline = time.monotonic() + 10
            while s.instance.reader.trimmed_past is None:
                assert time.monotonic() < deadline, s.said
                time.sleep(0.05)
            (got,) = s.instance.execute([inputs(random_request(NUM_DENSE, NUM_SPARSE, 4, seed=7))])
        finally:
            s.instance.close()
    assert isinstance(got, Failure) and got.code == UNAVAILABLE, got
    assert got.message.startswith("not ready: the update log's partition 0 was trimmed below "
                                  f"{ids[2]} (after checkpoint gen 1 step 13)"), got  # fmt: skip
    assert "rec export" in got.message
    assert any(level == "error" and "trimmed below" in m for level, m in s.said), s.said
