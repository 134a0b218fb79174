#!/usr/bin/env bash
# A local stand-in for python:3.11-slim-bookworm, built from Debian's own packages when Docker Hub
# is out of reach: debootstrap bookworm (minbase) with Debian's python3.11 and venv, then
# `docker import`. Root, debootstrap and a Debian mirror over http are all it needs.
#   deploy/build_base.sh [IMAGE]     (default rec-base:bookworm; kept if it already exists)
set -euo pipefail
IMAGE=${1:-rec-base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
log() { printf '\033[1m[base]\033[0m %s\n' "$*"; }

if docker image inspect "$IMAGE" > /dev/null 2>&1; then
  log "$IMAGE exists; kept"
  exit 0
fi
[ "$(id -u)" -eq 0 ] || { echo "deploy/build_base.sh: debootstrap needs root (run with sudo)" >&2; exit 1; }
command -v debootstrap > /dev/null || { echo "deploy/build_base.sh: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }

ROOTFS=$(mktemp -d /var/tmp/rec-base.XXXXXX)
trap 'rm -rf "$ROOTFS"' EXIT
log "debootstrap bookworm from $MIRROR into $ROOTFS (a few minutes)"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$ROOTFS" "$MIRROR" > "$ROOTFS.log" 2>&1 \
  || { tail -20 "$ROOTFS.log"; echo "deploy/build_base.sh: debootstrap failed (log: $ROOTFS.log)" >&2; exit 1; }
# What an image's apt needs and nothing else: no package caches or lists in the layer.
echo "deb $MIRROR bookworm main" > "$ROOTFS/etc/apt/sources.list"
echo "deb $MIRROR bookworm-updates main" >> "$ROOTFS/etc/apt/sources.list"
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
log "docker import -> $IMAGE"
tar -C "$ROOTFS" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$IMAGE" > /dev/null
rm -f "$ROOTFS.log"
log "$IMAGE: $(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"
