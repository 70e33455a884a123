"""LocalSandbox: run untrusted programs in namespace jails on this host, milliseconds each.

What it is: the asyncio client of a warm fork server (``sandboxes/jail.py``, started once
per LocalSandbox). Each ``run`` gets a fresh jail — new pid/net/mount/ipc/uts namespaces, a
read-only root, size-bounded tmpfs work dir, an unprivileged uid, the seccomp filter of
``sandboxes/seccomp.py`` — whose pid 1 is our supervisor (``sandboxes/supervisor.py``), so the
real exit status, signal, CPU time and peak memory are reported, output is capped while it
is read, and nothing outlives the jail. ``session()`` keeps one jail and a persistent
interpreter for a whole episode (its processes are stopped between calls).

Two modes (``mode``): *root* (the fork server runs as root on the host: a uid per jail
slot, cgroups per jail) and *rootless* (no root needed: the fork server runs inside one
bubblewrap sandbox — Debian's ``bubblewrap`` — as an unprivileged user, and each jail adds a
user namespace of its own; no cgroups). ``auto`` picks root when running as root. A root
process may ask for rootless: the fork server then runs as ``rootless_uid``.

What it is not: a VM. The trust boundary is the kernel; ``sandboxes/jail.py`` lists what is
covered and what is not, per mode.

Main hooks: ``await LocalSandbox().run(ExecRequest(code=...))`` and
``async with sandbox.session() as s: await s.run(...)``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from agentrl.api import ExecRequest, ExecResult
from agentrl.config import from_dict, option
from agentrl.errors import SandboxError, SandboxUnavailable
from sandboxes import seccomp
from sandboxes.program_limits import BackendLimits
from sandboxes.wire import request_payload, result_from_reply, sandbox_error

CGROUP_HEADROOM_MB = 64
"""Memory a jail's cgroup allows beyond the program's limit and its work dir (interpreter, supervisor)."""

AUTO_UID_START, AUTO_UID_BLOCK, AUTO_UID_BLOCKS = 100_000, 256, 15_000
_INSTANCES = itertools.count()

JAIL_SETUP_S = 10.0
"""Seconds a jail may take beyond the program's own time limit before it is killed."""

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class LocalSandboxConfig(BackendLimits):
    max_concurrency: int = option(8, help="jails running at once (sessions included); further runs wait", ge=1)
    python: str = option("", help="interpreter programs run under; empty = the one running agentrl "
                         "(rootless: it must be readable by the unprivileged user, e.g. /usr/bin/python3)")
    mode: str = option("auto", help="root: jails built as root (a uid and cgroups per jail); rootless: "
                       "inside bubblewrap with user namespaces, no root needed, no cgroups; auto: root "
                       "when running as root", choices=("auto", "root", "rootless"))
    rootless_uid: int = option(65534, help="rootless mode started by root: the host uid the fork server "
                               "and every jail run as", ge=1)
    cgroup_parent: str = option(
        "", help="cgroup (relative to the hierarchy root) the jails nest under; it must exist "
        "(rootless: the whole fork server joins it, when this process may write it)"
    )
    uid_base: int = option(
        0, help="root mode: uid of the first jail slot (slot i runs programs as uid_base + i); 0 picks a "
        "block of 256 uids from this process id, so sandboxes in different processes do not share uids", ge=0
    )
    fork_interpreter: bool = option(
        True, help="run Python programs in a fork of the jail's warm interpreter (reset to a fresh "
        "`python -I -S` state) instead of starting a new one: ~10 ms less CPU per run"
    )


def bwrap_argv(bwrap: str, python_prefix: str) -> list[str]:
    """The bubblewrap command around a rootless fork server: every namespace, the fork
    server as root of its user namespace (capabilities there only, to build the jails), and
    a root with only ``/usr``, the interpreter's prefix and this directory, read-only.
    (No ``--die-with-parent``: it ties bwrap to the thread that started it; the fork server
    exits when its control socket closes, which the owner's death does too.)"""
    argv = [bwrap, "--unshare-user", "--uid", "0", "--gid", "0", "--unshare-pid", "--unshare-net",
            "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox",
            "--new-session", "--cap-add", "ALL", "--clearenv", "--setenv", "PATH",
            "/usr/bin:/bin", "--ro-bind", "/usr", "/usr"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = f"/{top}"
        if os.path.islink(host):
            argv += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            argv += ["--ro-bind", host, host]
    argv += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache", "--proc", "/proc", "--dev", "/dev",
             "--tmpfs", "/tmp"]
    # after the tmpfs: a checkout (or interpreter) under /tmp stays visible inside it
    if not python_prefix.startswith("/usr/") and python_prefix != "/usr":
        argv += ["--ro-bind", python_prefix, python_prefix]
    argv += ["--ro-bind", HERE, HERE]
    return argv


