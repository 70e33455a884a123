"""RepoRoutes: the sandbox service's routes for repository episodes (``agentrl/Repo-v0`` on several hosts).

What it is: the server side of ``sandboxes/repo_remote.py``. A repository session is one
container of a task's image from this host's ``RepoPool`` (warm, limited, destroyed at its
end), held as a session of the service (``_Service.hold``): it takes a place in admission,
is ended by ``DELETE /sessions/{id}``, reaped when idle, and destroyed at shutdown with the
pools' idle containers. Every route needs the key when the service has one.

Routes (JSON; bytes travel as base64):
    POST /repo/sessions               {"spec": ContainerSpec fields, "warm", "max_output"}
                                      -> {"session_id", "workdir"}
    POST /repo/sessions/{id}/bash     {"command", "timeout_s"} -> CommandResult fields
    POST /repo/sessions/{id}/exec     {"cmd", "stdin_b64", "timeout_s", "workdir", "env"}
                                      -> {"exit_code", "output_b64", "timed_out"}
    POST /repo/sessions/{id}/read     {"path"} -> {"data_b64"} (null: no such file)
    POST /repo/sessions/{id}/write    {"path", "data_b64"}
    POST /repo/sessions/{id}/tree     {"path", "files_b64": {name: base64}}
    POST /repo/sessions/{id}/kill     -> {"killed"}

Errors as the service's others (``agentrl.http_edge``): 422 a malformed body or a
``memory_mb`` above ``--max-memory-mb``, 404 an unknown session, 500 the episode's container
failed (gone, past its disk limit: the episode fails), 503 the engine is unreachable or the
image absent. What it is not: grading (the client runs ``envs/repo/grading.py`` through these
routes) or image builds (a task's image must be on the host: pull or build it there).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request

from agentrl.config import option
from agentrl.errors import Refused, SandboxError
from agentrl.http_edge import parse_body, read_json
from sandboxes.repo_container import ContainerSpec
from sandboxes.repo_pool import RepoPool, RepoSession


@dataclass
class OpenCall:
    spec: dict[str, Any] = option(help="the ContainerSpec's fields (env as [[name, value], ...])")
    warm: int = option(1, ge=0, help="idle started containers this host keeps for the spec")
    max_output: int = option(10_000, ge=256, help="bytes of a shell command's output returned (middle cut)")


@dataclass
class BashCall:
    command: str = option(help="one command line for the persistent shell")
    timeout_s: float = option(60.0, gt=0, help="seconds before it is killed")


@dataclass
class ExecCall:
    cmd: list[str] = option(help="the program and its arguments")
    stdin_b64: str = option("", help="its standard input")
    timeout_s: float = option(60.0, gt=0, help="seconds before it is killed")
    workdir: str = option("", help="its working directory; empty: the container's")
    env: dict[str, str] = field(default_factory=dict, metadata={"help": "extra environment variables"})


@dataclass
class FileCall:
    path: str = option(help="an absolute path in the container")
    data_b64: str = option("", help="the bytes to write (write)")


@dataclass
class TreeCall:
    path: str = option(help="the folder to fill in the container")
    files_b64: dict[str, str] = field(default_factory=dict, metadata={"help": "relative name -> bytes"})


def _spec(data: dict[str, Any], most_memory_mb: int) -> ContainerSpec:
    env = data.pop("env", [])
    if not isinstance(env, list) or not all(isinstance(p, list) and len(p) == 2 for p in env):
        raise Refused('spec.env must be a list of [name, value] pairs, e.g. [["LANG", "C.UTF-8"]]', 422)
    spec = parse_body(ContainerSpec, data, {"memory_mb": ("max_memory_mb", most_memory_mb)})
    return dataclasses.replace(spec, env=tuple((str(k), str(v)) for k, v in env))


class RepoRoutes:
    """The repository routes of one service (see the module docstring)."""

    def __init__(self, service: Any) -> None:
        self.service = service  # sandboxes.service._Service: its sessions, admission and ceilings
        self.pools: dict[tuple[int, int], RepoPool] = {}

    def install(self, app: FastAPI) -> None:
        app.add_api_route("/repo/sessions", self.open, methods=["POST"])
        for name in ("bash", "exec", "read", "write", "tree", "kill"):
            app.add_api_route(f"/repo/sessions/{{sid}}/{name}", getattr(self, name), methods=["POST"])

    async def aclose(self) -> None:
        for pool in self.pools.values():
            await pool.aclose()

    async def _body(self, request: Request, cls: type) -> Any:
        limit = self.service.limits.max_request_bytes
        return parse_body(cls, await read_json(request, limit, "max_request_bytes"))

    @contextlib.asynccontextmanager
    async def _using(self, sid: str) -> AsyncIterator[RepoSession]:
        s = self.service.held(sid, "repo")
        async with s.lock:
            s.last_used = time.monotonic()
            try:
                yield s.session
            except SandboxError as e:
                raise Refused(f"the episode's container failed: {e}", 500) from e
            finally:
                s.last_used = time.monotonic()

    async def open(self, request: Request) -> dict[str, Any]:
        call = await self._body(request, OpenCall)
        spec = _spec(dict(call.spec), self.service.limits.max_memory_mb)
        key = (call.warm, call.max_output)
        if key not in self.pools:
            self.pools[key] = RepoPool(warm=call.warm, max_output=call.max_output)
        sid, session = await self.service.hold(self.pools[key].episode(spec), "repo")
        return {"session_id": sid, "workdir": session.workdir}

    async def bash(self, sid: str, request: Request) -> dict[str, Any]:
        call = await self._body(request, BashCall)
        async with self._using(sid) as session:
            return dataclasses.asdict(await session.bash(call.command, call.timeout_s))

    async def exec(self, sid: str, request: Request) -> dict[str, Any]:
        call = await self._body(request, ExecCall)
        async with self._using(sid) as session:
            out = await session.exec(call.cmd, stdin=base64.b64decode(call.stdin_b64) if call.stdin_b64 else None,
                                     timeout_s=call.timeout_s, workdir=call.workdir or None, env=call.env or None)
        return {"exit_code": out.exit_code, "output_b64": base64.b64encode(out.output).decode(),
                "timed_out": out.timed_out}

    async def read(self, sid: str, request: Request) -> dict[str, Any]:
        call = await self._body(request, FileCall)
        async with self._using(sid) as session:
            try:
                data = await session.read_file(call.path)
            except FileNotFoundError:
                return {"data_b64": None}
        return {"data_b64": base64.b64encode(data).decode()}

    async def write(self, sid: str, request: Request) -> dict[str, Any]:
        call = await self._body(request, FileCall)
        async with self._using(sid) as session:
            await session.write_file(call.path, base64.b64decode(call.data_b64))
        return {"ok": True}

    async def tree(self, sid: str, request: Request) -> dict[str, Any]:
        call = await self._body(request, TreeCall)
        files = {name: base64.b64decode(data) for name, data in call.files_b64.items()}
        async with self._using(sid) as session:
            await session.put_tree(call.path, files)
        return {"ok": True}

    async def kill(self, sid: str) -> dict[str, Any]:
        async with self._using(sid) as session:
            return {"killed": await session.kill_processes()}
