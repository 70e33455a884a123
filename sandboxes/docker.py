"""DockerSandbox: a pool of warm, locked-down containers, each running our supervisor.

What it is: the Docker backend of the Sandbox interface. ``pool_size`` containers are
created once with every limit set — no network (``network_mode=none``), memory and swap,
pids, CPU quota, read-only root, size-bounded tmpfs ``/work`` and ``/tmp``, all
capabilities dropped but SETUID, SETGID and KILL, ``no-new-privileges``, labels naming
the owner process so a crashed owner's leftovers are removed by the next pool. Each
container's main process (pid 1) is ``sandboxes/supervisor.py``, passed on the command line
(the image needs only python3), reached through the container's attached stdin/stdout: one
execution is one JSON line each way, milliseconds, not a container start. A container that
fails a call, times out, stops answering or whose caller went away is destroyed (at once)
and replaced.

Trust boundary — what is covered:
  * the container is the isolation boundary: its own pid, net (none: only ``lo``), mount,
    ipc and uts namespaces, cgroup limits on memory, pids and CPU, read-only root, Docker's
    default seccomp profile;
  * inside it the supervisor runs each program as an unprivileged uid of that container (no
    capabilities, no new privileges) under rlimits (CPU time, address space, file size,
    processes, fds, core size) and, on top of Docker's, the seccomp filter of
    ``sandboxes/seccomp.py`` (compiled on this host, passed in the environment) — a Python
    program in a fork of a pristine interpreter made at container start, before any
    request, so it holds no other run's code or output — drains output with caps, enforces
    the deadline, then SIGKILLs every process of that uid and wipes ``/work``, ``/tmp`` and
    ``/dev/shm`` before the next request;
  * the supervisor's own file I/O for the program (``files``, ``fetch``, the wipe) runs with
    the program's filesystem uid and never follows a link (see ``sandboxes/supervisor.py``);
    it keeps only SETUID, SETGID and KILL and is not dumpable;
  * a session's processes are stopped between its calls.
What is not covered, and why:
  * no per-execution namespaces inside the container: Docker's default seccomp profile
    refuses ``unshare``, and allowing it needs ``CAP_SYS_ADMIN`` plus an unconfined seccomp
    profile, which would weaken the container far more than it gains. So consecutive
    executions in one container share its (empty) network namespace and pid namespace — the
    kill-by-uid sweep and the wipe are what separate them; ``/proc`` is Docker's (read-write
    for the program's own entries, ``/proc/sys`` read-only), and lists the supervisor, whose
    entries the program cannot open (another uid, not dumpable);
  * the supervisor itself runs as root in the container (with the three capabilities above)
    so that it can drop to the program's uid and kill what the program leaves behind;
  * memory is reported as MEMORY from the program's MemoryError under RLIMIT_AS, or from an
    OOM kill of the container (which is then replaced); peak memory is the program's max RSS;
  * kernel exploits through calls both filters allow, the engine's own security, CPU
    contention between containers.

Main hooks: ``await DockerSandbox().run(ExecRequest(...))``; ``session()`` borrows one
container for a whole episode; ``counters`` says what the pool did (``runs``: programs a
container's supervisor ran and answered for, session calls included; ``containers_started``). Uses the ``docker`` SDK against ``DOCKER_HOST`` (podman's
Docker-compatible socket works too).
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import collections
import concurrent.futures
import contextlib
import dataclasses
import itertools
import json
import os
import socket
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from agentrl.api import ExecRequest, ExecResult
from agentrl.config import from_dict, option
from agentrl.errors import SandboxError, SandboxUnavailable
from agentrl.plugins import import_optional
from sandboxes import seccomp
from sandboxes.program_limits import BackendLimits
from sandboxes.wire import request_payload, result_from_reply, sandbox_error

LABEL = "agentrl.sandbox"
CALL_GRACE_S = 10.0
"""Seconds an supervisor may take beyond the program's time limit before its container is replaced."""

SUPERVISOR_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "supervisor.py")


