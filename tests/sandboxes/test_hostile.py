"""Hostile programs, on every backend (local jail as root and rootless, Docker pool, the
sandbox service).

Each case names the status it must end with and, where it matters, what else must hold
(output capped, nothing fetched through a link, no connection reached the host, every
forbidden system call refused). After every case the host is checked — the canary process
lives, the host file is unchanged, no process of a sandbox uid survives on the host, the test
cgroup is not near its limits — and the next execution on the same sandbox must still work.
The session attacks (a background thread racing the supervisor's file I/O, background work
between calls) follow the single-run cases.

Limits are kept small (128 MB; 1 s where a timeout is expected, 5 s elsewhere so a busy
machine cannot turn a pass into a timeout) so the file takes well under a minute per backend.
"""

from __future__ import annotations

import ast
import asyncio
import base64
import hashlib
import io
import json
import os
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from agentrl.api import ExecRequest, ExecResult, ExecStatus
from sandboxes import seccomp

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


def _printed(r: ExecResult) -> Any:
    """The Python literal the program printed last."""
    return ast.literal_eval(r.stdout.strip().splitlines()[-1])


def _no_outside_reads(r: ExecResult, ctx: dict[str, Any]) -> None:
    got = _printed(r)
    assert not [k for k, v in got.items() if v == "read"], got
    assert got["self-mem-file-unchanged"] is True, got


def _syscalls_denied(r: ExecResult, ctx: dict[str, Any]) -> None:
    got = _printed(r)
    expected = {name: ("ENOSYS" if name == "clone3" else "EPERM") for name in got if name != "unshare-binary"}
    assert {k: v for k, v in got.items() if k in expected} == expected, got
    assert got.get("unshare-binary") in (None, "refused"), got


