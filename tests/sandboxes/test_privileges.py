"""What the supervisor holds, the rootless backend for a user without root, and the seccomp
filter on each architecture. Real jails (root and rootless), a real non-root process
(``setpriv`` to an unprivileged uid), libseccomp itself."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from agentrl.api import ExecRequest, ExecStatus
from agentrl.errors import SandboxUnavailable
from sandboxes import seccomp

pytestmark = pytest.mark.timeout(120)

NON_ROOT_UID = 64001  # a uid of its own (the rootless fixture's fork server runs as 64000)


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def _descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int(_status(pid)["PPid"])
        except (OSError, KeyError):
            return False
    return False


def _jail_pid1s(owner: int) -> list[int]:
    """Host pids of the jails' pid 1 (the supervisor) under the fork server ``owner``."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                status = _status(int(name))
            except OSError:
                continue
            nspid = status.get("NSpid", "").split()  # (bubblewrap's own init is a pid 1 too)
            if len(nspid) >= 2 and nspid[-1] == "1" and status["Name"] != "bwrap" and _descends_from(int(name), owner):
                found.append(int(name))
    return found


@pytest.fixture(params=[("local_sandbox", 0xE0), ("rootless_sandbox", 0)], ids=["root", "rootless"])
def jails(request):
    """(a LocalSandbox of each mode, the capability mask its jails' pid 1 keeps)."""
    name, kept = request.param
    return request.getfixturevalue(name), kept


async def test_the_supervisor_keeps_only_the_capabilities_it_needs(jails):
    """Root mode: SETUID, SETGID and KILL (bits 6, 7, 5), nothing else, not even in the
    bounding set; rootless: none at all (it shares the program's uid)."""
    sandbox, kept = jails
    await sandbox.start()
    run = asyncio.create_task(sandbox.run(ExecRequest(code="import time\ntime.sleep(3)", time_limit_s=10)))
    for _ in range(100):
        pids = _jail_pid1s(sandbox._proc.pid)
        if pids:
            break
        await asyncio.sleep(0.02)
    assert len(pids) == 1, pids
    status = _status(pids[0])
    assert {k: int(status[k], 16) for k in ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb")} == {
        "CapEff": kept, "CapPrm": kept, "CapInh": 0, "CapBnd": kept, "CapAmb": 0}, status
    assert (await run).status is ExecStatus.OK


def test_a_user_without_root_gets_rootless_jails(helpers):
    """`agentrl sandbox run` started by an unprivileged uid picks the rootless mode by itself."""
    prog = "import os, socket\nprint(os.getuid(), socket.gethostname(), len(os.listdir('/proc/self/task')))\n"
    out = subprocess.run(
        ["setpriv", f"--reuid={NON_ROOT_UID}", f"--regid={NON_ROOT_UID}", "--clear-groups", "--inh-caps=-all",
         sys.executable, "-m", "agentrl.cli", "sandbox", "run", "--python", helpers.rootless_python, "-"],
        input=prog, capture_output=True, text=True, cwd=helpers.repo, timeout=90, env={"PATH": os.environ["PATH"]})
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout)
    assert (result["status"], result["stdout"]) == ("ok", "1000 sandbox 1\n"), result


async def test_rootless_without_bubblewrap_says_how_to_get_it(monkeypatch):
    from sandboxes.local import LocalSandbox

    monkeypatch.setenv("PATH", "/nonexistent")
    sandbox = LocalSandbox(mode="rootless")
    with pytest.raises(SandboxUnavailable, match="needs bubblewrap: install it"):
        await sandbox.run(ExecRequest(code="pass"))


def test_the_filter_is_built_for_each_architecture_by_name():
    """libseccomp translates the names: the same rules carry each machine's own numbers,
    behind its own architecture check."""
    x86 = seccomp.describe("x86_64")
    arm = seccomp.describe("aarch64")
    for pfc, arch, numbers in ((x86, "x86_64", {"unshare": 272, "clone": 56, "ptrace": 101, "bpf": 321}),
                               (arm, "aarch64", {"unshare": 97, "clone": 220, "ptrace": 117, "bpf": 280})):
        assert f"# filter for arch {arch} " in pfc, pfc[:200]
        for name, nr in numbers.items():
            assert f'syscall "{name}" ({nr})' in pfc, (arch, name)
        assert "action KILL_PROCESS;" in pfc.split("# invalid architecture action")[1]
    bpf = seccomp.program_filter()
    assert len(bpf) % 8 == 0 and len(bpf) // 8 > len(seccomp.DENIED) // 2


def test_a_checkout_under_tmp_stays_visible_in_the_rootless_jail(tmp_path):
    """bwrap mounts in argument order: the jail's fresh /tmp must come before the binds of the
    fork server's own files, or a checkout under /tmp (a CI clone) is hidden by it."""
    from sandboxes.local import HERE, bwrap_argv

    argv = bwrap_argv("/usr/bin/bwrap", "/tmp/some-python")
    tmpfs = argv.index("/tmp", argv.index("--tmpfs"))
    binds = [i for i, a in enumerate(argv) if a == "--ro-bind" and argv[i + 1] in (HERE, "/tmp/some-python")]
    assert len(binds) == 2 and all(i > tmpfs for i in binds)