def engine_client(docker_host: str = "") -> Any:
    """A ``docker`` SDK client of the engine at ``docker_host`` (empty: ``DOCKER_HOST`` or the
    default socket) that answered a ping; ``SandboxUnavailable`` says how to start one."""
    docker = import_optional("docker", extra="docker", purpose="the Docker sandbox backend")
    client = None
    try:
        client = docker.DockerClient(base_url=docker_host, timeout=60) if docker_host else docker.from_env(timeout=60)
        client.ping()
    except Exception as e:
        if client is not None:
            client.close()
        raise SandboxUnavailable(
            f"no Docker engine answers ({e}); start one (`make sandbox-image` does, as root) "
            "or set DOCKER_HOST / docker_host"
        ) from e
    return client


def remove_leftovers(client: Any, label: str) -> None:
    """Remove the containers labelled ``label`` whose owner (``<label>.owner``: host:pid) is a
    process of this host that is gone: what a killed run left behind."""
    host = socket.gethostname()
    # sparse: no inspect per container (one removed meanwhile by another process would fail the listing)
    for c in client.containers.list(all=True, sparse=True, filters={"label": label}):
        owner = (c.attrs.get("Labels") or {}).get(f"{label}.owner", "")
        name, _, pid = owner.rpartition(":")
        if name == host and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            with contextlib.suppress(Exception):
                c.remove(force=True)


@dataclass
class DockerSandboxConfig(BackendLimits):
    image: str = option("agentrl-sandbox:latest", help="image with python3 (make sandbox-image builds it)")
    pool_size: int = option(4, help="warm containers; also the number of programs running at once", ge=1)
    memory_mb: int = option(512, help="memory (and memory+swap) limit of each container", ge=64)
    cpus: float = option(1.0, help="CPU quota of each container, in CPUs", gt=0)
    pids: int = option(128, help="pids limit of each container (the supervisor included)", ge=16)
    docker_host: str = option("", help="engine URL; empty = DOCKER_HOST or the default socket")
    cgroup_parent: str = option("", help="cgroup the containers are placed under (cgroupfs driver)")
    uid: int = option(10000, help="uid of the programs in the first container (the next gets uid+1, ...)", ge=1000)
    start_timeout_s: float = option(60.0, help="seconds to wait for a container's supervisor to answer", gt=0)
    fork_interpreter: bool = option(
        True, help="run Python programs in a fork of a pristine interpreter made when the container "
        "starts (reset to a fresh `python -I -S` state) instead of starting a new one per run"
    )


