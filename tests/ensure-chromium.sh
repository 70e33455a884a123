#!/usr/bin/env bash
# Make sure a headless Chromium is on PATH for the viewer's browser tests (tests/view/): when none
# is and we are root on Debian, install Debian's chromium package (apt), logging to
# $AGENTRL_APT_LOG. Idempotent and quiet: a machine that has one is left alone. Never downloads
# a browser build of its own (playwright drives this system browser by its path).
set -euo pipefail
LOG=${AGENTRL_APT_LOG:-/var/log/agentrl-apt.log}

have() { command -v chromium >/dev/null || command -v chromium-browser >/dev/null; }

if have; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
    echo "ensure-chromium: no chromium on PATH and this is not root; install Debian's chromium (apt-get install chromium)" >&2
    exit 1
fi
exec 9>/run/agentrl-chromium.lock
flock -w 600 9   # one installer at a time; the others wait and then find it installed
if have; then exit 0; fi
echo "ensure-chromium: installing chromium (log: $LOG)" >&2
if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 chromium; } >>"$LOG" 2>&1; then
    echo "ensure-chromium: apt-get install chromium failed; see $LOG" >&2
    tail -n 20 "$LOG" >&2 || true
    exit 1
fi
have
