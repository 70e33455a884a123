"""LocalSandbox: run untrusted programs in namespace jails on this host, milliseconds each.

What it is: the asyncio client of a warm fork server (``sandboxes/jail.py``, started once
per LocalSandbox). Each ``run`` gets a fresh jail — new pid/net/mount/ipc/uts namespaces, a
read-only root, size-bounded tmpfs work dir, cgroups, an unprivileged uid — whose pid 1 is
our executor (``sandboxes/executor.py``), so the real exit status, signal, CPU time and peak
memory are reported, output is capped while it is read, and nothing outlives the jail.
``session()`` keeps one jail and a persistent interpreter for a whole episode.

What it is not: a VM. The trust boundary is the kernel; ``sandboxes/jail.py`` lists what is
covered and what is not. It needs root (CI and these machines run as root); without root
it raises SandboxUnavailable.

Main hooks: ``await LocalSandbox().run(ExecRequest(code=...))`` and
``async with sandbox.session() as s: await s.run(...)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from agentrl.api import ExecRequest, ExecResult
from agentrl.config import from_dict, option
from agentrl.errors import SandboxError, SandboxUnavailable
from sandboxes.protocol import request_payload, result_from_reply, sandbox_error

CGROUP_HEADROOM_MB = 64
"""Memory a jail's cgroup allows beyond the program's limit and its work dir (interpreter, executor)."""

AUTO_UID_START, AUTO_UID_BLOCK, AUTO_UID_BLOCKS = 100_000, 256, 15_000
_INSTANCES = itertools.count()

JAIL_SETUP_S = 10.0
"""Seconds a jail may take beyond the program's own time limit before it is killed."""


@dataclass
class LocalSandboxConfig:
    max_concurrency: int = option(8, help="jails running at once; further runs wait in a queue", ge=1)
    work_mb: int = option(64, help="size of the tmpfs work dir (/tmp gets a quarter) and the file-size limit", ge=1)
    max_processes: int = option(64, help="processes and threads one program may have at once", ge=1)
    session_memory_mb: int = option(512, help="memory limit of a session's interpreter", ge=16)
    python: str = option("", help="interpreter programs run under; empty = the one running agentrl")
    cgroup_parent: str = option(
        "", help="cgroup (relative to the hierarchy root) the jails nest under; it must exist"
    )
    uid_base: int = option(
        0, help="uid of the first jail slot (slot i runs programs as uid_base + i); 0 picks a block "
        "of 256 uids from this process id, so sandboxes in different processes do not share uids", ge=0
    )
    fork_interpreter: bool = option(
        True, help="run Python programs in a fork of the jail's warm interpreter (reset to a fresh "
        "`python -I -S` state) instead of starting a new one: ~10 ms less CPU per run"
    )