def _cgroup_procs(parent: str) -> list[str]:
    """cgroup.procs files of ``parent`` (v2: one; v1: memory and pids)."""
    root = "/sys/fs/cgroup"
    if os.path.exists(f"{root}/cgroup.controllers"):
        return [f"{root}/{parent.strip('/')}/cgroup.procs"]
    return [f"{root}/{c}/{parent.strip('/')}/cgroup.procs" for c in ("memory", "pids")]


class _Jail:
    """One jail: a stream to its supervisor and a pidfd to kill it by."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.pidfd: int | None = None

    async def hello(self, limit_s: float) -> None:
        """Read the fork server's first line, which carries the jail's pidfd, then switch
        the socket to asyncio streams for the supervisor's protocol."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        data, fds = b"", []
        self.sock.setblocking(False)
        while b"\n" not in data:
            try:
                chunk, got, _, _ = socket.recv_fds(self.sock, 1 << 16, 1)
            except BlockingIOError:
                ready = loop.create_future()
                loop.add_reader(self.sock.fileno(), lambda f=ready: f.done() or f.set_result(None))
                try:
                    await asyncio.wait_for(ready, max(deadline - loop.time(), 0))
                finally:
                    loop.remove_reader(self.sock.fileno())
                continue
            fds += got
            if not chunk:
                break
            data += chunk
        for fd in fds[1:]:
            os.close(fd)
        self.pidfd = fds[0] if fds else None
        line, _, rest = data.partition(b"\n")
        if not line:
            raise SandboxError("the jail closed its connection (it died or could not be set up)")
        info = json.loads(line)
        if "jail_pid" not in info or self.pidfd is None:
            raise SandboxError(f"jail did not start: {info.get('error', info)}")
        self.reader, self.writer = await asyncio.open_unix_connection(sock=self.sock, limit=1 << 26)
        if rest:
            self.reader.feed_data(rest)

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
        whatever is left in it. ``kill`` does it at once (the jail stopped answering, or
        its caller is gone)."""
        if self.pidfd is not None:
            if kill:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            os.close(self.pidfd)
            self.pidfd = None
        if self.writer is not None:
            self.writer.close()
        else:
            self.sock.close()


class LocalSession:
    """A persistent interpreter in one jail (see ``LocalSandbox.session``). ``cpu_s``: CPU
    its interpreter has used so far (threads and waited-for children included)."""

    def __init__(self, jail: _Jail, sandbox: LocalSandbox) -> None:
        self._jail = jail
        self._sandbox = sandbox
        self.cpu_s = 0.0
        self.broken = ""

    async def run(self, request: ExecRequest) -> ExecResult:
        if request.language != "python":
            raise ValueError("a session keeps a Python interpreter; language must be 'python'")
        if self.broken:
            return sandbox_error(f"this session's jail was killed earlier ({self.broken}); start a new session")
        payload = request_payload(request, self._sandbox.config)
        try:
            reply = await self._jail.call(
                {"op": "session_call", "request": payload}, request.time_limit_s + JAIL_SETUP_S
            )
        except (TimeoutError, SandboxError, OSError, ValueError) as e:
            self.broken = f"{e!r}"
            self._jail.close(kill=True)
            return sandbox_error(f"session call failed: {e!r}")
        except BaseException:  # cancelled mid-call: the program dies now, not at its time limit
            self.broken = "a call was cancelled"
            self._jail.close(kill=True)
            raise
        self.cpu_s = float(reply.get("session_cpu_s", self.cpu_s))
        return result_from_reply(reply)


class LocalSandbox:
    """Runs programs in fresh local jails; a warm fork server makes each one cost milliseconds."""

    def __init__(self, config: LocalSandboxConfig | None = None, **overrides: Any) -> None:
        base = dataclasses.asdict(config or LocalSandboxConfig())
        self.config = from_dict(LocalSandboxConfig, {**base, **overrides})
        self.python = os.path.realpath(self.config.python or sys.executable)
        self.rootless = self.config.mode == "rootless" or (self.config.mode == "auto" and os.geteuid() != 0)
        self.uid_base = self.config.uid_base or AUTO_UID_START + (
            (os.getpid() * 8 + next(_INSTANCES)) % AUTO_UID_BLOCKS) * AUTO_UID_BLOCK
        self._proc: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._start_lock = threading.Lock()
        self._sem: asyncio.Semaphore | None = None
        self._sem_loop: asyncio.AbstractEventLoop | None = None

    # ---- the fork server

    def _command(self, fd: int) -> tuple[list[str], Any]:
        """(argv, preexec_fn) that start the fork server on the control socket ``fd``."""
        config = {
            "python": self.python, "rootless": self.rootless, "cgroup_parent": self.config.cgroup_parent,
            "uid_base": self.uid_base, "seccomp": base64.b64encode(seccomp.program_filter()).decode(),
            "syscalls": {name: seccomp.syscall_number(name) for name in ("clone", "pivot_root")},
        }
        argv = [self.python, "-I", "-S", os.path.join(HERE, "jail.py"), str(fd), json.dumps(config)]
        if not self.rootless:
            if os.geteuid() != 0:
                raise SandboxUnavailable(
                    "LocalSandbox mode 'root' needs root to build its jails (namespaces, mounts, cgroups); "
                    "run as root, or use mode='rootless' (bubblewrap), the docker backend or a sandbox service URL"
                )
            return argv, None
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxUnavailable(
                "LocalSandbox without root needs bubblewrap: install it (Debian/Ubuntu: apt install bubblewrap; "
                "Fedora: dnf install bubblewrap), or run as root, or use the docker backend"
            )
        prefix = os.path.realpath(os.path.join(os.path.dirname(self.python), ".."))
        argv = bwrap_argv(bwrap, prefix) + argv
        procs = _cgroup_procs(self.config.cgroup_parent) if self.config.cgroup_parent else []
        for path in procs:
            if not os.access(path, os.W_OK):
                raise SandboxUnavailable(f"cannot join the cgroup {self.config.cgroup_parent!r}: {path} is "
                                         "missing or not writable by this user; make it (or delegate it) first")
        uid = self.config.rootless_uid if os.geteuid() == 0 else None
        if not procs and uid is None:
            return argv, None

        def enter() -> None:  # in the child, before exec: join the cgroup, then drop root
            for path in procs:  # (plain system calls: this runs in a fork of a threaded process)
                fd = os.open(path, os.O_WRONLY)
                os.write(fd, b"0")
                os.close(fd)
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)

        return argv, enter

    def _start_zygote(self) -> None:
        with self._start_lock:
            if self._control is not None and self._proc is not None and self._proc.poll() is None:
                return
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            log = tempfile.TemporaryFile()  # what the fork server (or bwrap) says when it fails
            try:
                argv, preexec = self._command(theirs.fileno())
                proc = subprocess.Popen(argv, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stderr=log,
                                        env={"PATH": "/usr/bin:/bin"}, preexec_fn=preexec)
            except (OSError, subprocess.SubprocessError) as e:  # (e.g. the cgroup is not ours to join)
                mine.close()
                log.close()
                raise SandboxUnavailable(f"the jail fork server could not start: {e}") from e
            except BaseException:
                mine.close()
                log.close()
                raise
            finally:
                theirs.close()
            mine.settimeout(JAIL_SETUP_S * 3)
            try:
                hello = json.loads(mine.recv(1 << 16) or b'{"ready": false, "error": "it exited"}')
            except (OSError, ValueError) as e:
                hello = {"ready": False, "error": repr(e)}
            if not hello.get("ready"):
                mine.close()
                proc.kill()
                proc.wait()
                log.seek(0)
                said = log.read()[-2000:].decode(errors="replace").strip()
                log.close()
                hint = ""
                if self.rootless and ("namespace" in said or "uid map" in said):
                    hint = ("; unprivileged user namespaces look disabled here (sysctl "
                            "kernel.unprivileged_userns_clone=1, or AppArmor's apparmor_restrict_unprivileged_userns=0)")
                raise SandboxUnavailable(f"the jail fork server could not start: {hello.get('error')}"
                                         + (f"; it said: {said}" if said else "") + hint)
            log.close()
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
                    mine.close()
                    raise SandboxUnavailable(f"the jail fork server is gone ({e}); it restarts on the next run") from e
            else:
                mine.close()
                raise SandboxUnavailable("the jail fork server does not accept requests (1 s)")
        finally:
            theirs.close()
        jail = _Jail(mine)
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
        SANDBOX_ERROR results; only a missing prerequisite (root, bubblewrap) raises.
        Cancelling the call kills the program at once."""
        payload = request_payload(request, self.config)
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
        """One jail with a persistent interpreter for the whole block; killed at exit. It
        holds one of ``max_concurrency`` places until then, like a run."""
        async with self._semaphore():
            jail = await self._open_jail(self.config.session_memory_mb)
            try:
                limits = self.config.for_session().to_wire()
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
