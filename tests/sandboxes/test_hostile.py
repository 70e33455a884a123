"""Hostile programs, on every backend (local jail, Docker pool, the sandbox service).

Each case names the status it must end with and, where it matters, what else must hold
(output capped, nothing fetched through a link, no connection reached the host). After
every case the host is checked — the canary process lives, the host file is unchanged, no
process of a sandbox uid survives on the host, the test cgroup is not near its limits —
and the next execution on the same sandbox must still work.

Limits are kept small (128 MB; 1 s where a timeout is expected, 5 s elsewhere so a busy
machine cannot turn a pass into a timeout) so the file takes well under a minute per backend.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from agentrl.api import ExecRequest, ExecResult, ExecStatus

pytestmark = pytest.mark.timeout(120)


@dataclass
class Case:
    name: str
    code: str
    expect: ExecStatus
    request: dict[str, Any] = field(default_factory=dict)
    check: Callable[[ExecResult, dict[str, Any]], None] | None = None


def _zip_bomb() -> str:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for i in range(3):  # 3 x 48 MB of zeros: ~150 KB compressed, more than the 64 MB work dir
            z.writestr(f"zeros{i}.bin", b"\0" * (48 << 20))
    return base64.b64encode(buf.getvalue()).decode()


ZIP_BOMB = _zip_bomb()


def _no_fetch_of_link(r: ExecResult, ctx: dict[str, Any]) -> None:
    assert "escape" not in r.files and "shadow" not in r.files, r.files
    assert "denied-all" in r.stdout, r.stdout + r.stderr


def _host_file_not_read(r: ExecResult, ctx: dict[str, Any]) -> None:
    assert ctx["secret"] not in r.stdout + r.stderr
    assert "denied-all" in r.stdout, r.stdout + r.stderr


def _no_env_leak(r: ExecResult, ctx: dict[str, Any]) -> None:
    assert ctx["secret"] not in r.stdout
    env = eval(r.stdout)  # a dict literal the program printed
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING", "PWD"}, env


def _output_capped(r: ExecResult, ctx: dict[str, Any]) -> None:
    assert r.stdout_truncated and len(r.stdout) == 4096
    assert r.wall_s < 5, "a flood is cut at the cap, not run to the time limit"


CASES = [
    Case("fork_bomb", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
         ExecStatus.TIMEOUT, {"time_limit_s": 1}),
    Case("memory_bomb", "chunks = []\nwhile True:\n    chunks.append(bytearray(8 << 20))\n", ExecStatus.MEMORY),
    Case("infinite_loop", "while True:\n    pass\n", ExecStatus.TIMEOUT, {"time_limit_s": 1}),
    Case("busy_c_call", "import re\nre.match(r'(a+)+$', 'a' * 64 + 'b')\n", ExecStatus.TIMEOUT, {"time_limit_s": 1}),
    Case("huge_pow", "x = pow(7, 10**9)\n", ExecStatus.TIMEOUT, {"time_limit_s": 1}),
    Case("stdout_flood_100mb", "import sys\nblock = 'x' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.write(block)\n",
         ExecStatus.OUTPUT_LIMIT, {"output_limit_bytes": 4096}, _output_capped),
    Case("write_system_paths",
         "import os\nok = []\nfor p in ['/etc/passwd', '/usr/evil', '/evil', '/root/evil', '/proc/sys/kernel/hostname',"
         " os.environ.get('HOST_FILE', '/nonexistent/x')]:\n    try:\n        open(p, 'a').write('pwned')\n"
         "        ok.append(p)\n    except OSError:\n        pass\nprint('written:', ok)\nassert not ok\n",
         ExecStatus.OK),
    Case("fill_disk",
         "import errno\ntry:\n    with open('big', 'wb') as f:\n        while True:\n            f.write(b'\\0' * (1 << 20))\n"
         "            f.flush()\nexcept OSError as e:\n    print('stopped', errno.errorcode[e.errno])\n",
         ExecStatus.OK, {"memory_limit_mb": 256}, lambda r, c: (
             assert_in(r.stdout, ("stopped ENOSPC", "stopped EFBIG")))),
    Case("loopback_socket",
         "import socket, sys\nport = int(sys.stdin.read())\ns = socket.socket()\ns.settimeout(1)\n"
         "try:\n    s.connect(('127.0.0.1', port))\n    print('connected')\nexcept OSError as e:\n    print('refused', e.errno)\n",
         ExecStatus.OK, {}, lambda r, c: assert_in(r.stdout, ("refused",))),
    Case("outside_address",
         # with any interface but lo the jail is broken: then fail without sending anything
         "import errno, socket, sys, time\nnames = [n for _, n in socket.if_nameindex()]\n"
         "if names != ['lo']:\n    sys.exit(f'network interfaces visible: {names}')\n"
         "s = socket.socket()\ns.settimeout(2)\nt = time.monotonic()\ntry:\n    s.connect(('192.0.2.1', 80))\n"
         "    print('connected')\nexcept OSError as e:\n    print('failed', errno.errorcode.get(e.errno), round(time.monotonic() - t, 3))\n",
         ExecStatus.OK, {}, lambda r, c: assert_in(r.stdout, ("failed ENETUNREACH",))),
    Case("host_env", "import os\nprint(dict(os.environ))\n", ExecStatus.OK, {}, _no_env_leak),
    Case("host_files",
         "import os\nhits = []\nfor p in ['/etc/shadow', '/root/.bashrc', os.environ.get('X', ''), '/proc/1/environ',"
         " '/proc/1/root/etc/shadow'] + open(0).read().split():\n    try:\n        hits.append(open(p).read()[:80])\n"
         "    except (OSError, ValueError):\n        pass\nprint(hits)\nif not any('agentrl-secret' in h for h in hits):\n"
         "    print('denied-all')\n",
         ExecStatus.OK, {}, _host_file_not_read),
    Case("signal_canary",
         "import os, signal, sys\npid = int(sys.stdin.read())\ntry:\n    os.kill(pid, signal.SIGKILL)\n    print('sent')\n"
         "except OSError as e:\n    print('denied', e.errno)\n",
         ExecStatus.OK, {}, lambda r, c: assert_in(r.stdout, ("denied",))),
    Case("kill_parent",
         "import os, signal\nfor pid in (os.getppid(), 1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
         "    except OSError as e:\n        print('denied', pid, e.errno)\nprint('still here')\n",
         ExecStatus.OK, {}, lambda r, c: assert_in(r.stdout, ("still here",))),
    Case("leave_daemon",
         "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.close(1); os.close(2)\n"
         "        while True:\n            time.sleep(0.1)\n    os._exit(0)\nos.wait()\nprint('parent done')\n",
         ExecStatus.OK, {}, lambda r, c: assert_in(r.stdout, ("parent done",))),
    Case("os_exit_early", "import os\nprint('buffered, lost')\nos._exit(0)\n", ExecStatus.OK, {},
         lambda r, c: (assert_eq(r.exit_code, 0), assert_eq(r.stdout, ""))),
    Case("deep_recursion", "def f(n):\n    return f(n + 1) + 1\nf(0)\n", ExecStatus.RUNTIME_ERROR, {},
         lambda r, c: assert_in(r.stderr, ("RecursionError",))),
    Case("c_stack_overflow",  # recursion in C (repr of deeply nested lists) past the C stack
         "import sys, threading\nsys.setrecursionlimit(10**6)\nthreading.stack_size(512 * 1024)\nl = []\n"
         "for _ in range(50000):\n    l = [l]\nt = threading.Thread(target=lambda: print(len(repr(l))))\n"
         "t.start()\nt.join()\n",
         ExecStatus.RUNTIME_ERROR, {}, lambda r, c: assert_eq(r.signal, 11)),
    Case("zip_bomb_upload",
         "import errno, zipfile\ntry:\n    zipfile.ZipFile('bomb.zip').extractall('out')\n    print('extracted')\n"
         "except OSError as e:\n    print('stopped', errno.errorcode[e.errno])\n",
         ExecStatus.OK, {"files_b64": {"bomb.zip": ZIP_BOMB}, "memory_limit_mb": 256},
         lambda r, c: assert_in(r.stdout, ("stopped ENOSPC", "stopped EFBIG"))),
    Case("symlink_escape",
         "import os\nos.symlink('/etc/shadow', 'shadow')\nos.symlink('/', 'escape')\n"
         "try:\n    open('escape/etc/shadow').read()\n    print('read')\nexcept OSError:\n    print('denied-all')\n",
         ExecStatus.OK, {"fetch": ["shadow", "escape"]}, _no_fetch_of_link),
    Case("long_stdin_and_argv",
         "import subprocess, sys\ndata = sys.stdin.read()\nprint(len(data))\ntry:\n"
         "    subprocess.run(['/bin/true', 'x' * (1 << 20)])\nexcept OSError as e:\n    print('argv refused', e.errno)\n",
         ExecStatus.OK, {"stdin": "y" * (8 << 20)},
         lambda r, c: (assert_in(r.stdout, (str(8 << 20),)), assert_in(r.stdout, ("argv refused",)))),
    Case("non_utf8_output", "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe\\x80abc\\n')\n", ExecStatus.OK, {},
         lambda r, c: (assert_in(r.stdout, ("abc",)), assert_in(r.stdout, ("\ufffd",)))),
    Case("close_stdout_keep_running", "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(30)\n",
         ExecStatus.TIMEOUT, {"time_limit_s": 1}),
    Case("setuid_root", "import os\ntry:\n    os.setuid(0)\n    print('root')\nexcept PermissionError:\n    print('denied')\n",
         ExecStatus.OK, {}, lambda r, c: assert_eq(r.stdout.strip(), "denied")),
    Case("trace_the_executor",
         "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nres = []\n"
         "res.append(libc.ptrace(16, os.getppid(), 0, 0) == -1)  # PTRACE_ATTACH\n"
         "try:\n    open(f'/proc/{os.getppid()}/mem', 'rb').read(1)\n    res.append(False)\n"
         "except OSError:\n    res.append(True)\nprint('denied' if all(res) else f'traced {res}')\n",
         ExecStatus.OK, {}, lambda r, c: assert_eq(r.stdout.strip(), "denied")),
    Case("raise_own_limits",
         "import resource\ntry:\n    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)\n"
         "    print('raised')\nexcept (ValueError, OSError):\n    print('denied')\n",
         ExecStatus.OK, {}, lambda r, c: assert_eq(r.stdout.strip(), "denied")),
    # the script itself returns at once; the bomb it left running in the background must die
    Case("bash_fork_bomb", ":(){ :|:& };:\n", ExecStatus.OK, {"language": "bash", "time_limit_s": 1}),
]


def assert_in(text: str, needles: tuple[str, ...]) -> None:
    assert any(n in text for n in needles), f"expected one of {needles} in {text!r}"


def assert_eq(a: Any, b: Any) -> None:
    assert a == b, f"{a!r} != {b!r}"


def assert_true(cond: bool, info: Any) -> None:
    assert cond, info


def _stdin_for(case: Case, ctx: dict[str, Any]) -> str:
    if case.name == "loopback_socket":
        return str(ctx["port"])
    if case.name == "signal_canary":
        return str(ctx["canary"])
    if case.name == "host_files":
        return ctx["host_file"]
    return ""


@pytest.fixture(scope="module")
def host_file(tmp_path_factory):
    """A host file holding a secret: no program may read or change it."""
    path = tmp_path_factory.mktemp("host") / "secret.txt"
    path.write_text("agentrl-secret-" + os.urandom(8).hex())
    return path


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_hostile_program(sandbox, case, canary, loopback_listener, host_file, sandbox_uid_processes,
                               test_cgroup, helpers, monkeypatch):
    monkeypatch.setenv("AGENTRL_TEST_SECRET", host_file.read_text())
    before = hashlib.sha256(host_file.read_bytes()).hexdigest()
    ctx = {"port": loopback_listener.getsockname()[1], "canary": canary.pid, "host_file": str(host_file),
           "secret": host_file.read_text()}
    kwargs = {"time_limit_s": 5.0, "memory_limit_mb": 128, **case.request}  # the TIMEOUT cases set 1 s
    stdin = kwargs.pop("stdin", None) or _stdin_for(case, ctx)
    files_b64 = kwargs.pop("files_b64", {})
    request = ExecRequest(code=case.code, stdin=stdin, files_b64=files_b64, **kwargs)
    result = await sandbox.run(request)

    assert result.status is case.expect, (
        f"{case.name}: expected {case.expect.value}, got {result.status.value}\n"
        f"exit={result.exit_code} signal={result.signal} error={result.error}\n"
        f"stdout={result.stdout[-500:]!r}\nstderr={result.stderr[-800:]!r}"
    )
    if case.check is not None:
        case.check(result, ctx)

    # the host is unaffected
    assert canary.poll() is None, "the canary process was killed"
    assert hashlib.sha256(host_file.read_bytes()).hexdigest() == before, "the host file changed"
    with pytest.raises(TimeoutError):  # nobody reached the host's loopback listener
        conn, _ = loopback_listener.accept()
        conn.close()
    for _ in range(60):  # a jail's last processes die with it, a moment after the reply
        if not (left := sandbox_uid_processes()):
            break
        await asyncio.sleep(0.05)
    assert not left, f"sandboxed processes outlived their run: {left}"
    assert helpers.cgroup_pressure(test_cgroup) == {"memory": 0, "pids": 0}, "a jail let the test cgroup fill up"

    # and the next execution works
    after = await sandbox.run(ExecRequest(code="print(6 * 7)", time_limit_s=5, memory_limit_mb=128))
    assert after.status is ExecStatus.OK and after.stdout == "42\n", after
