"""The service's admission control and request validation (unit tests: a slow fake backend
behind the real app, and `parse_request` on hand-made bodies)."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import pytest

from agentrl.api import ExecRequest, ExecResult, ExecStatus
from agentrl.errors import Refused
from sandboxes.admission import parse_request
from sandboxes.ceilings import Ceilings
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
    assert "queue is full" in refused.json()["error"]["message"]


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
    assert r.status_code == 503 and "no Docker engine answers" in r.json()["error"]["message"]


async def test_an_open_session_holds_a_place_until_it_ends():
    backend = SlowSandbox()
    app = build_app(backend, backend="fake", max_concurrency=1, max_queue=0)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://svc", timeout=30) as client:
        sid = (await client.post("/sessions")).json()["session_id"]
        r = await client.post("/run", json={"code": "1"})
        assert r.status_code == 503 and "queue is full" in r.json()["error"]["message"]
        assert (await client.get("/health")).json()["running"] == 1
        assert (await client.delete(f"/sessions/{sid}")).status_code == 200
        r = await client.post("/run", json={"code": "1"})
        assert r.status_code == 200, r.text


def test_ceilings_are_named_when_exceeded():
    ceilings = Ceilings(max_time_s=5, max_memory_mb=256, max_output_bytes=1000, max_code_bytes=100,
                        max_file_bytes=10, max_fetch=2)
    for body, status, name in [
        ({"code": "x", "time_limit_s": 6}, 422, "max_time_s=5"),
        ({"code": "x", "memory_limit_mb": 257}, 422, "max_memory_mb=256"),
        ({"code": "x", "output_limit_bytes": 1001}, 422, "max_output_bytes=1000"),
        ({"code": "x" * 101}, 413, "max_code_bytes=100"),
        ({"code": "x", "files": {"a": "x" * 8}, "files_b64": {"b": "eHh4eA=="}}, 413, "max_file_bytes=10"),
        ({"code": "x", "fetch": ["a", "b", "c"]}, 422, "max_fetch=2"),
        ({"code": "x", "memory_limit_mb": 64.5}, 422, "integer"),
        ({"code": "x", "time_limit_s": True}, 422, "finite number"),
        ({"code": "x", "files_b64": {"a": "not base64!"}}, 422, "base64"),
        ({"code": "x", "language": "ruby"}, 422, "language"),
    ]:
        with pytest.raises(Refused) as e:
            parse_request(json.dumps(body).encode(), ceilings)
        assert (e.value.status, name in str(e.value)) == (status, True), (body, e.value.status, str(e.value))
    ok = parse_request(json.dumps({"code": "x", "time_limit_s": 5, "files": {"a": "1234567890"}}).encode(), ceilings)
    assert ok.time_limit_s == 5 and ok.files == {"a": "1234567890"}


def test_bodies_that_broke_the_parser_are_refused_with_a_4xx():
    """Each was a 500: a Python error escaping ``parse_request`` (OverflowError on a huge
    integer, RecursionError on deep nesting) or a lone surrogate that no UTF-8 answer can
    echo (the unknown-field message quotes it)."""
    ceilings = Ceilings()
    for body, status, says in [
        (b'{"code": "x", "time_limit_s": -1' + b"0" * 400 + b"}", 422, "time_limit_s must be > 0"),
        (b'{"code": "x", "memory_limit_mb": -1' + b"0" * 400 + b"}", 422, "memory_limit_mb must be >= 16"),
        (b'{"code": "x", "output_limit_bytes": 1' + b"0" * 400 + b"}", 422, "max_output_bytes"),
        (b'{"code": "x", "time_limit_s": 1' + b"0" * 5000 + b"}", 400, "not valid JSON"),
        (b"[" * 100_000, 400, "nested too deeply"),
        (b'{"code": "print(1)", "\\udc80": 1}', 400, "lone surrogate"),
        (b'{"code": "print(\'\\ud800\')"}', 400, "lone surrogate"),
    ]:
        with pytest.raises(Refused) as e:
            parse_request(body, ceilings)
        assert (e.value.status, says in str(e.value)) == (status, True), (body[:60], e.value.status, str(e.value))
    ok = parse_request(b'{"code": "print(\'\\ud83d\\ude00\')"}', ceilings)  # a pair is one character
    assert ok.code == "print('\U0001f600')"
