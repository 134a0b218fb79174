"""`rec bench` against the session's real servers: a tiny sweep, its JSON, PNG and progress."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rec.cli import main
from rec.cpu import cpu_info, describe


def test_bench_sweep_writes_json_and_plot(triton, tmp_path):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    args = ["bench", "--target", f"triton-grpc=grpc://{triton.endpoints.grpc}",
            "--target", f"triton-http=http://{triton.endpoints.http}",
            "--batch-size", "1,8", "--concurrency", "2", "--rate", "40",
            "--warmup", "0.2", "--requests", "12", "--processes", "1",
            "--output", str(out), "--plot", str(png)]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    progress = [line for line in result.output.splitlines() if line.startswith("[")]
    assert len(progress) == 8  # 2 targets x 2 batch sizes x (1 concurrency + 1 rate)
    result = json.loads(out.read_text())
    # The machine it ran on, as rec.cpu reads it (whatever flags this CPU has).
    assert result["meta"]["cpu"] == describe(cpu_info())
    assert result["meta"]["cpu_flags"] == cpu_info()["flags"]
    rows = result["results"]
    assert {(r["target"], r["batch"], r["concurrency"], r["offered_rps"]) for r in rows} >= {
        ("triton-grpc", 8, 2, None),
        ("triton-http", 1, 2, None),
        ("triton-http", 8, 2, 40.0),
    }
    for r in rows:
        assert r["errors"] == 0 and r["ok"] >= 12
        lat = r["latency_ms"]
        assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["p99.9"] <= lat["max"]
        assert r["throughput_samples_per_s"] == r["throughput_rps"] * r["batch"]
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_bench_counts_errors(triton, tmp_path):
    """A target that rejects every request (wrong model name) is measured as errors, not a crash."""
    args = ["bench", "--target", f"bad=grpc://{triton.endpoints.grpc}", "--model", "rec",
            "--batch-size", "300", "--concurrency", "1", "--warmup", "0", "--requests", "3",
            "--processes", "1", "--output", str(tmp_path / "b.json"), "--no-plot"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    (row,) = json.loads((tmp_path / "b.json").read_text())["results"]
    assert row["ok"] == 0 and row["errors"] >= 3
    assert any("exceeds max_batch_size" in k for k in row["error_kinds"])


def test_bench_needs_targets():
    result = CliRunner().invoke(main, ["bench", "--no-plot"])
    assert result.exit_code == 2 and "--target" in result.output


def test_triton_peak_rss_counts_its_model_process(triton):
    """rec bench's and the benchmarks' server memory: Triton's Python-backend model runs in a
    stub process under tritonserver, and that process holds the model's tables."""
    own = triton.peak_rss_bytes()
    assert 0 < own < triton.tree_peak_rss_bytes()
