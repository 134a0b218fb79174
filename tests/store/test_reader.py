"""The store's runtime stands apart from export: rec's Triton model imports rec.store.reader to
fetch rows, and must not load export's code or FBGEMM with it."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
import rec.store.reader
print(json.dumps(sorted(sys.modules)))
"""


def test_the_store_reader_imports_no_export_code_and_no_fbgemm():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert "rec.store.reader" in loaded
    heavy = [m for m in loaded if m.split(".")[0] in ("export", "fbgemm_gpu")
             or m.startswith("rec.export") or m == "rec.quantize"]  # fmt: skip
    assert heavy == []
