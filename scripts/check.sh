#!/usr/bin/env bash
# `make check`, the edit loop: lint, then the tests that train nothing and start no server
# (tests/tiers.py draws the line and refuses, under this tier, any test that starts one).
# Under 3 minutes on 2 cores; `make test` runs everything, and CI runs that. Extra arguments go
# to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
start=$SECONDS
$BIN/ruff check .
$BIN/ruff format --check .
REC_TEST_TIER=check $BIN/python -m pytest -q -p no:cacheprovider -n "${REC_TEST_WORKERS:-2}" \
  -m "not integration" --ignore=tests/reliability/test_fuzz.py "$@"
echo "make check: $((SECONDS - start)) s"
