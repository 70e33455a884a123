"""The service's admission control (unit test: a slow fake backend behind the real app)."""

from __future__ import annotations

import asyncio
import contextlib

import httpx

from agentrl.api import ExecRequest, ExecResult, ExecStatus
from sandboxes.service import build_app


class SlowSandbox:
    """Counts how many runs overlap; each takes 0.3 s."""

    def __init__(self) -> None:
        self.running = 0
        self.peak = 0

    async def run(self, request: ExecRequest) -> ExecResult:
        self.running += 1
        self.peak = max(self.peak, self.running)
        await asyncio.sleep(0.3)
        self.running -= 1
        return ExecResult(status=ExecStatus.OK, stdout=request.code)

    @contextlib.asynccontextmanager
    async def session(self):
        yield self


async def test_concurrency_limit_queue_and_503_when_full():
    backend = SlowSandbox()
    app = build_app(backend, backend="fake", max_concurrency=2, max_queue=2)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://svc", timeout=30) as client:
        replies = await asyncio.gather(*[client.post("/run", json={"code": str(i)}) for i in range(6)])
    codes = sorted(r.status_code for r in replies)
    assert codes == [200, 200, 200, 200, 503, 503], codes  # 2 running + 2 queued; the rest refused
    assert backend.peak == 2
    refused = next(r for r in replies if r.status_code == 503)
    assert "queue is full" in refused.json()["detail"]


class DownSandbox:
    async def run(self, request: ExecRequest) -> ExecResult:
        from agentrl.errors import SandboxUnavailable

        raise SandboxUnavailable("no Docker engine answers")

    def session(self):
        raise AssertionError("not used")


async def test_a_backend_that_is_down_answers_503_with_the_reason():
    app = build_app(DownSandbox(), backend="fake", api_key="k")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://svc", timeout=30,
                                 headers={"Authorization": "Bearer k"}) as client:
        r = await client.post("/run", json={"code": "print(1)"})
    assert r.status_code == 503 and "no Docker engine answers" in r.json()["detail"]
