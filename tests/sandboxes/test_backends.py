"""The Sandbox contract, the same on every backend: statuses, output, files, limits, sessions.

Each test runs against a real LocalSandbox jail, a real Docker pool and a real
``agentrl sandbox serve`` process (through RemoteSandbox).
"""

from __future__ import annotations

import asyncio
import base64

import pytest

from agentrl.api import ExecRequest, ExecStatus
from agentrl.errors import SandboxError

pytestmark = pytest.mark.timeout(120)


async def test_ok_result_reports_output_exit_and_usage(sandbox):
    r = await sandbox.run(ExecRequest(code="import sys\nprint('out')\nprint('err', file=sys.stderr)\n"))
    assert r.status is ExecStatus.OK
    assert (r.exit_code, r.signal, r.stdout, r.stderr) == (0, None, "out\n", "err\n")
    assert 0 < r.wall_s < 5 and 0 <= r.cpu_s < 5
    assert 0 < r.peak_memory_mb < 128
    assert not r.stdout_truncated and not r.stderr_truncated


async def test_exit_code_and_signal_are_the_real_ones(sandbox):
    r = await sandbox.run(ExecRequest(code="raise SystemExit(3)"))
    assert (r.status, r.exit_code, r.signal) == (ExecStatus.RUNTIME_ERROR, 3, None)
    r = await sandbox.run(ExecRequest(code="import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n"))
    assert (r.status, r.exit_code, r.signal) == (ExecStatus.RUNTIME_ERROR, None, 15)
    r = await sandbox.run(ExecRequest(code="1 / 0"))
    assert r.status is ExecStatus.RUNTIME_ERROR and "ZeroDivisionError" in r.stderr


async def test_stdin_files_and_fetch(sandbox):
    code = (
        "import sys\nname = sys.stdin.read().strip()\ndata = open('data/in.txt').read()\n"
        "blob = open('blob.bin', 'rb').read()\nopen('out.txt', 'w').write(f'{name}:{data}:{blob.hex()}')\n"
    )
    r = await sandbox.run(ExecRequest(code=code, stdin="alice\n", files={"data/in.txt": "hello"},
                                      files_b64={"blob.bin": base64.b64encode(b"\x00\xff").decode()},
                                      fetch=["out.txt", "missing.txt"]))
    assert r.status is ExecStatus.OK, r
    assert r.files == {"out.txt": "alice:hello:00ff"}


async def test_work_dir_is_fresh_for_every_run(sandbox):
    r = await sandbox.run(ExecRequest(code="open('left.txt', 'w').write('x')\nopen('/tmp/t', 'w').write('x')"))
    assert r.status is ExecStatus.OK, r
    r = await sandbox.run(ExecRequest(code="import os\nprint(sorted(os.listdir('.')), os.listdir('/tmp'))"))
    assert r.status is ExecStatus.OK and "left.txt" not in r.stdout and "'t'" not in r.stdout, r.stdout


async def test_bash_programs(sandbox):
    r = await sandbox.run(ExecRequest(code="read x\necho \"got $x\"\nexit 4\n", language="bash", stdin="7\n"))
    assert (r.status, r.exit_code, r.stdout) == (ExecStatus.RUNTIME_ERROR, 4, "got 7\n")


async def test_stderr_is_capped_on_its_own(sandbox):
    r = await sandbox.run(ExecRequest(code="import sys\nsys.stderr.write('e' * 10000)\nprint('fine')",
                                      output_limit_bytes=100))
    assert r.status is ExecStatus.OUTPUT_LIMIT
    assert r.stderr_truncated and len(r.stderr) == 100 and not r.stdout_truncated


async def test_file_names_outside_the_work_dir_are_refused(sandbox):
    with pytest.raises((ValueError, SandboxError), match="relative path inside the work dir"):
        await sandbox.run(ExecRequest(code="pass", files={"../escape.txt": "x"}))


async def test_concurrent_runs_all_complete(sandbox):
    codes = [f"import time\ntime.sleep(0.2)\nprint({i} * {i})" for i in range(8)]
    results = await asyncio.gather(*[sandbox.run(ExecRequest(code=c)) for c in codes])
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(8)]


async def test_session_keeps_variables_between_calls(sandbox):
    async with sandbox.session() as s:
        r = await s.run(ExecRequest(code="import math\ntotal = 40"))
        assert r.status is ExecStatus.OK, r
        r = await s.run(ExecRequest(code="total += 2\nprint('printed')\ntotal"))
        assert (r.status, r.stdout) == (ExecStatus.OK, "printed\n42\n")
        r = await s.run(ExecRequest(code="undefined_name"))
        assert r.status is ExecStatus.RUNTIME_ERROR and "NameError" in r.stderr
        r = await s.run(ExecRequest(code="math.isqrt(total * 100)"))  # an error keeps the state
        assert r.stdout == "64\n"


