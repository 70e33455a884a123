"""RepoFleet: repository episodes' containers on sandbox services (``agentrl sandbox serve``), several hosts.

What it is: the client of ``sandboxes/repo_routes.py`` with the interface the local pool has,
so ``agentrl/Repo-v0`` and its grading run unchanged on either: ``RepoFleet.episode(spec)``
(as ``RepoPool.episode``) opens a container on the least busy service of its list
(``SandboxFleet.held``: a service that cannot be reached or is saturated when the episode
starts is skipped), and ``RemoteRepoSession`` has ``RepoSession``'s coroutines (``bash``,
``exec``, ``read_file``, ``write_file``, ``put_tree``, ``kill_processes``, ``workdir``).
A host lost mid-episode raises ``SandboxError`` from the episode's next call: the episode
fails (a failed trajectory, data), the run and the other hosts' episodes go on; a lost
host's session is not closed again (its containers went with it, or its owner's reaper
removes them: ``remove_leftovers``). The API key comes from the argument or
``AGENTRL_SANDBOX_API_KEY``.

What it is not: image builds — a task's image must be on every host (pulled or built there);
``build_image`` says so.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from agentrl.errors import SandboxError, SandboxUnavailable
from sandboxes.fleet import SandboxFleet
from sandboxes.remote import NETWORK_GRACE_S, RemoteSandbox
from sandboxes.repo_container import ContainerSpec, ExecOutput
from sandboxes.repo_shell import CommandResult

LOST = (httpx.NetworkError, httpx.RemoteProtocolError)
"""A call's connection failed or broke: the host is taken as gone."""
START_S = 300.0
"""Seconds a service may take to start an episode's container (its engine may be busy)."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class RemoteRepoSession:
    """One episode's container on a service; the interface of ``RepoSession``."""

    def __init__(self, host: RemoteSandbox, session_id: str, workdir: str) -> None:
        self.host, self.session_id, self.workdir = host, session_id, workdir
        self.lost = False  # the host could not be reached: nothing to close there

    async def _call(self, route: str, body: dict[str, Any] | None, limit_s: float) -> Any:
        try:
            return await self.host._post(f"/repo/sessions/{self.session_id}/{route}", body, limit_s)
        except SandboxError as e:
            if not isinstance(e, SandboxUnavailable) and not isinstance(e.__cause__, LOST):
                raise
            self.lost = True
            raise SandboxError(f"the episode's host {self.host.url} was lost: {e}") from e

    async def bash(self, command: str, timeout_s: float) -> CommandResult:
        data = await self._call("bash", {"command": command, "timeout_s": timeout_s}, timeout_s + 60 + NETWORK_GRACE_S)
        return CommandResult(**data)

    async def exec(self, cmd: list[str], *, stdin: bytes | None = None, timeout_s: float = 60.0,
                   workdir: str | None = None, env: dict[str, str] | None = None) -> ExecOutput:
        body = {"cmd": cmd, "stdin_b64": _b64(stdin or b""), "timeout_s": timeout_s, "workdir": workdir or "",
                "env": env or {}}
        data = await self._call("exec", body, timeout_s + 60 + NETWORK_GRACE_S)
        return ExecOutput(data["exit_code"], base64.b64decode(data["output_b64"]), data["timed_out"])

    async def read_file(self, path: str) -> bytes:
        data = (await self._call("read", {"path": path}, 120))["data_b64"]
        if data is None:
            raise FileNotFoundError(path)
        return base64.b64decode(data)

    async def write_file(self, path: str, data: bytes) -> None:
        await self._call("write", {"path": path, "data_b64": _b64(data)}, 120)

    async def put_tree(self, path: str, files: dict[str, bytes]) -> None:
        await self._call("tree", {"path": path, "files_b64": {k: _b64(v) for k, v in files.items()}}, 180)

    async def kill_processes(self) -> int:
        """Kill everything the episode runs, the shell included (before grading in place)."""
        return int((await self._call("kill", None, 120))["killed"])


@contextlib.asynccontextmanager
async def remote_episode(host: RemoteSandbox, spec: ContainerSpec, *, warm: int = 1,
                         max_output: int = 10_000) -> AsyncIterator[RemoteRepoSession]:
    """A container of ``spec`` on ``host`` for one episode, ended there when the block exits."""
    body = {"spec": {**dataclasses.asdict(spec), "env": [list(p) for p in spec.env]}, "warm": warm,
            "max_output": max_output}
    data = await host._post("/repo/sessions", body, START_S)
    session = RemoteRepoSession(host, data["session_id"], data["workdir"])
    try:
        yield session
    finally:
        if not session.lost:
            with contextlib.suppress(SandboxError):
                await asyncio.shield(host._send("DELETE", f"/sessions/{session.session_id}", None, NETWORK_GRACE_S))


class RepoFleet:
    """Repository episodes spread over sandbox services; the interface of ``RepoPool``."""

    def __init__(self, urls: Sequence[str], api_key: str | None = None, *, warm: int = 1, max_output: int = 10_000,
                 **options: Any) -> None:
        self.fleet = SandboxFleet(urls, api_key, **options)
        self.warm, self.max_output = warm, max_output

    async def in_thread(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    def build_image(self, context: Any, tag: str) -> None:
        raise SandboxUnavailable(f"the episodes run on sandbox services {self.fleet.urls}, which build no images: "
                                 f"build {context} as {tag!r} on each host (docker build -t {tag} {context}), or give "
                                 "the task an image its hosts have")

    def episode(self, spec: ContainerSpec) -> contextlib.AbstractAsyncContextManager[RemoteRepoSession]:
        """A container of ``spec`` on the least busy service, for one episode."""
        return self.fleet.held(lambda host: remote_episode(host, spec, warm=self.warm, max_output=self.max_output),
                               "started a repository container")

    async def aclose(self) -> None:
        await self.fleet.aclose()


_SHARED: dict[tuple, RepoFleet] = {}


def shared_repo_fleet(urls: Sequence[str], *, warm: int = 1, max_output: int = 10_000) -> RepoFleet:
    """One fleet per process and settings: a run's envs share its counts of episodes per host."""
    key = (tuple(urls), warm, max_output)
    if key not in _SHARED:
        _SHARED[key] = RepoFleet(urls, warm=warm, max_output=max_output)
    return _SHARED[key]
