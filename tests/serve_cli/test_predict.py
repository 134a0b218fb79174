"""`rec predict` against the real Triton (and rec-server when built): files, synthetic rows,
and input errors that name the row and the field."""

from __future__ import annotations

import csv
import io
import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from rec.cli import main
from rec.contract import ModelDir
from rec.data.raw import read_raw
from rec.features import FeatureSpec, hash_id
from rec.serve.client import ScoreClient
from rec.serve.predict import request_rows, score_columns
from rec.serve.repository import load_model
from tests.helpers import questionable_ids


def run(*args: str):
    """Exit code, and stdout (the scores) on success or everything printed (the error) if not."""
    result = CliRunner().invoke(main, ["predict", *args])
    return result.exit_code, result.stdout if result.exit_code == 0 else result.output


def parse_scores(text: str) -> np.ndarray:
    rows = list(csv.reader(io.StringIO(text)))
    # The tiny model's two tasks are unnamed: model.task_names label_0, label_1.
    assert rows[0] == ["row", "score_label_0", "score_label_1"]
    return np.array([[float(x) for x in r[1:]] for r in rows[1:]], dtype=np.float32)


def sample_records(repo, n: int = 6) -> list[dict]:
    model = load_model(repo)
    rng = np.random.default_rng(0)
    records = []
    for i in range(n):
        record = {name: float(rng.standard_normal()) for name in model.dense_names}
        for name in model.sparse_names:
            record[name] = [int(x) for x in rng.integers(0, 10**6, size=i % 3)]  # 0..2 ids
        record["label_0"], record["label_1"] = i % 2, (i // 2) % 2
        record["row_id"] = i  # extra columns are ignored
        records.append(record)
    return records


def write_csv(path, records, delimiter=","):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]), delimiter=delimiter)
        writer.writeheader()
        for r in records:
            writer.writerow(
                {k: "|".join(map(str, v)) if isinstance(v, list) else v for k, v in r.items()}
            )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_synthetic(triton, protocol):
    code, out = run("--url", getattr(triton.endpoints, protocol), "--protocol", protocol,
                    "--synthetic", "5", "--batch-size", "2")  # fmt: skip
    assert code == 0, out
    scores = parse_scores(out)
    assert scores.shape == (5, 2) and np.all((scores > 0) & (scores < 1))


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_file_rows_match_direct_scoring(triton, tiny_repo, tmp_path, suffix):
    records = sample_records(tiny_repo)
    path = tmp_path / f"rows{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        write_csv(path, records, "\t" if suffix == ".tsv" else ",")
    out_path = tmp_path / "scores.csv"
    # Requests of 4 rows (4 + 2), compared with all 6 in one request: the split is exact.
    code, out = run("--url", triton.endpoints.http, "--input", str(path),
                    "--output", str(out_path), "--batch-size", "4")  # fmt: skip
    assert code == 0, out
    spec = FeatureSpec.from_dict(load_model(tiny_repo).feature_spec)
    rows = request_rows(read_raw(path, spec), spec, "ids")
    direct = ScoreClient(triton.endpoints.grpc, "grpc").score(rows)
    np.testing.assert_allclose(parse_scores(out_path.read_text()), direct, rtol=0, atol=1e-6)


def test_bad_row_names_row_and_column(triton, tiny_repo, tmp_path):
    records = sample_records(tiny_repo)
    records[3]["dense_1"] = "x1"
    path = tmp_path / "bad.csv"
    write_csv(path, records)
    code, out = run("--url", triton.endpoints.http, "--input", str(path))
    assert code == 2
    assert f"error: {path}: line 5, column dense_1: 'x1' is not a number" in out  # header: line 1


def test_missing_column_is_named(triton, tiny_repo, tmp_path):
    records = [{k: v for k, v in r.items() if k != "dense_2"} for r in sample_records(tiny_repo)]
    path = tmp_path / "short.csv"
    write_csv(path, records)
    code, out = run("--url", triton.endpoints.http, "--input", str(path))
    assert code == 2 and f"{path}: no column 'dense_2'" in out


def test_jsonl_missing_field(triton, tiny_repo, tmp_path):
    records = sample_records(tiny_repo)
    del records[1]["city"]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    code, out = run("--url", triton.endpoints.grpc, "--protocol", "grpc", "--input", str(path))
    assert code == 2 and f"{path}: line 2, column city: the column is missing" in out


