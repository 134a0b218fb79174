"""`rec predict --group-by` on a context model: rows sharing a request id go as one request of
one context and its candidates, and score exactly as the same rows sent flat; files whose
requests do not share their context, and models without one, are refused by name."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from click.testing import CliRunner

from rec.cli import main

SESSIONS = ["s1", "s2", "s1", "s3", "s2", "s1", "s3", "s1"]
"""Each row's request id: the requests interleave in the file."""


def records(sessions: list[str], seed: int = 0) -> list[dict]:
    """One row per (request, candidate): a request's context columns (conftest.CONTEXT) the
    same on each of its rows, the candidate's (item, city, dense_1..3) its own."""
    rng = np.random.default_rng(seed)
    contexts = {}
    out = []
    for i, session in enumerate(sessions):
        if session not in contexts:
            contexts[session] = {
                "dense_0": float(rng.standard_normal()),
                "user": [int(x) for x in rng.integers(0, 10**6, size=len(contexts) % 3)],
                "tags": ["sports", "news", "music"][: 1 + len(contexts) % 3],
            }
        row = {"session": session, **contexts[session]}
        row.update({f"dense_{j}": float(rng.standard_normal()) for j in (1, 2, 3)})
        row["item"] = [int(rng.integers(0, 10**6))]
        row["city"] = [] if i % 4 == 3 else [f"city{i % 5}"]
        row["label_0"], row["label_1"] = i % 2, (i // 3) % 2
        out.append(row)
    return out


def write_csv(path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for r in rows:
            writer.writerow({k: "|".join(map(str, v)) if isinstance(v, list) else v
                             for k, v in r.items()})  # fmt: skip


def predict(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["predict", *args])
    return result.exit_code, result.stdout if result.exit_code == 0 else result.output


def scores(text: str) -> np.ndarray:
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["row", "score_label_0", "score_label_1"]
    assert [int(r[0]) for r in rows[1:]] == list(range(len(rows) - 1))  # file order
    return np.array([[float(x) for x in r[1:]] for r in rows[1:]], dtype=np.float32)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("send", ["ids", "strings"])
def test_group_by_scores_as_the_flat_rows(cpp_context, context_repo, tmp_path, protocol, send):
    """Interleaved requests, in the context form and flat, and the rows without --group-by:
    one set of scores, bit for bit (the printed 7 digits and the CSV written alike)."""
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records(SESSIONS)))
    base = ["--url", getattr(cpp_context.endpoints, protocol), "--protocol", protocol,
            "--input", str(path), "--repo", str(context_repo), "--send", send]  # fmt: skip
    outs = {}
    for name, extra in (("plain", ["--batch-size", "3"]),
                        ("context", ["--group-by", "session"]),
                        ("flat", ["--group-by", "session", "--form", "flat"])):  # fmt: skip
        code, out = predict(*base, *extra)
        assert code == 0, out
        outs[name] = scores(out)
    assert outs["plain"].shape == (len(SESSIONS), 2)
    assert np.array_equal(outs["context"], outs["plain"])
    assert np.array_equal(outs["flat"], outs["plain"])


@pytest.mark.parametrize("send", ["ids", "strings"])
def test_group_by_on_triton_without_the_repository(
    triton_context, cpp_context, context_repo, tmp_path, send
):
    """Triton publishes the context columns with the feature spec, so --group-by needs no
    --repo there; its scores are rec-server's, both forms."""
    path = tmp_path / "rows.csv"
    write_csv(path, records(SESSIONS, seed=2))
    outs = []
    for server in (triton_context, cpp_context):
        for form in ("context", "flat"):
            code, out = predict("--url", server.endpoints.grpc, "--protocol", "grpc",
                                "--input", str(path), "--send", send, "--group-by", "session",
                                "--form", form, *([] if server is triton_context else
                                                  ["--repo", str(context_repo)]))  # fmt: skip
            assert code == 0, out
            outs.append(scores(out))
    for other in outs[1:]:
        assert np.array_equal(outs[0], other)


def test_group_by_scores_exactly_and_splits_above_max_batch_size(
    cpp_context, context_repo, tmp_path
):
    """A request of 300 candidates (max_batch_size 256) goes as two; the scores, compared at
    full precision through the library, are those of the flat rows."""
    from rec.data.raw import read_raw
    from rec.features import FeatureSpec
    from rec.serve.client import ScoreClient
    from rec.serve.predict import PredictConfig, request_rows
    from rec.serve.predict import predict as run_predict
    from rec.serve.repository import load_model

    sessions = ["big"] * 300 + ["s1", "big", "s2"]
    path = tmp_path / "rows.csv"
    write_csv(path, records(sessions, seed=1))
    cfg = PredictConfig(cpp_context.endpoints.grpc, "grpc", input=path, repo=context_repo,
                        output=tmp_path / "out.csv", group_by="session")  # fmt: skip
    got = run_predict(cfg).scores
    spec = FeatureSpec.from_dict(load_model(context_repo).feature_spec)
    rows = request_rows(read_raw(path, spec), spec, "ids")
    client = ScoreClient(cpp_context.endpoints.grpc, "grpc")
    want = np.concatenate([client.score(part) for part in rows.split(64)])
    assert np.array_equal(got, want)


def test_a_context_cell_differing_within_a_request_is_refused(context_repo, tmp_path):
    """Named by file, line, column, request id and both values; checked before any request
    (no server at this address)."""
    rows = records(SESSIONS)
    rows[5]["tags"] = ["other"]  # line 7 (header: line 1); s1's first row is line 2
    path = tmp_path / "rows.csv"
    write_csv(path, rows)
    args = ["--url", "127.0.0.1:9", "--input", str(path), "--repo", str(context_repo),
            "--group-by", "session"]  # fmt: skip
    code, out = predict(*args)
    first = "['" + "', '".join(rows[0]["tags"]) + "']"
    assert code == 2
    assert (f"error: {path}: line 7, column tags: request 's1' (--group-by session) has "
            f"['other'] here but {first} on line 2") in out  # fmt: skip
    rows = records(SESSIONS)
    rows[4]["dense_0"] = 0.5  # s2's second row
    write_csv(path, rows)
    code, out = predict(*args)
    assert code == 2 and "line 6, column dense_0: request 's2' (--group-by session) has 0.5" in out


def test_group_by_refusals(context_repo, tiny_repo, tmp_path):
    path = tmp_path / "rows.csv"
    write_csv(path, records(SESSIONS))
    base = ["--url", "127.0.0.1:9", "--input", str(path)]
    code, out = predict(*base, "--repo", str(tiny_repo), "--group-by", "session")
    assert code == 2 and "has no context section" in out and "features.context" in out
    code, out = predict(*base, "--repo", str(context_repo), "--group-by", "request")
    assert code == 2 and f"{path}: no column 'request'" in out
    code, out = predict("--url", "127.0.0.1:9", "--synthetic", "3", "--group-by", "session")
    assert code == 2 and "--group-by reads a column of --input" in out
    rows = records(SESSIONS)
    rows[2]["session"] = ""
    write_csv(path, rows)
    code, out = predict(*base, "--repo", str(context_repo), "--group-by", "session")
    assert code == 2 and "line 4, column session: empty, expected a request id" in out
