#!/usr/bin/env bash
# Inside the image's build stage: the pinned Python stack into /opt/rec/.venv, from the wheelhouse
# (no network) or from package indexes. PIP_SOURCE: auto (the wheelhouse if it holds wheels),
# wheelhouse, or index (TORCH_INDEX first, for the CPU torch; PYPI_INDEX for the rest).
# FBGEMM_PACKAGE: fbgemm-gpu-cpu, or fbgemm-gpu with a CUDA TORCH_INDEX (same version either way).
set -euo pipefail
WHEELHOUSE=${WHEELHOUSE:-/wheelhouse}
SOURCE=${PIP_SOURCE:-auto}
if [ "$SOURCE" = auto ]; then
  if compgen -G "$WHEELHOUSE/*.whl" > /dev/null; then SOURCE=wheelhouse; else SOURCE=index; fi
fi
FBGEMM_PACKAGE=${FBGEMM_PACKAGE:-fbgemm-gpu-cpu}
sed "s/^fbgemm-gpu-cpu==/$FBGEMM_PACKAGE==/" requirements.txt > /tmp/requirements-image.txt
python3 -m venv .venv
PIP=(.venv/bin/pip install -q --disable-pip-version-check --no-cache-dir)

case "$SOURCE" in
  wheelhouse)
    compgen -G "$WHEELHOUSE/*.whl" > /dev/null || {
      echo "rec image: PIP_SOURCE=wheelhouse but deploy/wheelhouse/ holds no wheels." \
        "Run deploy/wheelhouse.sh on a host whose pip reaches an index, then build again." >&2
      exit 1
    }
    echo "rec image: installing the pinned stack from the wheelhouse (no network)"
    PIP+=(--no-index --find-links "$WHEELHOUSE")
    hint="the wheelhouse does not match requirements.txt: rerun deploy/wheelhouse.sh"
    ;;
  index)
    echo "rec image: installing the pinned stack from $TORCH_INDEX and $PYPI_INDEX"
    PIP+=(--index-url "$TORCH_INDEX" --extra-index-url "$PYPI_INDEX" --retries 1 --timeout 20)
    hint="no package index reachable from the build ($TORCH_INDEX, $PYPI_INDEX). Without a"
    hint+=" network, build from a wheelhouse: deploy/wheelhouse.sh, then docker build again"
    ;;
  *)
    echo "rec image: PIP_SOURCE=$SOURCE; expected auto, wheelhouse or index" >&2
    exit 1
    ;;
esac
fail() { echo "rec image: pip failed: $hint" >&2; exit 1; }
"${PIP[@]}" "setuptools>=68" wheel || fail
"${PIP[@]}" -r /tmp/requirements-image.txt || fail
# torchrec's metadata asks for the CUDA fbgemm-gpu; its real needs are in requirements.txt.
"${PIP[@]}" --no-deps torchrec==1.8.0 || fail
