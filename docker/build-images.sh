#!/usr/bin/env bash
# Build the deployment images of docker-compose.yml, cached: agentrl-trainer:cpu
# (docker/trainer.Dockerfile) and agentrl-sandbox-service:latest (docker/sandbox-service.Dockerfile).
# Nothing is rebuilt when both images exist and carry the hash of their inputs (the Dockerfiles,
# this script, pyproject.toml and every file of the project, committed or not, TORCH_SPEC).
# When something changed, Docker's layer cache still keeps the torch and dependency layers.
#
# The base: python:3.11-slim-bookworm where a registry answers, else agentrl-base:bookworm,
# imported from the debootstrap root filesystem the sandbox image is made of (docker/rootfs.sh,
# cached). pip inside the build reaches its index through the host's network (--network host).
# The CPU torch wheel is taken from this machine's pip configuration (find-links) when it has
# it on disk, else from PyTorch's CPU index inside the build.
set -euo pipefail
cd "$(dirname "$0")/.."
TRAINER=${AGENTRL_TRAINER_IMAGE:-agentrl-trainer:cpu}
SERVICE=${AGENTRL_SANDBOX_SERVICE_IMAGE:-agentrl-sandbox-service:latest}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
PYTHON=${PYTHON:-python3}
CACHE=${AGENTRL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrl}
LOG=${AGENTRL_IMAGE_LOG:-$CACHE/images.log}
mkdir -p "$CACHE"

# what goes into the images: the tracked and untracked-but-not-ignored files of the project
files() { git ls-files --cached --others --exclude-standard -- pyproject.toml README.md LICENSE \
            agentrl envs sandboxes workflows data docker/requirements.py | sort -u | while read -r f; do
            [ -f "$f" ] && echo "$f"; done; }
inputs_hash() {
    { echo "$TORCH_SPEC"; cat docker/trainer.Dockerfile docker/sandbox-service.Dockerfile docker/build-images.sh;
      files | tr '\n' '\0' | xargs -0 sha256sum; } | sha256sum | cut -c1-16
}
label_of() { docker image inspect -f '{{ index .Config.Labels "agentrl.inputs" }}' "$1" 2>/dev/null || true; }

HASH=$(inputs_hash)
if [ "$(label_of "$TRAINER")" = "$HASH" ] && [ "$(label_of "$SERVICE")" = "$HASH" ]; then exit 0; fi
exec 9>"$CACHE/images.lock"
flock -w 1800 9
if [ "$(label_of "$TRAINER")" = "$HASH" ] && [ "$(label_of "$SERVICE")" = "$HASH" ]; then exit 0; fi

BASE=python:3.11-slim-bookworm
if ! docker image inspect "$BASE" >/dev/null 2>&1 && \
   { [ "${AGENTRL_OFFLINE:-auto}" = 1 ] || ! timeout 20 docker pull -q "$BASE" >>"$LOG" 2>&1; }; then
    BASE=agentrl-base:bookworm
    if ! docker image inspect "$BASE" >/dev/null 2>&1; then
        TARBALL=$(docker/rootfs.sh)
        echo "build-images: importing $TARBALL as $BASE" >&2
        docker import --change 'CMD ["/usr/bin/python3"]' "$TARBALL" "$BASE" >/dev/null
    fi
fi

CONTEXT="$CACHE/image-context"
rm -rf "$CONTEXT" && mkdir -p "$CONTEXT/src" "$CONTEXT/dist" "$CONTEXT/wheels" "$CONTEXT/certs"
files | tar -cf - -T - | tar -xf - -C "$CONTEXT/src"
# the project's wheel, built once here for both images
if ! "$PYTHON" -m pip wheel -q --no-deps -w "$CONTEXT/dist" "$CONTEXT/src" >>"$LOG" 2>&1; then
    echo "build-images: building the project's wheel failed; the end of $LOG:" >&2
    tail -n 30 "$LOG" >&2
    exit 1
fi

# the CA bundle this machine's pip trusts (a TLS-intercepting proxy's CA included), for pip in the build
CERT_ARGS=()
CA=${PIP_CERT:-$("$PYTHON" -m pip config get global.cert 2>/dev/null || true)}
if [ -n "$CA" ] && [ -s "$CA" ]; then
    cp "$CA" "$CONTEXT/certs/ca-bundle.crt"
    CERT_ARGS=(--build-arg PIP_CERT=/tmp/certs/ca-bundle.crt)
fi

build() {  # image dockerfile
    local old
    old=$(docker image inspect -f '{{.Id}}' "$1" 2>/dev/null || true)
    echo "build-images: building $1 on $BASE (log: $LOG)" >&2
    if ! docker build --network host --force-rm -q --build-arg "BASE=$BASE" --build-arg "TORCH_SPEC=$TORCH_SPEC" "${CERT_ARGS[@]}" \
            --label "agentrl.inputs=$HASH" -t "$1" -f "$2" "$CONTEXT" >>"$LOG" 2>&1; then
        echo "build-images: building $1 failed; the end of $LOG:" >&2
        tail -n 30 "$LOG" >&2
        exit 1
    fi
    # the image this one replaces, unless a container still uses it (its layers stay shared)
    if [ -n "$old" ] && [ "$old" != "$(docker image inspect -f '{{.Id}}' "$1")" ]; then
        docker rmi "$old" >/dev/null 2>&1 || true
    fi
}
build "$SERVICE" docker/sandbox-service.Dockerfile
# the CPU torch wheel, when this machine's pip has it without any index (e.g. find-links); staged
# after the service's build, which has no use for it (the whole context goes to the engine)
"$PYTHON" -m pip download -q --no-deps --no-index --only-binary=:all: -d "$CONTEXT/wheels" "$TORCH_SPEC" \
    >>"$LOG" 2>&1 || echo "build-images: no local wheel for $TORCH_SPEC; the build takes it from PyTorch's CPU index" >&2
build "$TRAINER" docker/trainer.Dockerfile
rm -rf "$CONTEXT"
