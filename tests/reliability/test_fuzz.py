"""A short seeded run of the C++ request-decoder fuzz targets (cpp/fuzz/, libFuzzer with ASan and
UBSan) through benchmarks/fuzz.sh: any crash or sanitizer report fails the test."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECONDS_PER_TARGET = 7  # four targets: ~30 s of fuzzing, plus an incremental build


@pytest.mark.skipif(
    shutil.which("clang++") is None,
    reason="clang++ not installed (scripts/setup.sh installs clang and libclang-rt-14-dev)",
)
def test_decoders_survive_a_seeded_fuzz_run():
    out = subprocess.run(
        ["bash", str(ROOT / "benchmarks/fuzz.sh"), str(SECONDS_PER_TARGET)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split() for line in out.stdout.splitlines()[1:]]
    assert [r[0] for r in rows] == [
        "fuzz_http_request",
        "fuzz_infer_body",
        "fuzz_grpc_infer",
        "fuzz_settings_body",
    ]
    for name, _, execs, *_, crashes in rows:
        assert int(execs) > 1000, f"{name} ran only {execs} inputs"
        assert crashes == "0"
