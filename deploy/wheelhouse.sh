#!/usr/bin/env bash
# The image's Python stack as wheels, for a build without a network (air-gapped or proxied sites,
# and this project's deploy test): requirements.txt (not requirements-host.txt), torchrec
# (installed with --no-deps, docs/architecture.md#pinned-stack) and the build tools of rec's op
# library, all downloaded by the host's own pip, with its own index configuration, into
# deploy/wheelhouse/.
#   deploy/wheelhouse.sh            (kept when its stamp matches requirements.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=deploy/wheelhouse
PIP=${PIP:-.venv/bin/pip}
log() { printf '\033[1m[wheelhouse]\033[0m %s\n' "$*"; }

key=$(cat requirements.txt deploy/wheelhouse.sh | sha256sum | cut -c1-16)
if [ -f "$OUT/.stamp" ] && [ "$(cat "$OUT/.stamp")" = "$key" ]; then
  log "$OUT matches requirements.txt; kept"
  exit 0
fi
command -v "$PIP" > /dev/null || { echo "deploy/wheelhouse.sh: no pip at $PIP (run make setup, or PIP=...)" >&2; exit 1; }
find "$OUT" -name '*.whl' -delete 2>/dev/null || true
mkdir -p "$OUT"
log "pip download of the image's stack into $OUT"
fail() {
  echo "deploy/wheelhouse.sh: pip could not download $1. The host's pip needs a package index" \
    "(network, proxy or a local mirror in pip.conf); see the README, 'Docker'." >&2
  exit 1
}
"$PIP" download -q --disable-pip-version-check --retries 2 --timeout 30 -d "$OUT" \
  -r requirements.txt || fail "the pinned stack"
"$PIP" download -q --disable-pip-version-check --retries 2 --timeout 30 -d "$OUT" \
  --no-deps torchrec==1.8.0 "setuptools>=68" wheel || fail "torchrec and setuptools"
# A few pins exist only as source (iopath 0.1.10): built into wheels here, so that the image
# installs wheels only and needs no build tools for them. SOURCE_DATE_EPOCH makes the wheel the
# same bytes on every host and run, so Docker's layer cache holds across fresh clones.
for sdist in "$OUT"/*.tar.gz; do
  [ -e "$sdist" ] || continue
  SOURCE_DATE_EPOCH=315532800 "$PIP" wheel -q --disable-pip-version-check --no-deps -w "$OUT" \
    "$sdist" || fail "$sdist (build)"
  rm -f "$sdist"
done
echo "$key" > "$OUT/.stamp"
log "$(find "$OUT" -name '*.whl' | wc -l) wheels, $(du -sh "$OUT" | cut -f1)"
