#!/usr/bin/env bash
# The offline base of our images: a Debian root filesystem (debootstrap --variant=minbase with
# python3) made once from the mirror in this machine's own apt sources, cached as a tarball.
# Prints the tarball's path. build-sandbox-image.sh imports it as the sandbox image, and
# build-images.sh as the base of the trainer and sandbox-service images when no registry answers.
set -euo pipefail
CACHE=${AGENTRL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrl}
LOG=${AGENTRL_IMAGE_LOG:-$CACHE/sandbox-image.log}
TARBALL="$CACHE/sandbox-rootfs.tar"
mkdir -p "$CACHE"
exec 8>"$CACHE/rootfs.lock"
flock -w 900 8
if [ -s "$TARBALL" ]; then echo "$TARBALL"; exit 0; fi

# The mirror comes from this machine's apt sources (never from the repository).
MIRROR=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
    | grep -v '^\s*#' | grep -oE '(https?|file)://[^ ]+' | grep -v -- '-security' | head -n 1 || true)
SUITE=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-bookworm}")
if [ -z "$MIRROR" ]; then
    echo "rootfs: no registry and no apt mirror in /etc/apt/sources*; cannot build a base image" >&2
    exit 1
fi
if ! command -v debootstrap >/dev/null; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap; } >>"$LOG" 2>&1
fi
ROOTFS=$(mktemp -d "$CACHE/rootfs.XXXXXX")
trap 'rm -rf "$ROOTFS"' EXIT
echo "rootfs: debootstrap $SUITE (log: $LOG)" >&2
debootstrap --variant=minbase --include=python3 "$SUITE" "$ROOTFS" "$MIRROR" >>"$LOG" 2>&1
# What sandbox.Dockerfile does: the sandbox user and the work dir; apt caches dropped.
echo "sandbox:x:10000:10000::/work:/bin/bash" >>"$ROOTFS/etc/passwd"
echo "sandbox:x:10000:" >>"$ROOTFS/etc/group"
mkdir -p "$ROOTFS/work" && chmod 1777 "$ROOTFS/work"
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
tar -C "$ROOTFS" -cf "$TARBALL.tmp" . && mv "$TARBALL.tmp" "$TARBALL"
echo "$TARBALL"
