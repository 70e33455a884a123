"""Overhead of the gateway: chat completions per second through ``agentrl gateway`` vs directly.

Both sides play the same episodes at the same concurrency against the same ``agentrl serve``
process (the tiny model, one torch thread): each episode is a ``--turns``-call conversation
(the user asks, the model answers, the user asks a follow-up, ...), every call greedy with
``max_tokens`` new tokens enforced by ``ignore_eos``, so both sides generate exactly the same
tokens. Direct: ``POST /v1/chat/completions`` on the server. Gateway: ``POST /v1/sessions``,
the same calls with the session's key on the gateway (which renders, records every token and
calls ``/generate`` through ``RemoteEngine``), then ``POST /v1/sessions/{id}/end`` — session
bookkeeping is part of the gateway's cost. The client is the same on both sides (httpx over
``KeepAliveTransport``, so its own cost stays small on a 2-core machine where every client
CPU millisecond is taken from the server). The two sides alternate for ``--rounds`` rounds,
so machine load drifts affect both; the ratio uses the total time of each side. A round's
time swings by 10-20% on its own on a 2-core machine (the server's batches form differently
each time), hence several rounds of several seconds each.

    overhead = 1 - (gateway completions/s) / (direct completions/s)       goal: < 0.10

Last line: one JSON object. Usage::

    .venv/bin/python benchmarks/gateway.py [--episodes 128] [--rounds 5] [--concurrency 16] [--turns 3] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

from agentrl.client.transport import KeepAliveTransport
from agentrl.process.services import ServerProcess, ServiceProcess

ROOT = Path(__file__).resolve().parents[1]


async def play(http, base: str, headers: dict, i: int, turns: int, max_tokens: int) -> int:
    """One episode of ``turns`` calls; returns the completion tokens generated."""
    messages = [{"role": "user", "content": f"What is {i % 97}+{(7 * i) % 89}+{(3 * i) % 83}?"}]
    tokens = 0
    for turn in range(turns):
        r = await http.post(f"{base}/v1/chat/completions", headers=headers, json={
            "model": "tiny", "messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True})
        r.raise_for_status()
        body = r.json()
        tokens += body["usage"]["completion_tokens"]
        messages += [{"role": "assistant", "content": body["choices"][0]["message"]["content"]},
                     {"role": "user", "content": f"Are you sure about step {turn}?"}]
    return tokens


async def side(url: str, episodes: int, concurrency: int, turns: int, max_tokens: int, gateway: bool) -> tuple[float, int]:
    import httpx

    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    gate = asyncio.Semaphore(concurrency)

    async def episode(http, i: int) -> int:
        async with gate:
            if not gateway:
                return await play(http, url, {}, i, turns, max_tokens)
            s = (await http.post(f"{url}/v1/sessions", json={})).json()
            tokens = await play(http, url, {"Authorization": f"Bearer {s['api_key']}"}, i, turns, max_tokens)
            (await http.post(f"{url}/v1/sessions/{s['session_id']}/end", json={})).raise_for_status()
            return tokens

    async with httpx.AsyncClient(timeout=600, limits=limits, transport=KeepAliveTransport()) as http:
        await episode(http, 0)  # warm the connection pool and both servers
        t0 = time.perf_counter()
        tokens = await asyncio.gather(*(episode(http, i) for i in range(episodes)))
        return time.perf_counter() - t0, sum(tokens)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "examples" / "tiny-model")
    ap.add_argument("--episodes", type=int, default=128, help="episodes per side and round (default 128)")
    ap.add_argument("--concurrency", type=int, default=16, help="episodes in flight (default 16)")
    ap.add_argument("--turns", type=int, default=3, help="calls per episode (default 3)")
    ap.add_argument("--max-tokens", type=int, default=32, help="new tokens per call (default 32)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds of both sides (default 5)")
    args = ap.parse_args()

    with ServerProcess(args.model, "--served-model-name", "tiny") as server, \
            ServiceProcess([str(Path(sys.executable).parent / "agentrl"), "gateway", "--model", str(args.model),
                            "--upstream", server.url, "--port", "0", "--served-model-name", "tiny"],
                           ready="agentrl gateway: ready on ", env={**os.environ, "OMP_NUM_THREADS": "1"}) as gw:
        times = {"direct": [], "gateway": []}
        tokens = {"direct": 0, "gateway": 0}
        for _ in range(args.rounds):
            for name, url in (("direct", server.url), ("gateway", gw.url)):
                seconds, n = asyncio.run(side(url, args.episodes, args.concurrency, args.turns, args.max_tokens,
                                              name == "gateway"))
                times[name].append(seconds)
                tokens[name] += n
                print(f"{name:8s} {args.episodes * args.turns / seconds:7.1f} completions/s ({seconds:.2f} s)",
                      file=sys.stderr)
    if tokens["direct"] != tokens["gateway"]:
        raise SystemExit(f"the two sides generated different token counts: {tokens}")
    calls = args.episodes * args.turns * args.rounds
    direct_rate, gateway_rate = calls / sum(times["direct"]), calls / sum(times["gateway"])
    print(json.dumps({
        "metric": "chat completions per second, gateway vs direct", "episodes": args.episodes,
        "concurrency": args.concurrency, "turns": args.turns, "max_tokens": args.max_tokens, "rounds": args.rounds,
        "direct_per_s": round(direct_rate, 2), "gateway_per_s": round(gateway_rate, 2),
        "direct_round_s": [round(t, 3) for t in times["direct"]],
        "gateway_round_s": [round(t, 3) for t in times["gateway"]],
        "median_round_ratio": round(statistics.median(g / d for g, d in zip(times["gateway"], times["direct"],
                                                                              strict=True)), 4),
        "overhead": round(1 - gateway_rate / direct_rate, 4),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
