"""A 10-second version of benchmarks/soak.py against the real exported model: valid requests mixed
with malformed ones and slow clients at concurrency 64; nothing valid is lost, every malformed
request gets its 4xx, and the server is alive at the end and exits 0."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = {
    "bad_json": 400,
    "wrong_dtype": 400,
    "shape_mismatch": 400,
    "lengths_values": 400,
    "truncated_binary": 400,
    "oversize_body": 413,
    "unknown_model": 404,
}


def test_short_soak_loses_no_valid_request(exported_repo, tmp_path):
    out = tmp_path / "soak.json"
    argv = [sys.executable, str(ROOT / "benchmarks/soak.py"), "--minutes", "0.17"]
    argv += ["--warmup-s", "2", "--repo", str(exported_repo), "--out", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(out.read_text())
    assert r["valid_lost"] == 0 and r["valid_ok"] == r["valid_sent"] > 100, r
    assert r["server_alive_at_end"] and r["server_exit_code"] == 0, r
    answers = r["answers_by_class_and_status"]
    for kind, status in EXPECTED.items():
        assert r["requests_by_class"][kind] == answers.get(f"{kind}:{status}"), (kind, answers)
