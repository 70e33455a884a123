"""What several tests wait for on a real ``agentrl serve``."""

from __future__ import annotations

import asyncio

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
