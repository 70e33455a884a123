"""The sandbox service: any Sandbox backend over HTTP, so many training nodes share a fleet.

What it is: a FastAPI app (``build_app``) in front of one backend (LocalSandbox or
DockerSandbox), with admission control (``sandboxes/admission.py``: the operator's ceilings on
every limit, a concurrency limit that open sessions count against, a bounded queue), API-key
authentication when a key is set, and server-side sessions (persistent interpreters) that
expire when idle. ``agentrl sandbox serve`` runs it; ``sandboxes.remote.RemoteSandbox`` is its
client.

Routes (JSON bodies are ``ExecRequest.to_dict()`` / ``ExecResult.to_dict()``):
    GET    /health                  {"ok", "backend", "running", "queued", "sessions",
                                     "session_cpu_s": [CPU seconds of each open session],
                                     "ceilings": {...}} (no key needed)
    POST   /run                     ExecRequest -> ExecResult
    POST   /sessions                -> {"session_id"}   (holds a place until it ends)
    POST   /sessions/{id}/run       ExecRequest -> ExecResult (in that session's interpreter)
    DELETE /sessions/{id}           ends the session (a repository session too)
    POST   /repo/sessions[/{id}/...] repository episodes' containers (``sandboxes/repo_routes.py``)
    GET    /openapi.json            these routes, with the ExecRequest as JSON Schema within the
                                    ceilings (``exec_request_schema``; fuzzed from it by
                                    ``tests/sandboxes/test_fuzz.py``)

Errors, each in OpenAI's body ``{"error": {"message", "type", "param", "code"}}``
(``agentrl.http_edge``): 400 a body that is not a JSON object, 401 wrong or missing key
(``Authorization: Bearer KEY``; every route but ``/health`` needs it, ``/openapi.json`` and
``/docs`` included), 413 a body, code or files above a ceiling, 422 a malformed request or a
limit above a ceiling (the message names the field or the ceiling), 404 unknown session, 503
queue full or backend down. ``sandbox_error`` results are the backend's own failures only.

A client that disconnects while its program runs (or waits) gets it killed at once and its
place freed; for a session call, the whole session ends.

Trust boundary: the service adds authentication and admission control only; isolation is
the backend's (see ``sandboxes/jail.py`` and ``sandboxes/docker.py``). What is not covered:
TLS (put it behind a TLS proxy when it leaves a private network) and per-client quotas.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agentrl.api import ExecRequest, ExecResult, Sandbox
from agentrl.errors import Refused, SandboxError
from agentrl.http_edge import ApiKey, body_schema, error_response, install_errors, json_body, read_body
from sandboxes.admission import Admission, Ceilings, maxima, parse_request
from sandboxes.repo_routes import RepoRoutes

SESSION_IDLE_S = 600.0
CLIENT_GONE = 499  # (nginx's code) the client closed the connection; nobody reads the reply


def exec_request_schema(ceilings: Ceilings) -> dict[str, Any]:
    """The ExecRequest body of ``/run`` and ``/sessions/{id}/run`` as JSON Schema, within this
    service's ``ceilings``, for its OpenAPI document (``GET /openapi.json``: client generators
    and ``tests/sandboxes/test_fuzz.py``): derived from the ExecRequest's declaration
    (``agentrl.http_edge.body_schema``), with what the parser checks beyond it (paths inside the
    work dir, base64, sizes in bytes) described. It describes, it does not enforce: the routes
    parse bodies themselves (``sandboxes.admission.parse_request``)."""
    schema = body_schema(ExecRequest, maxima(ceilings))
    props = schema["properties"]
    name = {"type": "string", "minLength": 1, "pattern": "^[^/]", "description": "a relative path in the work dir"}
    props["code"]["description"] += f"; at most {ceilings.max_code_bytes} UTF-8 bytes"
    props["files"]["propertyNames"] = props["files_b64"]["propertyNames"] = props["fetch"]["items"] = name
    props["files"]["description"] += f"; with files_b64, at most {ceilings.max_file_bytes} bytes"
    props["files_b64"]["additionalProperties"] = {"type": "string", "pattern": "^([A-Za-z0-9+/]{4})*$"}
    return schema


class SessionEnded(Exception):
    """Thrown into a session's context to end it at once (a client's DELETE, shutdown)."""


class ClientGone(Exception):
    """The HTTP client disconnected before its result was ready."""


async def _end(s: _Session) -> None:
    """End a session now, even mid-call: the backend kills its interpreter, and its place
    in admission is freed."""
    with contextlib.suppress(Exception):
        await s.stack.__aexit__(SessionEnded, SessionEnded("the session was ended"), None)


@dataclass
class _Session:
    stack: contextlib.AsyncExitStack
    session: Any
    kind: str = "python"  # or "repo": a repository episode's container (``sandboxes/repo_routes.py``)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)


async def _unless_gone(request: Request, work: Awaitable[ExecResult]) -> ExecResult:
    """Await ``work`` unless the client disconnects first: then cancel it (the backend kills
    the program) and raise ClientGone."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise ClientGone
    finally:
        watch.cancel()
        if not task.done():  # (we were cancelled ourselves)
            task.cancel()


