#!/usr/bin/env bash
# Make sure a Docker engine answers. When none does and we are root on Debian, install
# docker.io (apt) and start dockerd in the background, logging to $AGENTRL_DOCKERD_LOG.
# Idempotent: a running engine (or DOCKER_HOST pointing at one, podman included) is left alone.
set -euo pipefail
LOG=${AGENTRL_DOCKERD_LOG:-/var/log/agentrl-dockerd.log}
WAIT_S=${AGENTRL_DOCKERD_WAIT_S:-90}

answers() { timeout 10 docker info >/dev/null 2>&1; }

if command -v docker >/dev/null && answers; then exit 0; fi
if [ -n "${DOCKER_HOST:-}" ]; then
    echo "ensure-engine: DOCKER_HOST=$DOCKER_HOST does not answer; start that engine" >&2
    exit 1
fi
if [ "$(id -u)" != 0 ]; then
    echo "ensure-engine: no Docker engine answers and this is not root; start one or set DOCKER_HOST" >&2
    exit 1
fi
exec 9>/run/agentrl-dockerd.lock
flock -w "$WAIT_S" 9   # one starter at a time; the others wait and then find it running
if answers; then exit 0; fi
if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null; then
    echo "ensure-engine: installing docker.io (log: $LOG)" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io; } >>"$LOG" 2>&1
fi
if ! pgrep -x dockerd >/dev/null; then
    echo "ensure-engine: starting dockerd (log: $LOG)" >&2
    nohup dockerd >>"$LOG" 2>&1 </dev/null &
fi
for _ in $(seq 1 "$WAIT_S"); do
    if answers; then exit 0; fi
    sleep 1
done
echo "ensure-engine: dockerd did not answer within ${WAIT_S}s; see $LOG" >&2
tail -n 20 "$LOG" >&2 || true
exit 1
