#!/usr/bin/env bash
# Make sure the local sandbox's tools are here: bubblewrap (`bwrap`, the rootless jails'
# outer boundary) and libseccomp (compiles every program's seccomp filter). When one is
# missing and we are root on Debian/Ubuntu, install it with apt (log: $AGENTRL_TOOLS_LOG).
# Idempotent. Then check that an unprivileged user may create user namespaces here.
set -euo pipefail
LOG=${AGENTRL_TOOLS_LOG:-/var/log/agentrl-sandbox-tools.log}

have_seccomp() { ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2'; }

missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
have_seccomp || missing+=(libseccomp2)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "ensure-sandbox-tools: missing ${missing[*]}; install them with your package manager" >&2
        exit 1
    fi
    echo "ensure-sandbox-tools: installing ${missing[*]} (log: $LOG)" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >>"$LOG" 2>&1
fi
# Rootless jails need unprivileged user namespaces (some distributions turn them off).
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
    if ! setpriv --reuid=65534 --regid=65534 --clear-groups bwrap --unshare-user --ro-bind / / true 2>>"$LOG"; then
        echo "ensure-sandbox-tools: an unprivileged user cannot create a user namespace here" \
             "(sysctl kernel.unprivileged_userns_clone / user.max_user_namespaces, or AppArmor's" \
             "kernel.apparmor_restrict_unprivileged_userns); rootless LocalSandbox will not work" >&2
        exit 1
    fi
fi