async def test_session_timeout_restarts_the_interpreter(sandbox):
    async with sandbox.session() as s:
        await s.run(ExecRequest(code="kept = 1"))
        r = await s.run(ExecRequest(code="while True:\n    pass", time_limit_s=1))
        assert r.status is ExecStatus.TIMEOUT and "restarted" in r.error
        r = await s.run(ExecRequest(code="kept"))
        assert r.status is ExecStatus.RUNTIME_ERROR and "NameError" in r.stderr
        r = await s.run(ExecRequest(code="fresh = 5\nfresh * 2"))
        assert (r.status, r.stdout) == (ExecStatus.OK, "10\n")


async def test_session_is_destroyed_when_the_episode_fails(sandbox, sandbox_uid_processes):
    with pytest.raises(RuntimeError, match="episode failed"):
        async with sandbox.session() as s:
            await s.run(ExecRequest(code="import subprocess\np = subprocess.Popen(['sleep', '300'])"))
            raise RuntimeError("episode failed")
    for _ in range(200):  # 10 s at most
        if not sandbox_uid_processes():
            break
        await asyncio.sleep(0.05)
    assert not sandbox_uid_processes(), "the session's interpreter (or its child) outlived the episode"
    async with sandbox.session() as s:  # and a new session starts clean
        r = await s.run(ExecRequest(code="'p' in globals()"))
        assert r.stdout == "False\n"


async def test_python_programs_start_from_a_clean_interpreter(sandbox):
    code = (
        "import atexit, os, sys, threading, time\n"
        "assert __name__ == '__main__', __name__\n"
        "assert sys.argv[0].endswith('.py') and len(sys.argv) == 1, sys.argv\n"
        "leaks = [m for m in sys.modules if 'supervisor' in m or 'jail' in m or m.startswith(('sandboxes', 'agentrl'))]\n"
        "assert not leaks, leaks\n"
        "assert not any('sandboxes' in p or 'agentrl' in p for p in sys.path), sys.path\n"
        "assert sorted(os.environ) == ['HOME', 'LANG', 'PATH', 'PYTHONDONTWRITEBYTECODE', 'PYTHONIOENCODING', 'TMPDIR'], dict(os.environ)\n"
        "atexit.register(lambda: print('atexit ran'))\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread joined'))).start()\n"
        "print(input())\n"
    )
    r = await sandbox.run(ExecRequest(code=code, stdin="line one\n"))
    assert r.status is ExecStatus.OK, r.stderr
    assert r.stdout == "line one\nthread joined\natexit ran\n"


async def test_uploaded_directories_belong_to_the_program(sandbox):
    code = "open('data/sub/new.txt', 'w').write('ok')\nprint(open('data/sub/given.txt').read())"
    r = await sandbox.run(ExecRequest(code=code, files={"data/sub/given.txt": "given"}, fetch=["data/sub/new.txt"]))
    assert r.status is ExecStatus.OK, r.stderr
    assert r.files == {"data/sub/new.txt": "ok"}


async def test_session_cannot_redirect_uploads_through_a_link(sandbox):
    async with sandbox.session() as s:
        r = await s.run(ExecRequest(code="import os\nos.symlink('/etc', 'data')"))
        assert r.status is ExecStatus.OK, r.stderr
        r = await s.run(ExecRequest(code="print('never runs')", files={"data/hostname": "pwned"}))
        assert r.status is ExecStatus.SANDBOX_ERROR and "not a directory of the work dir" in r.error


async def test_a_cancelled_episode_kills_its_session(sandbox, sandbox_uid_processes):
    async def episode():
        async with sandbox.session() as s:
            await s.run(ExecRequest(code="import time\ntime.sleep(30)", time_limit_s=30))

    task = asyncio.create_task(episode())
    await asyncio.sleep(1.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):
        if not sandbox_uid_processes():
            break
        await asyncio.sleep(0.05)
    assert not sandbox_uid_processes(), "a cancelled episode left its interpreter running"
    r = await sandbox.run(ExecRequest(code="print('next')"))
    assert r.stdout == "next\n"


async def test_local_fork_server_failure_is_explained(test_cgroup):
    from agentrl.errors import SandboxUnavailable
    from sandboxes.local import LocalSandbox

    sandbox = LocalSandbox(cgroup_parent="agentrl-no-such-cgroup")
    with pytest.raises(SandboxUnavailable, match="fork server could not start.*agentrl-no-such-cgroup"):
        await sandbox.run(ExecRequest(code="pass"))
    await sandbox.aclose()


async def test_local_first_runs_at_once_share_one_fork_server(test_cgroup):
    from sandboxes.local import LocalSandbox

    sandbox = LocalSandbox(cgroup_parent=test_cgroup, uid_base=62500)
    results = await asyncio.gather(*[sandbox.run(ExecRequest(code=f"print({i})")) for i in range(6)])
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(6)]
    await sandbox.aclose()