class _Container:
    """One warm container and its attached stdin/stdout (blocking; used from a thread)."""

    def __init__(self, container: Any, sock: Any) -> None:
        self.container = container
        self.raw: socket.socket = getattr(sock, "_sock", sock)
        self.keep = sock  # the SDK's wrapper owns the connection; keep it alive
        self.buffer = bytearray()
        self.log = bytearray()  # what the supervisor wrote on stderr (for error messages)

    def _frames(self, deadline: float) -> None:
        """Read one multiplexed frame (8-byte header: stream, 0, 0, 0, big-endian size)."""
        header = self._exactly(8, deadline)
        stream, size = header[0], struct.unpack(">I", header[4:])[0]
        payload = self._exactly(size, deadline)
        if stream == 1:
            self.buffer += payload
        else:
            self.log = (self.log + payload)[-4096:]

    def _exactly(self, n: int, deadline: float) -> bytes:
        out = bytearray()
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the container's supervisor did not answer in time")
            self.raw.settimeout(left)
            chunk = self.raw.recv(n - len(out))
            if not chunk:
                raise SandboxError(
                    "the container closed its stream (it died: OOM kill or crash); "
                    f"supervisor said: {self.log.decode(errors='replace')[-300:]!r}"
                )
            out += chunk
        return bytes(out)

    def call(self, msg: dict[str, Any], limit_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + limit_s
        self.raw.settimeout(limit_s)
        self.raw.sendall((json.dumps(msg) + "\n").encode())
        while b"\n" not in self.buffer:
            self._frames(deadline)
        line, _, rest = bytes(self.buffer).partition(b"\n")
        self.buffer = bytearray(rest)
        return json.loads(line)

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.raw.close()
        with contextlib.suppress(Exception):  # the attach's HTTP response still holds the socket: close it too,
            getattr(self.keep, "_response", self.keep).close()  # or the descriptor stays open until a GC
        with contextlib.suppress(Exception):
            self.container.remove(force=True)


class DockerSession:
    """A persistent interpreter in one borrowed container (see ``DockerSandbox.session``)."""

    def __init__(self, sandbox: DockerSandbox, box: _Container) -> None:
        self._sandbox = sandbox
        self._box = box
        self.broken = False
        self.in_call = False  # a call is on the container's stream right now
        self.cpu_s = 0.0  # CPU its interpreter has used so far (threads and waited-for children included)

    async def run(self, request: ExecRequest) -> ExecResult:
        if request.language != "python":
            raise ValueError("a session keeps a Python interpreter; language must be 'python'")
        if self.broken:
            return sandbox_error("this session's container failed earlier; start a new session")
        cfg = self._sandbox.config
        payload = request_payload(request, cfg)
        self.in_call = True
        try:
            reply = await self._sandbox._call(self._box, {"op": "session_call", "request": payload},
                                              request.time_limit_s + CALL_GRACE_S)
            self.in_call = False
        except (TimeoutError, SandboxError, OSError, ValueError) as e:
            self.broken = True
            return sandbox_error(f"session container failed: {e!r}")
        except BaseException:  # cancelled mid-call: kill the program now (the container goes)
            self.broken = True
            await asyncio.shield(self._sandbox._in_thread(self._box.destroy))
            raise
        self.cpu_s = float(reply.get("session_cpu_s", self.cpu_s))
        self._sandbox._count_run(reply)
        return result_from_reply(reply)


class DockerSandbox:
    """A warm pool of containers; each ``run`` borrows one for milliseconds."""

    def __init__(self, config: DockerSandboxConfig | None = None, **overrides: Any) -> None:
        base = dataclasses.asdict(config or DockerSandboxConfig())
        self.config = from_dict(DockerSandboxConfig, {**base, **overrides})
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self._client: Any = None
        self._idle: collections.deque[_Container] = collections.deque()
        self._all: set[_Container] = set()
        self._threads = concurrent.futures.ThreadPoolExecutor(self.config.pool_size + 4, "docker-sandbox")
        self._cond: asyncio.Condition | None = None
        self._cond_loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self.counters: collections.Counter[str] = collections.Counter()
        """``runs``: programs run in a container (a reply from its supervisor other than
        sandbox_error); ``containers_started``: containers created, replacements included."""
        # one uid per container (RLIMIT_NPROC counts per uid across the host)
        self._uids = itertools.cycle(range(self.config.uid, self.config.uid + 1000))
        with open(SUPERVISOR_PATH) as f:
            self._supervisor_src = f.read()
        atexit.register(self._destroy_all)

    # ---- engine and containers (blocking; run in the thread pool)

    def _connect(self) -> Any:
        if self._client is None:
            client = engine_client(self.config.docker_host)
            try:
                client.images.get(self.config.image)
            except Exception as e:
                client.close()
                raise SandboxUnavailable(
                    f"image {self.config.image!r} not found ({e}); build it with `make sandbox-image`"
                ) from e
            self._client = client
        return self._client

    def _remove_leftovers(self) -> None:
        remove_leftovers(self._connect(), LABEL)

    def _create(self) -> _Container:
        cfg = self.config
        client = self._connect()
        python = "python3"
        kwargs: dict[str, Any] = dict(
            command=[python, "-I", "-S", "-c", self._supervisor_src, "container"],
            stdin_open=True,
            tty=False,
            network_mode="none",
            mem_limit=f"{cfg.memory_mb}m",
            memswap_limit=f"{cfg.memory_mb}m",
            pids_limit=cfg.pids,
            nano_cpus=int(cfg.cpus * 1e9),
            read_only=True,
            tmpfs={"/work": f"size={cfg.work_mb}m,mode=1777", "/tmp": f"size={max(cfg.work_mb // 4, 1)}m,mode=1777"},
            cap_drop=["ALL"],
            cap_add=["SETUID", "SETGID", "KILL"],
            security_opt=["no-new-privileges:true"],
            ipc_mode="private",
            shm_size=f"{max(cfg.work_mb // 4, 1)}m",
            environment={"SANDBOX_UID": str(next(self._uids)),
                         "SANDBOX_FORK_INTERPRETER": "1" if cfg.fork_interpreter else "0",
                         "SANDBOX_SECCOMP": base64.b64encode(seccomp.program_filter()).decode()},
            labels={LABEL: "1", f"{LABEL}.owner": self.owner},
            hostname="sandbox",
        )
        if cfg.cgroup_parent:
            kwargs["cgroup_parent"] = cfg.cgroup_parent
        container = client.containers.create(cfg.image, **kwargs)
        try:
            sock = container.attach_socket(params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            container.start()
            box = _Container(container, sock)
            reply = box.call({"op": "ping"}, cfg.start_timeout_s)
            if not reply.get("ok"):
                raise SandboxError(f"the container's supervisor answered {reply}")
            self.counters["containers_started"] += 1
        except BaseException:
            with contextlib.suppress(Exception):
                container.remove(force=True)
            raise
        return box

    def _destroy_all(self) -> None:
        for box in list(self._all):
            box.destroy()
        self._all.clear()
        self._idle.clear()

    # ---- the pool (async)

    async def _in_thread(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    async def _call(self, box: _Container, msg: dict[str, Any], limit_s: float) -> dict[str, Any]:
        return await asyncio.wait_for(self._in_thread(box.call, msg, limit_s), limit_s + 5)

    def _condition(self) -> asyncio.Condition:
        loop = asyncio.get_running_loop()
        if self._cond is None or self._cond_loop is not loop:
            self._cond, self._cond_loop = asyncio.Condition(), loop
        return self._cond

    async def start(self) -> None:
        """Create the warm pool now (otherwise the first run does)."""
        if self._started:
            return
        self._started = True
        try:
            await self._in_thread(self._remove_leftovers)
            boxes = await asyncio.gather(*[self._in_thread(self._create) for _ in range(self.config.pool_size)])
        except BaseException:
            self._started = False
            raise
        self._all.update(boxes)
        self._idle.extend(boxes)

    async def _acquire(self) -> _Container:
        await self.start()
        cond = self._condition()
        async with cond:
            await asyncio.wait_for(cond.wait_for(lambda: bool(self._idle)), 3600)
            return self._idle.popleft()

    async def _release(self, box: _Container, broken: bool) -> None:
        if broken:
            self._all.discard(box)
            await self._in_thread(box.destroy)
            try:
                box = await self._in_thread(self._create)
            except Exception:
                self._started = bool(self._all)  # the next run retries creating the pool
                return
            self._all.add(box)
        cond = self._condition()
        async with cond:
            self._idle.append(box)
            cond.notify()

    # ---- the Sandbox protocol

    async def run(self, request: ExecRequest) -> ExecResult:
        """Run one program in a pooled container; cancelling the call kills the program at
        once (its container is destroyed first, then replaced)."""
        cfg = self.config
        payload = request_payload(request, cfg)
        box = await self._acquire()
        try:
            reply = await self._call(box, {"op": "run", "request": payload}, request.time_limit_s + CALL_GRACE_S)
        except (TimeoutError, SandboxError, OSError, ValueError) as e:
            await self._release(box, True)
            return sandbox_error(f"container failed (it is replaced): {e!r}")
        except BaseException:  # cancelled: the program dies with its container now
            await asyncio.shield(self._release(box, True))
            raise
        await self._release(box, reply.get("status") == "sandbox_error")
        self._count_run(reply)
        return result_from_reply(reply)

    def _count_run(self, reply: dict[str, Any]) -> None:
        if reply.get("status") != "sandbox_error":
            self.counters["runs"] += 1

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[DockerSession]:
        """Borrow one container for an episode; its interpreter is ended (or the container
        replaced) when the block exits, also on failure."""
        box = await self._acquire()
        session = DockerSession(self, box)
        try:
            limits = self.config.for_session().to_wire()
            reply = await self._call(box, {"op": "session_start", "limits": limits}, CALL_GRACE_S)
            if not reply.get("ok"):
                session.broken = True
                raise SandboxError(f"session did not start: {reply.get('error', reply)}")
            yield session
        finally:
            if session.in_call:  # ended while a call is still on the stream (cancelled, or ended
                session.broken = True  # from elsewhere): the container cannot be trusted in step
            if not session.broken:
                try:
                    reply = await self._call(box, {"op": "session_end"}, CALL_GRACE_S)
                    session.broken = not reply.get("ok")
                except (TimeoutError, SandboxError, OSError, ValueError):
                    session.broken = True
            await asyncio.shield(self._release(box, session.broken))

    async def aclose(self) -> None:
        """Remove every container of this pool and close the engine connections (a later run
        opens new ones)."""
        await self._in_thread(self._destroy_all)
        self._started = False
        client, self._client = self._client, None
        if client is not None:
            await self._in_thread(client.close)