# One probe per call the filter denies, with harmless arguments: unfiltered, each would
# fail differently (EBADF, EFAULT, ESRCH, EINVAL) or do nothing harmful (process_vm_readv
# of zero bytes from itself succeeds, clone of a user namespace forks), so EPERM is the
# filter's answer. Numbers come from libseccomp on the host (same architecture).
SYSCALL_PROBES = {
    "unshare": "(0x10000000,)", "setns": "(-1, 0)", "mount": "(None, None, None, 0, None)",
    "umount2": "(b'/nonexistent', 0)", "pivot_root": "(None, None)", "ptrace": "(2, 1, 0, 0)",
    "process_vm_readv": "(os.getpid(), None, 0, None, 0, 0)", "bpf": "(0, None, 0)",
    "perf_event_open": "(None, 0, -1, -1, 0)", "keyctl": "(0, 0, 0, 0, 0)", "add_key": "(None, None, None, 0, 0)",
    "userfaultfd": "(0,)", "io_uring_setup": "(0, None)", "init_module": "(None, 0, None)",
    "kexec_load": "(0, 0, None, 0)", "reboot": "(0, 0, 0, None)", "open_by_handle_at": "(-1, None, 0)",
    "clone": "(0x10000000 | 17, 0, 0, 0, 0)", "clone3": "(None, 0)", "prlimit64": "(1, 7, None, None)",
}
SYSCALL_PROGRAM = """
import ctypes, errno, json, os, shutil, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
numbers = json.loads(sys.stdin.read())
out = {}
for name, args in PROBES.items():
    if numbers.get(name, -1) < 0:
        continue
    ctypes.set_errno(0)
    ret = libc.syscall(numbers[name], *eval(args))
    if ret == 0 and name == "clone":  # the filter let a user namespace be made: say so and stop here
        os._exit(0)
    out[name] = "ok" if ret >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
if shutil.which("unshare"):
    p = subprocess.run(["unshare", "-U", "-r", "true"], capture_output=True)
    out["unshare-binary"] = "ran" if p.returncode == 0 else "refused"
print(out)
""".replace("PROBES", repr(SYSCALL_PROBES))


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
         " '/proc/sys/kernel/core_pattern', '/proc/sysrq-trigger', '/proc/1/oom_score_adj',"
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
    Case("setuid_root", "import os\ntry:\n    os.setuid(0)\n    print('root')\nexcept OSError:\n    print('denied')\n",
         ExecStatus.OK, {}, lambda r, c: assert_eq(r.stdout.strip(), "denied")),
    Case("trace_the_supervisor",
         "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nres = []\n"
         "res.append(libc.ptrace(16, os.getppid(), 0, 0) == -1)  # PTRACE_ATTACH\n"
         "try:\n    open(f'/proc/{os.getppid()}/mem', 'rb').read(1)\n    res.append(False)\n"
         "except OSError:\n    res.append(True)\nprint('denied' if all(res) else f'traced {res}')\n",
         ExecStatus.OK, {}, lambda r, c: assert_eq(r.stdout.strip(), "denied")),
    Case("raise_own_limits",
         "import resource\ntry:\n    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)\n"
         "    print('raised')\nexcept (ValueError, OSError):\n    print('denied')\n",
         ExecStatus.OK, {}, lambda r, c: assert_eq(r.stdout.strip(), "denied")),
    # the script itself returns at once (its one fork happens before the bomb fills the
    # process limit); the bomb it left running in the background must die
    Case("bash_fork_bomb", "( :(){ :|:& };: ) &\necho started\n", ExecStatus.OK, {"language": "bash", "time_limit_s": 1},
         lambda r, c: assert_eq(r.stdout, "started\n")),
    # links at every depth of a fetched name: to /proc (the supervisor's environment and
    # memory, the kernel's symbols), /etc, and a file; the supervisor must follow none
    Case("fetch_through_links_at_every_depth",
         "import os\nos.symlink('/proc', 'proc')\nos.symlink('/proc/1', 'one')\nos.makedirs('a/b')\n"
         "os.symlink('/proc/self', 'a/b/self')\nos.symlink('/etc', 'a/etc')\nos.symlink('/etc/passwd', 'a/b/passwd')\n"
         "os.symlink('/proc/1/root/etc', 'a/b/root')\nprint('planted')\n",
         ExecStatus.OK, {"fetch": ["proc/kallsyms", "proc/1/environ", "proc/1/status", "one/environ", "one/mem",
                                   "a/b/self/environ", "a/b/self/status", "a/etc/passwd", "a/b/passwd",
                                   "a/b/root/hostname", "proc/self/mem"]},
         lambda r, c: assert_eq(r.files, {})),
    Case("hard_links_to_outside_files",
         "import errno, os\nopen('/tmp/mine', 'w').write('tmp')\nres = []\n"
         "for i, src in enumerate(['/etc/passwd', '/usr/bin/env', '/etc/hostname', '/tmp/mine']):\n"
         "    try:\n        os.link(src, f'h{i}')\n        res.append('linked ' + src)\n"
         "    except OSError as e:\n        res.append(errno.errorcode[e.errno])\nprint(res)\n",
         ExecStatus.OK, {"fetch": ["h0", "h1", "h2", "h3"]},
         lambda r, c: (assert_eq(r.files, {}), assert_true("linked" not in r.stdout, r.stdout))),
    Case("fifo_socket_and_device_in_fetch",  # a FIFO with a writer behind it must not block or be read
         "import os, socket, time\nos.mkfifo('fifo')\nsocket.socket(socket.AF_UNIX).bind('sock')\n"
         "try:\n    os.mknod('null', 0o20666, os.makedev(1, 3))\n    print('mknod ok')\n"
         "except OSError as e:\n    print('mknod refused', e.errno)\nos.symlink('/dev/zero', 'zero')\n"
         "if os.fork() == 0:\n    fd = os.open('fifo', os.O_RDWR)\n    os.write(fd, b'x' * 100)\n    time.sleep(30)\n"
         "print('done')\n",
         ExecStatus.OK, {"fetch": ["fifo", "sock", "null", "zero"]},
         lambda r, c: (assert_eq(r.files, {}), assert_in(r.stdout, ("mknod refused",)),
                       assert_true(r.wall_s < 5, r.wall_s))),
    Case("forbidden_system_calls", SYSCALL_PROGRAM, ExecStatus.OK, {}, _syscalls_denied),
    Case("other_processes_memory_and_own_mem_file",
         "import errno, os\nres = {}\nfor t in ['/proc/1/mem', f'/proc/{os.getppid()}/mem', '/proc/1/environ',"
         " f'/proc/{os.getppid()}/environ', '/proc/1/fd', '/proc/1/root/etc/hostname', '/proc/1/cwd/x', '/proc/1/maps']:\n"
         "    try:\n        os.listdir(t) if t.endswith('fd') else open(t, 'rb').read(16)\n        res[t] = 'read'\n"
         "    except OSError as e:\n        res[t] = errno.errorcode[e.errno]\n"
         # its own read-only mapping of the interpreter, through /proc/self/mem: at most its private copy changes
         "exe = os.readlink('/proc/self/exe')\nbefore = open(exe, 'rb').read(64)\n"
         "start = next(int(l.split('-')[0], 16) for l in open('/proc/self/maps') if ' r--p ' in l and l.rstrip().endswith(exe))\n"
         "try:\n    with open('/proc/self/mem', 'r+b', buffering=0) as m:\n        m.seek(start)\n        m.write(b'XXXX')\n"
         "    res['self-mem'] = 'written'\nexcept OSError as e:\n    res['self-mem'] = errno.errorcode[e.errno]\n"
         "res['self-mem-file-unchanged'] = open(exe, 'rb').read(64) == before\nprint(res)\n",
         ExecStatus.OK, {}, _no_outside_reads),
    Case("core_dump",
         "import ctypes, os, resource\ntry:\n    resource.setrlimit(resource.RLIMIT_CORE, (1 << 30, 1 << 30))\n"
         "    print('raised')\nexcept (ValueError, OSError):\n    print('core limit fixed')\npid = os.fork()\n"
         "if pid == 0:\n    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)\n    os.abort()\n_, status = os.waitpid(pid, 0)\n"
         "print('signal', os.WTERMSIG(status), 'core', os.WCOREDUMP(status), sorted(os.listdir('.')))\n",
         ExecStatus.OK, {}, lambda r, c: (assert_in(r.stdout, ("core limit fixed",)),
                                          assert_in(r.stdout, ("signal 6 core False []",)))),
    Case("own_privileges",  # the program holds no capability, no new privileges, a seccomp filter
         "status = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
         "print({k: status[k].strip() for k in ('CapEff', 'CapPrm', 'CapAmb', 'NoNewPrivs', 'Seccomp', 'Seccomp_filters')})\n",
         ExecStatus.OK, {}, lambda r, c: (
             assert_eq({k: int(v, 16) for k, v in _printed(r).items() if k.startswith('Cap')},
                       {"CapEff": 0, "CapPrm": 0, "CapAmb": 0}),
             assert_eq((_printed(r)["NoNewPrivs"], _printed(r)["Seccomp"]), ("1", "2")),
             assert_true(int(_printed(r)["Seccomp_filters"]) >= 1, _printed(r)))),
]