def test_a_list_where_one_value_is_expected(triton, tiny_repo, tmp_path):
    records = sample_records(tiny_repo)
    records[2]["dense_0"] = [1.0, 2.0]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    code, out = run("--url", triton.endpoints.http, "--input", str(path))
    assert code == 2 and f"{path}: line 3, column dense_0: [1.0, 2.0] is not a number" in out


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_string_categories_score_like_their_ids(cpp, triton, tiny_repo, tmp_path, protocol):
    """Unknown strings are no error: they hash like any other; both request forms, both
    servers, one set of scores; and labels in the file give AUC and log loss."""
    records = sample_records(tiny_repo)
    for i, r in enumerate(records):
        r["user"] = ["alice", "bob", "x y", "Zoë"][: i % 4]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    outs = []
    for server in (cpp, triton):
        for send in ("ids", "strings"):
            result = CliRunner().invoke(main, [
                "predict", "--url", getattr(server.endpoints, protocol), "--protocol", protocol,
                "--input", str(path), "--repo", str(tiny_repo), "--send", send,
            ])  # fmt: skip
            assert result.exit_code == 0, result.output + result.stderr
            assert "AUC" in result.stderr and "log loss" in result.stderr
            outs.append(parse_scores(result.stdout))
    for other in outs[1:]:
        assert np.array_equal(outs[0], other)
    # The ids sent for "alice" are the pinned hash, the same the training readers produce.
    spec = FeatureSpec.from_dict(load_model(tiny_repo).feature_spec)
    rows = request_rows(read_raw(path, spec), spec, "ids")
    assert hash_id("alice") in rows.values.tolist()


def test_negative_ids_are_counted_by_predict_and_both_servers(cpp, triton, tiny_repo, tmp_path):
    """Four rows with a negative user id score as usual and are counted: by
    `rec predict`'s summary, and per feature in both servers' /metrics for strings sent; ids
    sent as sparse_values are not counted (a hash is negative as often as not)."""
    records = sample_records(tiny_repo)
    for i, r in enumerate(records):
        r["user"] = [[-(i + 1), 5], [7], [-2]][i % 3]  # rows 0, 2, 3, 5: one negative each
        r["tags"] = ["-0", "x"]  # zero, and a word: neither is negative
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    spec = FeatureSpec.from_dict(load_model(tiny_repo).feature_spec)
    want = {s.name: 4 if s.name == "user" else 0 for s in spec.sparse}
    for server in (cpp, triton):
        for send, counted in (("ids", False), ("strings", True)):
            before = questionable_ids(server.endpoints.metrics)
            assert set(before) == set(want)  # declared at load, before any negative value
            result = CliRunner().invoke(main, [
                "predict", "--url", server.endpoints.http, "--input", str(path),
                "--repo", str(tiny_repo), "--send", send,
            ])  # fmt: skip
            assert result.exit_code == 0, result.output
            assert "negative ids in categorical columns, by feature: user 4; " in result.stderr
            after = questionable_ids(server.endpoints.metrics)
            assert {f: after[f] - before[f] for f in want} == (
                want if counted else dict.fromkeys(want, 0)
            ), (server, send)


def test_cpp_with_repo_features(cpp, triton, tiny_repo, tmp_path):
    """rec-server does not publish feature names; --repo supplies them. Same scores as Triton."""
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in sample_records(tiny_repo)))
    code, cpp_out = run("--url", cpp.endpoints.http, "--input", str(path), "--repo", str(tiny_repo))
    assert code == 0, cpp_out
    code, triton_out = run("--url", triton.endpoints.http, "--input", str(path))
    assert code == 0, triton_out
    np.testing.assert_allclose(parse_scores(cpp_out), parse_scores(triton_out), rtol=0, atol=1e-6)


def test_score_columns_are_named_by_task(triton, tiny_repo, tmp_path):
    """The columns name the tasks of rec.json (from --repo, or as Triton publishes them); a
    single-task model's one column is `score`."""
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo, repo)
    manifest = ModelDir(next(p for p in repo.iterdir() if p.is_dir())).manifest
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "tasks": ["click", "buy"]}))
    code, out = run("--url", triton.endpoints.http, "--synthetic", "2", "--repo", str(repo))
    assert code == 0, out
    assert out.splitlines()[0] == "row,score_click,score_buy"
    assert score_columns(("click",), 1) == ["score"]
    assert score_columns((), 2) == ["score_label_0", "score_label_1"]


def test_unreachable_server_is_clear_error():
    code, out = run("--url", "127.0.0.1:9", "--synthetic", "2")
    assert code == 2 and "error:" in out and "127.0.0.1:9" in out
