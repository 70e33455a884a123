"""The sandbox service: any Sandbox backend over HTTP, so many training nodes share a fleet.

What it is: a FastAPI app (``build_app``) in front of one backend (LocalSandbox or
DockerSandbox), with a concurrency limit and a bounded queue, API-key authentication when a
key is set, and server-side sessions (persistent interpreters) that expire when idle.
``agentrl sandbox serve`` runs it; ``sandboxes.remote.RemoteSandbox`` is its client.

Routes (JSON bodies are ``ExecRequest.to_dict()`` / ``ExecResult.to_dict()``):
    GET    /health                  {"ok", "backend", "running", "queued", "sessions"} (no key needed)
    POST   /run                     ExecRequest -> ExecResult
    POST   /sessions                -> {"session_id"}
    POST   /sessions/{id}/run       ExecRequest -> ExecResult (in that session's interpreter)
    DELETE /sessions/{id}           ends the session

Errors: 401 wrong or missing key (``Authorization: Bearer KEY``), 422 a malformed request
(the message says which field), 404 unknown session, 503 queue full or backend down.

Trust boundary: the service adds authentication and admission control only; isolation is
the backend's (see ``sandboxes/jail.py`` and ``sandboxes/docker.py``). What is not covered:
TLS (put it behind a TLS proxy when it leaves a private network) and per-client quotas.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

from agentrl.api import ExecRequest, Sandbox
from agentrl.errors import SandboxError

SESSION_IDLE_S = 600.0
QUEUE_WAIT_S = 600.0  # longest a request waits for a free slot before it is refused (503)


class SessionEnded(Exception):
    """Thrown into a session's context to end it at once (a client's DELETE, shutdown)."""


async def _end(s: _Session) -> None:
    """End a session now, even mid-call: the backend kills its interpreter."""
    with contextlib.suppress(Exception):
        await s.stack.__aexit__(SessionEnded, SessionEnded("the session was ended"), None)


@dataclass
class _Session:
    stack: contextlib.AsyncExitStack
    session: Any
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)


class Admission:
    """At most ``max_concurrency`` executions at once and ``max_queue`` waiting; beyond, 503."""

    def __init__(self, max_concurrency: int, max_queue: int) -> None:
        self.sem = asyncio.Semaphore(max_concurrency)
        self.max_queue = max_queue
        self.running = 0
        self.queued = 0

    @contextlib.asynccontextmanager
    async def slot(self):
        if not self.sem.locked():
            await self.sem.acquire()  # a slot is free: taken without waiting
        else:
            if self.queued >= self.max_queue:
                raise HTTPException(503, f"sandbox queue is full ({self.max_queue} waiting); retry later")
            self.queued += 1
            try:
                await asyncio.wait_for(self.sem.acquire(), QUEUE_WAIT_S)
            except TimeoutError as e:
                raise HTTPException(503, f"waited {QUEUE_WAIT_S:.0f} s in the sandbox queue; retry later") from e
            finally:
                self.queued -= 1
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self.sem.release()


def _parse_request(body: Any) -> ExecRequest:
    if not isinstance(body, dict):
        raise HTTPException(422, "the body must be a JSON object: an ExecRequest (code, language, ...)")
    try:
        return ExecRequest.from_dict(body)
    except (TypeError, ValueError) as e:
        raise HTTPException(422, f"not a valid ExecRequest: {e}") from e


def build_app(sandbox: Sandbox, *, backend: str = "", api_key: str = "", max_concurrency: int = 8,
              max_queue: int = 256, max_sessions: int = 256) -> FastAPI:
    """The service app around ``sandbox``; it owns the sandbox's lifetime (closed at shutdown)."""
    admission: Admission | None = None
    sessions: dict[str, _Session] = {}

    def gate() -> Admission:
        nonlocal admission
        if admission is None:  # created in the server's event loop
            admission = Admission(max_concurrency, max_queue)
        return admission

    async def reap_idle() -> None:
        while True:
            await asyncio.sleep(30)
            now = time.monotonic()
            for sid, s in list(sessions.items()):
                if now - s.last_used > SESSION_IDLE_S and not s.lock.locked():
                    sessions.pop(sid, None)
                    await _end(s)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        reaper = asyncio.create_task(reap_idle())
        try:
            yield
        finally:
            reaper.cancel()
            for sid in list(sessions):
                await _end(sessions.pop(sid))
            close = getattr(sandbox, "aclose", None)
            if close is not None:
                await close()

    app = FastAPI(title="agentrl sandbox service", lifespan=lifespan)

    @app.exception_handler(SandboxError)
    async def backend_failed(request: Request, exc: SandboxError) -> JSONResponse:
        # the backend itself is down (no engine, no root): say so; the client may retry elsewhere
        return JSONResponse({"detail": f"sandbox backend failed: {exc}"}, status_code=503)

    @app.middleware("http")
    async def authenticate(request: Request, call_next):
        if api_key and request.url.path != "/health":
            header = request.headers.get("authorization", "")
            given = header[7:] if header.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(given.encode(), api_key.encode()):
                return JSONResponse({"detail": "missing or wrong API key: send 'Authorization: Bearer KEY'"},
                                    status_code=401)
        return await call_next(request)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        g = gate()
        return {"ok": True, "backend": backend, "running": g.running, "queued": g.queued,
                "sessions": len(sessions)}

    @app.post("/run")
    async def run(request: Request) -> dict[str, Any]:
        req = _parse_request(await request.json())
        async with gate().slot():
            try:
                result = await sandbox.run(req)
            except ValueError as e:  # the request itself is wrong (a file name outside the work dir)
                raise HTTPException(422, str(e)) from e
        return result.to_dict()

    @app.post("/sessions")
    async def open_session() -> dict[str, Any]:
        if len(sessions) >= max_sessions:
            raise HTTPException(503, f"too many open sessions ({max_sessions}); retry later")
        stack = contextlib.AsyncExitStack()
        async with gate().slot():
            session = await stack.enter_async_context(sandbox.session())
        sid = uuid.uuid4().hex
        sessions[sid] = _Session(stack, session)
        return {"session_id": sid}

    @app.post("/sessions/{sid}/run")
    async def session_run(sid: str, request: Request) -> dict[str, Any]:
        req = _parse_request(await request.json())
        s = sessions.get(sid)
        if s is None:
            raise HTTPException(404, f"no session {sid!r} (it ended or expired after {SESSION_IDLE_S:.0f} s idle)")
        async with s.lock, gate().slot():
            s.last_used = time.monotonic()
            try:
                result = await s.session.run(req)
            except ValueError as e:
                raise HTTPException(422, str(e)) from e
            s.last_used = time.monotonic()
        return result.to_dict()

    @app.delete("/sessions/{sid}")
    async def close_session(sid: str) -> dict[str, Any]:
        s = sessions.pop(sid, None)
        if s is None:
            raise HTTPException(404, f"no session {sid!r}")
        await _end(s)  # not waiting for a call in flight: its client may be gone
        return {"ok": True}

    return app
