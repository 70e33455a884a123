"""What several tests wait for on a real ``agentrl serve`` or gateway."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable

import httpx


async def until_generating(*urls: str, min_tokens: int = 0, limit_s: float = 30.0) -> None:
    """Until one of the servers runs a request and has produced ``min_tokens`` more tokens than
    when called (its counter runs over the server's life, which other tests share)."""
    async with httpx.AsyncClient(timeout=10) as client, asyncio.timeout(limit_s):
        start: dict[str, int] = {}
        while True:
            for url in urls:
                info = (await client.get(url + "/server_info")).json()["internal_states"][0]
                start.setdefault(url, info["num_generated_tokens"])
                if info["num_running_reqs"] and info["num_generated_tokens"] - start[url] >= min_tokens:
                    return
            await asyncio.sleep(0.01)


def abandon_call(gateway: str, session: dict, body: dict, started: Callable[[], object]) -> None:
    """A chat request whose client hangs up before the answer (issue 30): sent on a raw socket
    (no client library to retry or pool it), closed as soon as ``started()`` returns (the call
    is being generated), as a client times out or an agent is killed."""
    host, port = gateway.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer "
            f"{session['api_key']}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head.encode() + data)
        started()
