"""`rec bench --candidates` against rec-server: requests of one context and N candidates, in the
context form and flat, on a context model and (flat) on the plain model of the same features."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rec.cli import main


def bench(*args: str):
    return CliRunner().invoke(main, ["bench", "--concurrency", "2", "--warmup", "0.2",
                                     "--requests", "8", "--processes", "1", *args])  # fmt: skip


def test_candidates_sweep_both_forms(cpp_context, context_repo, tmp_path):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    result = bench("--target", f"cpp-grpc=grpc://{cpp_context.endpoints.grpc}",
                   "--target", f"cpp-http=http://{cpp_context.endpoints.http}",
                   "--candidates", "4,32", "--form", "both", "--context-from", str(context_repo),
                   "--output", str(out), "--plot", str(png))  # fmt: skip
    assert result.exit_code == 0, result.output
    progress = [line for line in result.output.splitlines() if line.startswith("[")]
    assert len(progress) == 8 and any("N=32 context c=2" in line for line in progress)
    rows = json.loads(out.read_text())["results"]
    assert {(r["target"], r["candidates"], r["form"]) for r in rows} == {
        (t, n, f) for t in ("cpp-grpc", "cpp-http") for n in (4, 32) for f in ("context", "flat")
    }
    for r in rows:
        assert r["errors"] == 0 and r["ok"] >= 8, r["error_kinds"]
        assert r["batch"] == r["candidates"]
        assert r["pairs_per_s"] == r["throughput_rps"] * r["candidates"] > 0
    size = {(r["target"], r["candidates"], r["form"]): r["request_bytes"] for r in rows}
    for target in ("cpp-grpc", "cpp-http"):
        ratio = {n: size[target, n, "context"] / size[target, n, "flat"] for n in (4, 32)}
        assert ratio[32] < min(ratio[4], 1), ratio  # at N=4 the inputs' headers may outweigh
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_plain_model_takes_the_same_pairs_flat(cpp, context_repo, tmp_path):
    """--context-from gives a model without context inputs the requests of its context twin,
    flat; the context form is refused before any point, naming the model."""
    out = tmp_path / "plain.json"
    target = f"plain=grpc://{cpp.endpoints.grpc}"
    context = ("--context-from", str(context_repo))
    result = bench("--target", target, "--candidates", "16", "--form", "flat", *context,
                   "--output", str(out), "--no-plot")  # fmt: skip
    assert result.exit_code == 0, result.output
    (row,) = json.loads(out.read_text())["results"]
    assert row["errors"] == 0 and row["form"] == "flat" and row["request_bytes"] > 0
    result = bench("--target", target, "--candidates", "16", *context, "--output", str(out),
                   "--no-plot")  # fmt: skip
    assert result.exit_code == 2 and "has no context inputs" in result.output
    result = bench("--target", target, "--candidates", "16", "--output", str(out), "--no-plot")
    assert result.exit_code == 2 and "--context-from" in result.output


def test_triton_publishes_the_context_columns(triton_context, tmp_path):
    """Triton's config carries rec.json's context section: no --context-from needed."""
    out = tmp_path / "triton.json"
    target = f"triton-http=http://{triton_context.endpoints.http}"
    result = bench("--target", target, "--candidates", "8", "--form", "both",
                   "--output", str(out), "--no-plot")  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["results"]
    assert {r["form"] for r in rows} == {"context", "flat"}
    assert all(r["errors"] == 0 and r["ok"] >= 8 for r in rows), rows
