#!/usr/bin/env bash
# Build the sandbox image once (cached: nothing happens when it exists).
# With a reachable registry: `docker build -f docker/sandbox.Dockerfile`. Without one (these
# machines): a Debian root filesystem made by debootstrap, from the mirror in this machine's
# own apt sources (docker/rootfs.sh, cached), imported with `docker import`.
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

TARBALL=$(docker/rootfs.sh)
echo "build-sandbox-image: importing $TARBALL as $IMAGE" >&2
docker import \
    --change 'LABEL agentrl.sandbox.image=1' \
    --change 'ENV SANDBOX_PYTHON=/usr/bin/python3' \
    --change 'WORKDIR /work' \
    --change 'CMD ["/usr/bin/python3"]' \
    "$TARBALL" "$IMAGE" >/dev/null