class _Jail:
    """One jail: a stream to its executor and a pidfd to kill it by."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.pidfd: int | None = None

    async def hello(self, limit_s: float) -> None:
        info = await self._line(limit_s)
        if "jail_pid" not in info:
            raise SandboxError(f"jail did not start: {info.get('error', info)}")
        self.pidfd = os.pidfd_open(info["jail_pid"])

    async def _line(self, limit_s: float) -> dict[str, Any]:
        line = await asyncio.wait_for(self.reader.readline(), limit_s)
        if not line:
            raise SandboxError("the jail closed its connection (it died or could not be set up)")
        return json.loads(line)

    async def call(self, msg: dict[str, Any], limit_s: float) -> dict[str, Any]:
        self.writer.write((json.dumps(msg) + "\n").encode())
        await asyncio.wait_for(self.writer.drain(), limit_s)
        return await self._line(limit_s)

    def close(self, kill: bool = False) -> None:
        """End the jail: closing its connection makes pid 1 exit, and the kernel then kills
        whatever is left in it. ``kill`` does it at once (the jail stopped answering)."""
        if self.pidfd is not None:
            if kill:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            os.close(self.pidfd)
            self.pidfd = None
        self.writer.close()


class LocalSession:
    """A persistent interpreter in one jail (see ``LocalSandbox.session``)."""

    def __init__(self, jail: _Jail, sandbox: LocalSandbox) -> None:
        self._jail = jail
        self._sandbox = sandbox

    async def run(self, request: ExecRequest) -> ExecResult:
        if request.language != "python":
            raise ValueError("a session keeps a Python interpreter; language must be 'python'")
        payload = request_payload(request, self._sandbox.config.work_mb, self._sandbox.config.max_processes)
        try:
            reply = await self._jail.call(
                {"op": "session_call", "request": payload}, request.time_limit_s + JAIL_SETUP_S
            )
        except (TimeoutError, SandboxError, OSError, ValueError) as e:
            return sandbox_error(f"session call failed: {e!r}")
        return result_from_reply(reply)


class LocalSandbox:
    """Runs programs in fresh local jails; a warm fork server makes each one cost milliseconds."""

    def __init__(self, config: LocalSandboxConfig | None = None, **overrides: Any) -> None:
        base = dataclasses.asdict(config or LocalSandboxConfig())
        self.config = from_dict(LocalSandboxConfig, {**base, **overrides})
        self.python = os.path.realpath(self.config.python or sys.executable)
        self.uid_base = self.config.uid_base or AUTO_UID_START + (
            (os.getpid() * 8 + next(_INSTANCES)) % AUTO_UID_BLOCKS) * AUTO_UID_BLOCK
        self._proc: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._start_lock = threading.Lock()
        self._sem: asyncio.Semaphore | None = None
        self._sem_loop: asyncio.AbstractEventLoop | None = None

    # ---- the fork server

    def _start_zygote(self) -> None:
        with self._start_lock:
            if self._control is not None and self._proc is not None and self._proc.poll() is None:
                return
            if os.geteuid() != 0:
                raise SandboxUnavailable(
                    "LocalSandbox needs root to build its jail (namespaces, mounts, cgroups); "
                    "run as root, or use the docker backend or a sandbox service URL"
                )
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            jail_py = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jail.py")
            argv = [self.python, "-I", "-S", jail_py, str(theirs.fileno()), self.python,
                    self.config.cgroup_parent, str(self.uid_base)]
            proc = subprocess.Popen(
                argv, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin"}
            )
            theirs.close()
            mine.settimeout(JAIL_SETUP_S * 3)
            try:
                hello = json.loads(mine.recv(1 << 16) or b'{"ready": false, "error": "it exited"}')
            except (OSError, ValueError) as e:
                hello = {"ready": False, "error": repr(e)}
            if not hello.get("ready"):
                mine.close()
                proc.kill()
                raise SandboxUnavailable(f"the jail fork server could not start: {hello.get('error')}")
            mine.setblocking(False)
            if self._control is not None:
                self._control.close()
            # both at once, and only when ready: other runs check them without the lock
            self._control, self._proc = mine, proc

    async def start(self) -> None:
        """Start the fork server now (otherwise the first run does); raises
        SandboxUnavailable when jails cannot be built here."""
        await asyncio.to_thread(self._start_zygote)

    async def _open_jail(self, memory_mb: int) -> _Jail:
        if self._control is None or self._proc is None or self._proc.poll() is not None:
            await asyncio.to_thread(self._start_zygote)
        params = {
            # RLIMIT_AS (= memory_mb) stops the program itself with a MemoryError; the cgroup
            # is the backstop for everything the jail holds, its tmpfs files included.
            "memory_mb": memory_mb + self.config.work_mb + CGROUP_HEADROOM_MB,
            "pids": self.config.max_processes,
            "work_mb": self.config.work_mb,
            "inline_python": self.config.fork_interpreter,
        }
        mine, theirs = socket.socketpair()
        try:
            msg = json.dumps(params).encode()
            for _ in range(1000):
                try:
                    socket.send_fds(self._control, [msg], [theirs.fileno()])
                    break
                except BlockingIOError:
                    await asyncio.sleep(0.001)
                except OSError as e:
                    raise SandboxUnavailable(f"the jail fork server is gone ({e}); it restarts on the next run") from e
            else:
                raise SandboxUnavailable("the jail fork server does not accept requests (1 s)")
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=mine, limit=1 << 26)
        jail = _Jail(reader, writer)
        try:
            await jail.hello(JAIL_SETUP_S)
        except BaseException:
            jail.close(kill=True)
            raise
        return jail

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._sem is None or self._sem_loop is not loop:
            self._sem, self._sem_loop = asyncio.Semaphore(self.config.max_concurrency), loop
        return self._sem

    # ---- the Sandbox protocol

    async def run(self, request: ExecRequest) -> ExecResult:
        """Run one program in a fresh jail. Failures of the jail itself come back as
        SANDBOX_ERROR results; only a missing prerequisite (root) raises."""
        payload = request_payload(request, self.config.work_mb, self.config.max_processes)
        async with self._semaphore():
            try:
                jail = await self._open_jail(request.memory_limit_mb)
            except SandboxUnavailable:
                raise
            except (TimeoutError, SandboxError, OSError, ValueError) as e:
                return sandbox_error(f"could not start a jail: {e!r}")
            try:
                reply = await jail.call({"op": "run", "request": payload}, request.time_limit_s + JAIL_SETUP_S)
            except (TimeoutError, SandboxError, OSError, ValueError) as e:
                jail.close(kill=True)
                return sandbox_error(f"the jail failed: {e!r}")
            except BaseException:  # cancelled: do not leave the program running
                jail.close(kill=True)
                raise
            jail.close()
        return result_from_reply(reply)

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[LocalSession]:
        """One jail with a persistent interpreter for the whole block; killed at exit."""
        jail = await self._open_jail(self.config.session_memory_mb)
        try:
            limits = {
                "cpu_s": 3600,
                "memory_mb": self.config.session_memory_mb,
                "file_mb": self.config.work_mb,
                "nproc": self.config.max_processes,
            }
            reply = await jail.call({"op": "session_start", "limits": limits}, JAIL_SETUP_S)
            if not reply.get("ok"):
                raise SandboxError(f"session did not start: {reply.get('error', reply)}")
            yield LocalSession(jail, self)
        except BaseException:  # the episode failed or was cancelled, maybe mid-call: kill now
            jail.close(kill=True)
            raise
        else:
            jail.close()  # its pid 1 ends the interpreter; the rest dies with the jail

    async def aclose(self) -> None:
        """Stop the fork server (running jails are killed through their pidfds by their owners)."""
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._proc is not None:
            proc, self._proc = self._proc, None
            try:
                await asyncio.wait_for(asyncio.to_thread(proc.wait), 5)
            except TimeoutError:
                proc.kill()
