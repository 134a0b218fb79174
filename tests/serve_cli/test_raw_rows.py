"""Raw rows in, the same scores out: train on files, export, serve, and `rec predict` the
held-out file as it is, on rec-server and Triton, with ids and with strings.

The AUC `rec predict` prints for the held-out file must be the AUC export reported for the
same split (both score every held-out row; batch invariance makes the scores exact).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from rec.cli import main
from rec.contract import MANIFEST_FILE
from rec.data import write_criteo_tsv, write_parquet
from rec.features import SPEC_FILE
from rec.serve.cpp import start_cpp
from rec.serve.triton import start_triton
from tests.helpers import rec_in_process, run_rec, warning_lines, write_config
from tests.serve_triton.tiny_repo import write_seeded_run

PORTS = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}


def predict(server, protocol: str, path, repo, send: str):
    result = CliRunner().invoke(main, [
        "predict", "--url", getattr(server.endpoints, protocol), "--protocol", protocol,
        "--input", str(path), "--repo", str(repo), "--send", send, "--batch-size", "100",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    auc = float(re.search(r"AUC ([0-9.]+)", result.stderr).group(1))
    return auc, result.stdout


def exported_auc(repo) -> float:
    manifest = json.loads(next(repo.glob(f"rec/*/{MANIFEST_FILE}")).read_text())
    checks = manifest["verification"]
    assert checks["raw_rows"]["identical"] is True and checks["raw_rows"]["rows"] > 0
    return checks["eval"]["torchscript"]["auc"]


def write_interactions(path, rows: int, seed: int) -> None:
    """A CSV of user/item interactions with string ids, multi-valued "a|b|c" history cells
    and raw counts; the label follows the user's and the item's hidden taste."""
    rng = np.random.default_rng(seed)
    taste = np.random.default_rng(99).standard_normal(60)
    lines = ["clicked,price,views,user_id,item,history"]
    for _ in range(rows):
        u, i = rng.integers(0, 30), rng.integers(0, 30)
        history = "|".join(f"item-{h}" for h in rng.integers(0, 30, rng.integers(0, 4)))
        views = int(rng.integers(0, 5000))
        logit = taste[u] + taste[30 + i] + 0.3 * np.log1p(views) - 1.2
        label = int(rng.random() < 1 / (1 + np.exp(-2 * logit)))
        price = round(float(rng.uniform(1, 100)), 2)
        lines.append(f"{label},{price},{views},user-{u},item-{i},{history}")
    path.write_text("\n".join(lines) + "\n")


def test_csv_with_string_categories_end_to_end(tmp_path):
    train, held_out = tmp_path / "train.csv", tmp_path / "eval.csv"
    write_interactions(train, 6000, seed=1)
    write_interactions(held_out, 600, seed=2)
    cfg = {
        "tables": [
            {"name": "users", "rows": 97, "dim": 8, "features": ["user"]},
            {"name": "item_ids", "rows": 89, "dim": 8, "features": ["item", "recent_items"]},
        ],
        "features": {"dense": 2, "dense_names": ["price", "views"],
                     "transforms": {"views": "log1p"}},
        "model": {"dense_arch": [8], "over_arch": [16, 1]},
        "data": {"source": "csv", "train_paths": [str(train)], "eval_paths": [str(held_out)],
                 "columns": {"label": "clicked", "sparse": {"user": "user_id",
                             "recent_items": "history"}}},
        "training": {"batch_size": 64, "steps": 80, "eval_every": 0, "log_every": 40},
        "checkpoint": {"every_steps": 0},
        "export": {"max_batch_size": 256, "format": "torchscript"},
    }  # fmt: skip
    run, repo = tmp_path / "run", tmp_path / "repo"
    out = run_rec("train", "--config", str(write_config(tmp_path / "c.yaml", cfg)),
                  "--run-dir", str(run), "--nproc", "1").stdout  # fmt: skip
    assert not warning_lines(out), warning_lines(out)  # a CSV of one's own: rec's lines only
    spec = json.loads((run / SPEC_FILE).read_text())
    assert spec["dense"][1] == {"name": "views", "column": "views", "transform": "log1p"}
    assert spec["sparse"][2]["column"] == "history"  # data.columns rename, recorded
    rec_in_process("export", str(run), "--repo", str(repo), check=True)
    auc = exported_auc(repo)
    assert auc > 0.6  # learned something from strings and raw counts
    scores = {}
    with start_cpp(repo, **PORTS) as cpp, start_triton(repo, **PORTS) as triton:
        for name, server in (("cpp", cpp), ("triton", triton)):
            for protocol in ("http", "grpc"):
                for send in ("ids", "strings"):
                    got, out = predict(server, protocol, held_out, repo, send)
                    assert abs(got - auc) <= 1e-6, (name, protocol, send, got, auc)
                    scores[name, protocol, send] = out
    assert len(set(scores.values())) == 1  # every server, protocol and form: the same scores


def _criteo_config(tmp_path) -> dict:
    return {
        "tables": [{"name": f"t{i}", "rows": 40 + i, "dim": 4, "features": [f"cat_{i}"]}
                   for i in range(26)],
        "features": {"dense": 13},
        "model": {"dense_arch": [8, 4], "over_arch": [8, 1]},
        "data": {"synthetic": {"max_hotness": 1, "eval_samples": 500}},
        "checkpoint": {"every_steps": 0},
        "export": {"max_batch_size": 256, "format": "torchscript"},
    }  # fmt: skip


def test_criteo_day_file_with_raw_counts_and_hex_ids(tmp_path):
    from rec.config import config_from_dict

    data = _criteo_config(tmp_path)
    day = tmp_path / "day_23.tsv"
    write_criteo_tsv(config_from_dict(data), day, n=500, split="eval")
    data["data"] = {"source": "criteo_tsv", "train_paths": [str(day)], "eval_paths": [str(day)]}
    run, repo = write_seeded_run(tmp_path / "run", data), tmp_path / "repo"
    rec_in_process("export", str(run), "--repo", str(repo), check=True)
    auc = exported_auc(repo)
    manifest = json.loads(next(repo.glob(f"rec/*/{MANIFEST_FILE}")).read_text())
    assert {d["transform"] for d in manifest["feature_spec"]["dense"]} == {"log1p"}
    # Without the label column too: a file to score, not to evaluate.
    unlabelled = tmp_path / "day_23_unlabelled.tsv"
    unlabelled.write_text("".join(line.split("\t", 1)[1] for line in day.open()))
    with start_cpp(repo, **PORTS) as cpp:
        got, with_labels = predict(cpp, "grpc", day, repo, "strings")
        assert abs(got - auc) <= 1e-6
        result = CliRunner().invoke(
            main,
            [
                "predict",
                "--url",
                cpp.endpoints.http,
                "--input",
                str(unlabelled),
                "--repo",
                str(repo),
            ],
        )
        assert result.exit_code == 0 and "AUC" not in result.stderr, result.output
        assert result.stdout == with_labels
        # Sending log1p'd values instead of raw counts is what this contract prevents; a bad
        # raw row is named by line and column.
        lines = day.read_text().splitlines()
        fields = lines[4].split("\t")
        fields[20] = "zz"
        bad = tmp_path / "bad.tsv"
        bad.write_text("\n".join(lines[:4] + ["\t".join(fields)]) + "\n")
        result = CliRunner().invoke(
            main, ["predict", "--url", cpp.endpoints.http, "--input", str(bad), "--repo", str(repo)]
        )
        assert result.exit_code == 2
        assert f"{bad}: line 5, column C7: 'zz' is not hex" in result.output


def test_parquet_with_list_columns(tmp_path):
    from rec.config import config_from_dict
    from tests.serve_triton.tiny_repo import TINY

    data = json.loads(json.dumps(TINY))
    data["data"]["synthetic"]["max_hotness"] = 3
    data["data"]["columns"] = {"labels": ["y0", "y1"], "sparse": {"tags": "tag_list"}}
    held_out = tmp_path / "eval.parquet"
    write_parquet(config_from_dict(data), held_out, n=300, split="eval")
    data["data"].update(source="parquet", train_paths=[str(held_out)], eval_paths=[str(held_out)])
    run, repo = write_seeded_run(tmp_path / "run", data), tmp_path / "repo"
    rec_in_process("export", str(run), "--repo", str(repo), check=True)
    auc = exported_auc(repo)
    with start_triton(repo, **PORTS) as triton:
        got, _ = predict(triton, "http", held_out, repo, "strings")
    assert abs(got - auc) <= 1e-6


@pytest.mark.parametrize("cell", ["1.5.2", "[1, 2]"])
def test_bad_dense_cells_are_named(tmp_path, cell):
    from rec.data.errors import DataError
    from rec.data.raw import read_raw
    from rec.features import HASH, DenseFeature, FeatureSpec, SparseFeature

    spec = FeatureSpec("csv", ["y"], [DenseFeature("a", "a", "identity")],
                       [SparseFeature("s", "s", "int_or_hash", "|")], dict(HASH))  # fmt: skip
    path = tmp_path / "rows.jsonl"
    value = json.loads(cell) if cell.startswith("[") else cell
    path.write_text(json.dumps({"y": 1, "a": 1.0, "s": "x"}) + "\n"
                    + json.dumps({"y": 0, "a": value, "s": "x"}) + "\n")  # fmt: skip
    with pytest.raises(DataError, match=r"line 2, column a: .* is not a number"):
        read_raw(path, spec)
