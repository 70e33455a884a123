"""RepoPool: warm containers of task images, one per episode, destroyed after it; and RepoSession.

What it is: the async front of repository tasks. ``async with pool.episode(spec) as session``
hands out a container of ``spec`` (a task image and its limits) that is already started,
prepared and running its persistent shell, so an episode does not wait for a container start;
when the block exits, whatever happened (failure, cancellation), the container is destroyed —
nothing the episode started survives it. Each spec keeps ``warm`` idle containers, grown to
the number of its episodes running at once (the run's concurrency) up to ``max_warm``;
refills run in the background. At start the pool removes the labelled containers of
owners on this host that are gone (a killed run's), and at exit (``aclose``, or ``atexit``)
its own.

Disk: where the engine has no writable-layer quota, a watchdog reads each container's layer
size every ``disk_poll_s`` and destroys one past ``disk_mb``: its episode's next command
fails with ``SandboxError`` (an episode failure, data), and the host's disk is spared.

``RepoSession`` wraps one container and its shell with coroutines (each blocking call runs
in the pool's threads, with a deadline): ``bash``, ``exec``, ``read_file``, ``write_file``,
``put_tree``, ``kill_processes``.

What it is not: the task formats or grading (``envs/repo/``). Uses the ``docker`` SDK against
``DOCKER_HOST`` (podman's Docker-compatible socket too), as ``DockerSandbox`` does.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import contextlib
import dataclasses
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from agentrl.config import from_dict, option
from agentrl.errors import SandboxError, SandboxUnavailable
from sandboxes.docker import engine_client, remove_leftovers
from sandboxes.repo_container import LABEL, ContainerSpec, ExecOutput, RepoContainer
from sandboxes.repo_shell import BashSession, CommandResult


@dataclass
class RepoPoolConfig:
    docker_host: str = option("", help="engine URL; empty = DOCKER_HOST or the default socket")
    warm: int = option(1, help="idle started containers kept per image (0: start each on demand)", ge=0)
    max_warm: int = option(32, help="the most idle containers per image, however many episodes run at once", ge=0)
    max_output: int = option(10_000, help="bytes of a command's output the model reads (middle cut)", ge=256)
    disk_poll_s: float = option(1.0, help="seconds between the disk watchdog's reads (engines without a quota)", gt=0)
    threads: int = option(128, help="threads for the blocking engine calls (one per running command)", ge=4)


class RepoSession:
    """One episode's container and persistent shell (see the module docstring)."""

    def __init__(self, pool: RepoPool, box: RepoContainer, shell: BashSession) -> None:
        self.pool, self.box, self.shell = pool, box, shell
        self.disk_exceeded = False

    @property
    def workdir(self) -> str:
        return self.box.workdir

    def _check(self) -> None:
        if self.disk_exceeded:
            raise SandboxError(f"the episode's container was destroyed: its files passed the disk limit "
                               f"({self.box.spec.disk_mb} MB)")
        if self.box.destroyed:
            raise SandboxError("the episode's container is gone")

    async def _call(self, limit_s: float, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self._check()
        try:
            return await asyncio.wait_for(self.pool.in_thread(fn, *args, **kwargs), limit_s)
        except FileNotFoundError:  # an answer about the container's files, not a failure
            raise
        except (OSError, ValueError, SandboxError) as e:
            self._check()  # the watchdog's destruction explains the failure better
            if isinstance(e, SandboxError):
                raise
            raise SandboxError(f"the container's engine call failed: {e!r}") from e

    async def bash(self, command: str, timeout_s: float) -> CommandResult:
        """Run one command in the persistent shell."""
        return await self._call(timeout_s + 60, self.shell.run, command, timeout_s)

    async def exec(self, cmd: list[str], *, stdin: bytes | None = None, timeout_s: float = 60.0,
                   workdir: str | None = None, env: dict[str, str] | None = None) -> ExecOutput:
        """Run a program through ``docker exec`` (not in the shell)."""
        return await self._call(timeout_s + 60, self.box.exec, cmd, stdin=stdin, timeout_s=timeout_s,
                                workdir=workdir, env=env)

    async def read_file(self, path: str) -> bytes:
        return await self._call(120, self.box.read_file, path)

    async def write_file(self, path: str, data: bytes) -> None:
        await self._call(120, self.box.write_file, path, data)

    async def put_tree(self, path: str, files: dict[str, bytes]) -> None:
        await self._call(180, self.box.put_tree, path, files)

    async def kill_processes(self) -> int:
        """Kill everything the episode runs, the shell included (before grading in place)."""
        return await self._call(120, self.box.kill_processes)


class RepoPool:
    """Warm containers per ``ContainerSpec``; see the module docstring."""

    def __init__(self, config: RepoPoolConfig | None = None, **overrides: Any) -> None:
        base = dataclasses.asdict(config or RepoPoolConfig())
        self.config = from_dict(RepoPoolConfig, {**base, **overrides})
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self.counters: collections.Counter[str] = collections.Counter()
        """``containers_started``, ``episodes``, ``warm_hits`` (an episode got a started container),
        ``disk_kills`` (containers the watchdog destroyed)."""
        self._threads = concurrent.futures.ThreadPoolExecutor(self.config.threads, "repo-pool")
        self._client: Any = None
        self._quota: bool | None = None  # does the engine bound the writable layer (storage_opt)?
        self._idle: dict[ContainerSpec, collections.deque[RepoSession]] = collections.defaultdict(collections.deque)
        self._busy: dict[ContainerSpec, int] = collections.Counter()
        self._starting: dict[ContainerSpec, int] = collections.Counter()
        self._live: set[RepoSession] = set()
        self._watchdog: asyncio.Task | None = None
        self._refills: set[asyncio.Task] = set()
        atexit.register(self._destroy_all)

    async def in_thread(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, lambda: fn(*args, **kwargs))

    # ---- containers (blocking)

    def _connect(self) -> Any:
        if self._client is None:
            client = engine_client(self.config.docker_host)
            remove_leftovers(client, LABEL)
            self._client = client
        return self._client

    def build_image(self, context: Any, tag: str) -> None:
        """Build ``context`` (a folder with a Dockerfile) as ``tag`` unless the engine has it (blocking)."""
        client = self._connect()
        try:
            client.images.get(tag)
        except Exception:
            try:
                client.images.build(path=str(context), tag=tag, rm=True, labels={"agentrl.repo.image": "1"})
            except Exception as e:
                raise SandboxUnavailable(f"could not build {tag} from {context}: {e}") from e

    def _new_session(self, spec: ContainerSpec) -> RepoSession:
        client = self._connect()
        try:
            client.images.get(spec.image)
        except Exception as e:
            raise SandboxUnavailable(f"task image {spec.image!r} is not on the engine ({e}); pull or build it "
                                     "first (`make repo-images` builds the test tasks' image)") from e
        box = self._start_box(client, spec)
        try:
            shell = BashSession(box, max_output=self.config.max_output)
        except BaseException:
            box.destroy()
            raise
        self.counters["containers_started"] += 1
        session = RepoSession(self, box, shell)
        self._live.add(session)  # here, in the thread: a start whose awaiting task was cancelled is still destroyed at exit
        return session

    def _start_box(self, client: Any, spec: ContainerSpec) -> RepoContainer:
        if self._quota is None:  # ask the engine once whether it bounds the writable layer
            try:
                box = RepoContainer.start(client, spec, self.owner, quota=True)
                self._quota = True
                return box
            except Exception as e:
                if "storage" not in str(e).lower():
                    raise
                self._quota = False
        return RepoContainer.start(client, spec, self.owner, quota=self._quota)

    def _destroy_all(self) -> None:
        for session in list(self._live):
            session.shell.close()
            session.box.destroy()
        self._live.clear()
        self._idle.clear()

    # ---- the pool (async)

    async def _take(self, spec: ContainerSpec) -> RepoSession:
        idle = self._idle[spec]
        if idle:
            self.counters["warm_hits"] += 1
            return idle.popleft()
        return await self.in_thread(self._new_session, spec)

    def _refill(self, spec: ContainerSpec) -> None:
        want = min(self.config.max_warm, max(self.config.warm, self._busy[spec]))
        for _ in range(want - len(self._idle[spec]) - self._starting[spec]):
            self._starting[spec] += 1
            task = asyncio.get_running_loop().create_task(self._warm_one(spec))
            self._refills.add(task)
            task.add_done_callback(self._refills.discard)

    async def _warm_one(self, spec: ContainerSpec) -> None:
        try:
            self._idle[spec].append(await self.in_thread(self._new_session, spec))
        except Exception:  # the next episode starts its own and sees the error
            pass
        finally:
            self._starting[spec] -= 1

    async def prewarm(self, spec: ContainerSpec, n: int | None = None) -> None:
        """Start ``n`` (default ``warm``) idle containers of ``spec`` now and wait for them."""
        n = self.config.warm if n is None else n
        self._idle[spec].extend(await asyncio.gather(*[self.in_thread(self._new_session, spec) for _ in range(n)]))

    @contextlib.asynccontextmanager
    async def episode(self, spec: ContainerSpec) -> AsyncIterator[RepoSession]:
        """A started container of ``spec`` for one episode, destroyed when the block exits."""
        session = await self._take(spec)
        self.counters["episodes"] += 1
        self._busy[spec] += 1
        self._ensure_watchdog()
        try:
            self._refill(spec)
            yield session
        finally:
            self._busy[spec] -= 1
            self._live.discard(session)
            await asyncio.shield(self.in_thread(self._end, session))

    @staticmethod
    def _end(session: RepoSession) -> None:
        session.shell.close()
        session.box.destroy()

    def _ensure_watchdog(self) -> None:
        if self._quota is False and (self._watchdog is None or self._watchdog.done()):
            self._watchdog = asyncio.get_running_loop().create_task(self._watch_disk())

    async def _watch_disk(self) -> None:
        while any(self._busy.values()):
            for session in [s for s in self._live if not s.box.destroyed]:
                with contextlib.suppress(Exception):
                    used = await self.in_thread(session.box.disk_used_mb)
                    if used > session.box.spec.disk_mb:
                        session.disk_exceeded = True
                        self.counters["disk_kills"] += 1
                        await self.in_thread(session.box.destroy)
            await asyncio.sleep(self.config.disk_poll_s)

    async def aclose(self) -> None:
        """Destroy every container of this pool (idle and in use)."""
        for task in list(self._refills):
            task.cancel()
        if self._watchdog is not None:
            self._watchdog.cancel()
        await self.in_thread(self._destroy_all)
        client, self._client = self._client, None
        if client is not None:
            await self.in_thread(client.close)


_SHARED: dict[tuple, RepoPool] = {}


def shared_repo_pool(config: RepoPoolConfig | None = None) -> RepoPool:
    """One pool per process and config: the envs of a run share their warm containers."""
    config = config or RepoPoolConfig()
    key = tuple(sorted(dataclasses.asdict(config).items()))
    if key not in _SHARED:
        from agentrl.plugins import SHARED_SANDBOXES

        _SHARED[key] = RepoPool(config)
        SHARED_SANDBOXES[f"repo-pool:{key}"] = _SHARED[key]  # its counters reach the run's summary
    return _SHARED[key]