def assert_in(text: str, needles: tuple[str, ...]) -> None:
    assert any(n in text for n in needles), f"expected one of {needles} in {text!r}"


def assert_eq(a: Any, b: Any) -> None:
    assert a == b, f"{a!r} != {b!r}"


def assert_true(cond: bool, info: Any) -> None:
    assert cond, info


def _stdin_for(case: Case, ctx: dict[str, Any]) -> str:
    if case.name == "forbidden_system_calls":
        return json.dumps({name: seccomp.syscall_number(name) for name in SYSCALL_PROBES})
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
    for _ in range(200):  # a jail's last processes die with it, a moment after the reply (10 s at most)
        if not (left := sandbox_uid_processes()):
            break
        await asyncio.sleep(0.05)
    assert not left, f"sandboxed processes outlived their run: {left}"
    assert helpers.cgroup_pressure(test_cgroup) == {"memory": 0, "pids": 0}, "a jail let the test cgroup fill up"

    # and the next execution works
    after = await sandbox.run(ExecRequest(code="print(6 * 7)", time_limit_s=5, memory_limit_mb=128))
    assert after.status is ExecStatus.OK and after.stdout == "42\n", after


# --------------------------------------------------------------------------- sessions

SWAPPER = """
import os, shutil, threading
os.makedirs('/tmp/target', exist_ok=True)
open('/tmp/target/secret', 'w').write('outside the work dir')
def swap(name, target):
    while True:  # a directory of the work dir, then a link to somewhere else, again and again
        try:
            os.makedirs(name, exist_ok=True)
            open(f'{name}/secret', 'w').write('inside')
            shutil.rmtree(name)
            os.symlink(target, name)
            os.unlink(name)
        except OSError:
            pass
for name, target in (('d', '/tmp/target'), ('k', '/proc/sys/kernel')):
    threading.Thread(target=swap, args=(name, target), daemon=True).start()
"""


