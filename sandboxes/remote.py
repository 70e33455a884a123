"""RemoteSandbox: the client of the sandbox service (``agentrl sandbox serve``).

What it is: the Sandbox interface over HTTP (httpx), so a training node runs its programs
on a shared sandbox fleet. ``make_sandbox("http://host:port")`` builds one. What it is not:
a sandbox itself — isolation is the service's backend's.

Retries only what is safe: a 503 (queue full, nothing ran) and a refused connection are
retried with backoff up to ``retries`` times; a request that may have run is never resent.
The API key comes from the argument or ``AGENTRL_SANDBOX_API_KEY``.
Main hooks: ``await RemoteSandbox(url).run(req)``, ``async with sb.session() as s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from collections.abc import AsyncIterator
from typing import Any

import httpx

from agentrl.api import ExecRequest, ExecResult
from agentrl.errors import SandboxError, SandboxUnavailable

NETWORK_GRACE_S = 30.0
"""Seconds allowed beyond a program's time limit for queueing, transfer and the backend."""


class RemoteSession:
    """A session held by the service; ended by ``RemoteSandbox.session`` on exit."""

    def __init__(self, sandbox: RemoteSandbox, session_id: str) -> None:
        self._sandbox = sandbox
        self.session_id = session_id

    async def run(self, request: ExecRequest) -> ExecResult:
        data = await self._sandbox._post(f"/sessions/{self.session_id}/run", request.to_dict(),
                                         request.time_limit_s + NETWORK_GRACE_S)
        return ExecResult.from_dict(data)


class RemoteSandbox:
    """Runs programs on a sandbox service at ``url``."""

    def __init__(self, url: str, api_key: str | None = None, *, retries: int = 5,
                 connect_timeout_s: float = 5.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        key = api_key if api_key is not None else os.environ.get("AGENTRL_SANDBOX_API_KEY", "")
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.retries = retries
        self.connect_timeout_s = connect_timeout_s
        self._transport = transport
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()  # one client per event loop (tests run several)
        client = self._clients.get(loop)
        if client is None:
            client = httpx.AsyncClient(base_url=self.url, headers=self._headers, transport=self._transport,
                                       timeout=httpx.Timeout(60.0, connect=self.connect_timeout_s))
            self._clients[loop] = client
        return client

    async def _send(self, method: str, path: str, body: Any, limit_s: float) -> Any:
        delay = 0.2
        for attempt in range(self.retries + 1):
            try:
                resp = await self._client().request(method, path, json=body, timeout=limit_s)
            except httpx.ConnectError as e:
                if attempt == self.retries:
                    raise SandboxUnavailable(f"sandbox service at {self.url} cannot be reached: {e}") from e
            except httpx.TimeoutException as e:
                raise SandboxError(f"sandbox service at {self.url} did not answer in {limit_s:.0f} s") from e
            except httpx.TransportError as e:  # the connection broke mid-call: it may have run, so not resent
                raise SandboxError(f"sandbox service at {self.url} dropped the call: {e!r}") from e
            else:
                if resp.status_code == 503 and attempt < self.retries:
                    pass  # queue full: nothing ran, safe to retry
                elif resp.status_code >= 400:
                    try:  # OpenAI's error body (agentrl.http_edge); FastAPI's {"detail"} from older services
                        body = resp.json()
                        error = body.get("error") if isinstance(body, dict) else None
                        detail = error.get("message", resp.text) if isinstance(error, dict) else body.get("detail", resp.text)
                    except (ValueError, AttributeError):
                        detail = resp.text
                    if resp.status_code == 503:
                        raise SandboxUnavailable(f"sandbox service at {self.url} is saturated: {detail}")
                    raise SandboxError(f"sandbox service answered {resp.status_code}: {detail}")
                else:
                    return resp.json()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
        raise SandboxUnavailable(f"sandbox service at {self.url} stayed unavailable")

    async def _post(self, path: str, body: Any, limit_s: float) -> Any:
        return await self._send("POST", path, body, limit_s)

    async def run(self, request: ExecRequest) -> ExecResult:
        data = await self._post("/run", request.to_dict(), request.time_limit_s + NETWORK_GRACE_S)
        return ExecResult.from_dict(data)

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[RemoteSession]:
        data = await self._post("/sessions", None, NETWORK_GRACE_S)
        session = RemoteSession(self, data["session_id"])
        try:
            yield session
        finally:
            with contextlib.suppress(SandboxError):
                await asyncio.shield(self._send("DELETE", f"/sessions/{session.session_id}", None, NETWORK_GRACE_S))

    async def health(self) -> dict[str, Any]:
        return await self._send("GET", "/health", None, 10.0)

    async def aclose(self) -> None:
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()
