#!/usr/bin/env bash
# Build the sandbox image once (cached: nothing happens when it exists).
# With a reachable registry: `docker build -f docker/sandbox.Dockerfile`. Without one (these
# machines): a Debian root filesystem made by debootstrap, from the mirror in this machine's
# own apt sources, imported with `docker import`. The root filesystem tarball is cached too.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${AGENTRL_SANDBOX_IMAGE:-agentrl-sandbox:latest}
CACHE=${AGENTRL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrl}
LOG=${AGENTRL_IMAGE_LOG:-$CACHE/sandbox-image.log}
mkdir -p "$CACHE"

if docker image inspect "$IMAGE" >/dev/null 2>&1; then exit 0; fi
exec 9>"$CACHE/sandbox-image.lock"
flock -w 900 9
if docker image inspect "$IMAGE" >/dev/null 2>&1; then exit 0; fi

if [ "${AGENTRL_OFFLINE:-auto}" != 1 ] && timeout 20 docker pull -q python:3.11-slim-bookworm >>"$LOG" 2>&1; then
    echo "build-sandbox-image: building $IMAGE from docker/sandbox.Dockerfile" >&2
    docker build -q -t "$IMAGE" -f docker/sandbox.Dockerfile docker >>"$LOG"
    exit 0
fi

TARBALL="$CACHE/sandbox-rootfs.tar"
if [ ! -s "$TARBALL" ]; then
    # The mirror comes from this machine's apt sources (never from the repository).
    MIRROR=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | grep -v '^\s*#' | grep -oE '(https?|file)://[^ ]+' | grep -v -- '-security' | head -n 1 || true)
    SUITE=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-bookworm}")
    if [ -z "$MIRROR" ]; then
        echo "build-sandbox-image: no registry and no apt mirror in /etc/apt/sources*; cannot build $IMAGE" >&2
        exit 1
    fi
    if ! command -v debootstrap >/dev/null; then
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap; } >>"$LOG" 2>&1
    fi
    ROOTFS=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    trap 'rm -rf "$ROOTFS"' EXIT
    echo "build-sandbox-image: debootstrap $SUITE (log: $LOG)" >&2
    debootstrap --variant=minbase --include=python3 "$SUITE" "$ROOTFS" "$MIRROR" >>"$LOG" 2>&1
    # What sandbox.Dockerfile does: the sandbox user and the work dir; apt caches dropped.
    echo "sandbox:x:10000:10000::/work:/bin/bash" >>"$ROOTFS/etc/passwd"
    echo "sandbox:x:10000:" >>"$ROOTFS/etc/group"
    mkdir -p "$ROOTFS/work" && chmod 1777 "$ROOTFS/work"
    rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
    tar -C "$ROOTFS" -cf "$TARBALL.tmp" . && mv "$TARBALL.tmp" "$TARBALL"
fi
echo "build-sandbox-image: importing $TARBALL as $IMAGE" >&2
docker import \
    --change 'LABEL agentrl.sandbox.image=1' \
    --change 'ENV SANDBOX_PYTHON=/usr/bin/python3' \
    --change 'WORKDIR /work' \
    --change 'CMD ["/usr/bin/python3"]' \
    "$TARBALL" "$IMAGE" >/dev/null