async def test_session_races_on_files_never_cross_a_link(sandbox):
    """A background thread swaps work-dir directories for links to a directory of the
    program's own outside the work dir, and to the jail's /proc/sys/kernel, while fetches
    and uploads go through those names (uploads mostly while the session is stopped, wherever
    the thread was; a thread caught in a system call stops only when it returns from it):
    nothing may land in, or be read from, either. An upload that meets a link, or a
    directory that vanished under it, is refused as a SANDBOX_ERROR."""
    async with sandbox.session() as s:
        r = await s.run(ExecRequest(code=SWAPPER))
        assert r.status is ExecStatus.OK, r
        for i in range(30):
            r = await s.run(ExecRequest(code="import time\ntime.sleep(0.005)",
                                        fetch=["d/secret", "k/hostname", "k/osrelease"]))
            assert r.status is ExecStatus.OK, r
            assert r.files.get("d/secret", "") in ("", "inside"), r.files  # (empty: read while being rewritten)
            # (k/hostname "pwned": an earlier upload, into a real directory of the work dir)
            assert r.files.get("k/hostname", "pwned") == "pwned" and "k/osrelease" not in r.files, r.files
            for name in (f"d/up{i}", f"d/sub/up{i}", "k/hostname"):
                r = await s.run(ExecRequest(code="pass", files={name: "pwned"}))
                assert r.status in (ExecStatus.OK, ExecStatus.SANDBOX_ERROR), r
        r = await s.run(ExecRequest(code="import os, socket\nprint(sorted(os.listdir('/tmp/target')), socket.gethostname())"))
        assert (r.status, r.stdout) == (ExecStatus.OK, "['secret'] sandbox\n"), r


async def test_session_background_work_is_stopped_between_calls(sandbox):
    """A thread and a child process left busy by one call get no CPU until the next call."""
    ticks = "int(open(f'/proc/{child.pid}/stat').read().rsplit(')', 1)[1].split()[11])"
    async with sandbox.session() as s:
        r = await s.run(ExecRequest(code=(
            "import subprocess, threading\nn = 0\ndef spin():\n    global n\n    while True:\n        n += 1\n"
            "threading.Thread(target=spin, daemon=True).start()\n"
            "child = subprocess.Popen(['/bin/sh', '-c', 'while :; do :; done'])\n")))
        assert r.status is ExecStatus.OK, r
        r = await s.run(ExecRequest(code=f"import time\nn0, c0 = n, {ticks}\ntime.sleep(0.5)\nprint(n - n0, {ticks} - c0)"))
        running_count, running_ticks = map(int, r.stdout.split())
        assert running_ticks >= 5, r.stdout  # the child does run during a call (clock ticks, 100/s)
        r = await s.run(ExecRequest(code=f"print(n, {ticks})"))
        n1, c1 = map(int, r.stdout.split())
        t = time.monotonic()
        await asyncio.sleep(2.0)
        r = await s.run(ExecRequest(code=f"print(n, {ticks})"))
        n2, c2 = map(int, r.stdout.split())
        # 2 s between the calls: running, they would do 4x what they did in 0.5 s above; stopped,
        # only what the moments around the two one-line calls allow (more on a loaded machine)
        assert c2 - c1 < running_ticks, (c1, c2, running_ticks, time.monotonic() - t)
        assert n2 - n1 < running_count, (n1, n2, running_count)