def build_app(sandbox: Sandbox, *, backend: str = "", api_key: str = "", max_concurrency: int = 8,
              max_queue: int = 256, max_sessions: int = 256, ceilings: Ceilings | None = None) -> FastAPI:
    """The service app around ``sandbox``; it owns the sandbox's lifetime (closed at shutdown)."""
    service = _Service(sandbox, backend, ceilings or Ceilings(), max_concurrency, max_queue, max_sessions)
    app = FastAPI(title="agentrl sandbox service", lifespan=service.lifespan)
    if api_key:
        app.add_middleware(ApiKey, key=api_key)
    install_errors(app)
    app.add_exception_handler(SandboxError, _backend_failed)
    app.add_exception_handler(ClientGone, _client_gone)
    exec_body = json_body(exec_request_schema(service.limits))
    app.add_api_route("/health", service.health, methods=["GET"])
    app.add_api_route("/run", service.run, methods=["POST"], openapi_extra=exec_body)
    app.add_api_route("/sessions", service.open_session, methods=["POST"])
    app.add_api_route("/sessions/{sid}/run", service.session_run, methods=["POST"], openapi_extra=exec_body)
    app.add_api_route("/sessions/{sid}", service.close_session, methods=["DELETE"])
    service.repo.install(app)
    return app


async def _backend_failed(request: Request, exc: Exception) -> JSONResponse:
    # the backend itself is down (no engine, no root): say so; the client may retry elsewhere
    return error_response(Refused(f"sandbox backend failed: {exc}", 503))


async def _client_gone(request: Request, exc: Exception) -> JSONResponse:
    return error_response(Refused("the client disconnected; its program was killed", CLIENT_GONE))


class _Service:
    """What the routes share: the backend, the admission gate, the open sessions; one method per route."""

    def __init__(self, sandbox: Sandbox, backend: str, limits: Ceilings, max_concurrency: int, max_queue: int,
                 max_sessions: int) -> None:
        self.sandbox, self.backend, self.limits = sandbox, backend, limits
        self.max_concurrency, self.max_queue, self.max_sessions = max_concurrency, max_queue, max_sessions
        self.admission: Admission | None = None
        self.sessions: dict[str, _Session] = {}
        self.repo = RepoRoutes(self)

    def gate(self) -> Admission:
        if self.admission is None:  # created in the server's event loop
            self.admission = Admission(self.max_concurrency, self.max_queue)
        return self.admission

    async def reap_idle(self) -> None:
        while True:
            await asyncio.sleep(30)
            now = time.monotonic()
            for sid, s in list(self.sessions.items()):
                if now - s.last_used > SESSION_IDLE_S and not s.lock.locked():
                    self.sessions.pop(sid, None)
                    await _end(s)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI):
        reaper = asyncio.create_task(self.reap_idle())
        try:
            yield
        finally:
            reaper.cancel()
            for sid in list(self.sessions):
                await _end(self.sessions.pop(sid))
            await self.repo.aclose()
            close = getattr(self.sandbox, "aclose", None)
            if close is not None:
                await close()

    async def health(self) -> dict[str, Any]:
        g = self.gate()
        return {"ok": True, "backend": self.backend, "running": g.running, "queued": g.queued,
                "sessions": len(self.sessions),
                "session_cpu_s": [round(float(getattr(s.session, "cpu_s", 0.0)), 3) for s in self.sessions.values()],
                "ceilings": dataclasses.asdict(self.limits)}

    async def _request(self, request: Request) -> ExecRequest:
        return parse_request(await read_body(request, self.limits.max_request_bytes, "max_request_bytes"), self.limits)

    async def run(self, request: Request) -> dict[str, Any]:
        req = await self._request(request)

        async def admitted() -> ExecResult:
            async with self.gate().slot():
                return await self.sandbox.run(req)

        try:
            result = await _unless_gone(request, admitted())
        except ValueError as e:  # the request itself is wrong (e.g. too big for the backend's work dir)
            raise Refused(str(e), 422) from e
        return result.to_dict()

    async def hold(self, opened: contextlib.AbstractAsyncContextManager, kind: str) -> tuple[str, Any]:
        """Enter ``opened`` as a new session of ``kind`` holding a place in admission until it
        ends; returns its id and the object it yielded."""
        if len(self.sessions) >= self.max_sessions:
            raise Refused(f"too many open sessions ({self.max_sessions}); retry later", 503)
        stack = contextlib.AsyncExitStack()
        try:
            await stack.enter_async_context(self.gate().slot())  # held until the session ends
            session = await stack.enter_async_context(opened)
        except BaseException:
            await stack.aclose()
            raise
        sid = uuid.uuid4().hex
        self.sessions[sid] = _Session(stack, session, kind)
        return sid, session

    def held(self, sid: str, kind: str) -> _Session:
        s = self.sessions.get(sid)
        if s is None or s.kind != kind:
            raise Refused(f"no session {sid!r} (it ended or expired after {SESSION_IDLE_S:.0f} s idle)", 404)
        return s

    async def open_session(self) -> dict[str, Any]:
        sid, _ = await self.hold(self.sandbox.session(), "python")
        return {"session_id": sid}

    async def session_run(self, sid: str, request: Request) -> dict[str, Any]:
        req = await self._request(request)
        s = self.held(sid, "python")

        async def call() -> ExecResult:
            async with s.lock:
                s.last_used = time.monotonic()
                try:
                    return await s.session.run(req)
                finally:
                    s.last_used = time.monotonic()

        try:
            result = await _unless_gone(request, call())
        except ValueError as e:
            raise Refused(str(e), 422) from e
        except ClientGone:  # its program was killed mid-call: the session is over
            if self.sessions.pop(sid, None) is not None:
                await _end(s)
            raise
        return result.to_dict()

    async def close_session(self, sid: str) -> dict[str, Any]:
        s = self.sessions.pop(sid, None)
        if s is None:
            raise Refused(f"no session {sid!r}", 404)
        await _end(s)  # not waiting for a call in flight: its client may be gone
        return {"ok": True}
