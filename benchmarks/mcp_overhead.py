"""Overhead of a tool served over MCP: one calculator call through an MCP server vs the same tool as a Python function.

All three sides go through the same ``ToolBox.run`` (argument check, timeout, result bound),
with the same calculator (``agentrl.model.arith_data.calculate``): as a Python function of the
env (``envs.tool_use.calculator``, run in a worker thread as every sync tool is), and as
``examples/mcp_calculator.py`` (FastMCP) reached through ``agentrl.env.mcp_tools`` over stdio
(a child process) and over streamable HTTP (127.0.0.1). Calls are sequential, one at a time,
after ``--warmup`` calls; the sides alternate for ``--rounds`` rounds so that machine load
drifts affect all of them; p50 over every call of a side.

    ratio = p50(MCP call) / p50(Python call)

``stdio_sdk_p50_us``: the same calls on the SDK's ``ClientSession`` directly (no ToolBox, no
agentrl), so that what MCP costs and what agentrl adds can be told apart.

Last line: one JSON object. Usage::

    .venv/bin/python benchmarks/mcp_overhead.py [--calls 300] [--rounds 3] [--warmup 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from agentrl.env.mcp_tools import MCPServerConfig, MCPTools
from agentrl.env.tools import ToolBox
from agentrl.process.services import free_port, stop_process
from agentrl.toolcalls import ToolCall
from envs.tool_use import calculator

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "examples" / "mcp_calculator.py"


async def timed(box: ToolBox, n: int) -> list[float]:
    """Microseconds of each of ``n`` sequential calls."""
    out = []
    for i in range(n):
        call = ToolCall("calculator", {"expression": f"{i % 97}*{(7 * i) % 89}"})
        t0 = time.perf_counter()
        content, ok = await box.run(call)
        out.append((time.perf_counter() - t0) * 1e6)
        assert ok and content == str((i % 97) * ((7 * i) % 89)), content
    return out


async def timed_sdk(session, n: int) -> list[float]:
    """The same calls on the SDK's ClientSession directly: what MCP itself costs, without agentrl."""
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        await session.call_tool("calculator", {"expression": f"{i % 97}*{(7 * i) % 89}"})
        out.append((time.perf_counter() - t0) * 1e6)
    return out


async def listening(port: int, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Wait until the HTTP server takes connections (it logs nothing at WARNING)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{SERVER} --port {port} did not listen within {timeout_s:g} s (exit code {proc.poll()})")


def run(args: argparse.Namespace) -> dict:
    """Start the HTTP server, measure, stop it."""
    port = free_port()
    http = subprocess.Popen([sys.executable, str(SERVER), "--port", str(port)], stderr=subprocess.DEVNULL)
    try:
        return asyncio.run(main(args, port, http))
    finally:
        stop_process(http)


async def main(args: argparse.Namespace, port: int, http: subprocess.Popen) -> dict:
    await listening(port, http)
    boxes = {
        "python": ToolBox([calculator]),
        "stdio": ToolBox([], sources=[MCPTools(MCPServerConfig(name="stdio", command=sys.executable,
                                                               args=[str(SERVER)]))]),
        "http": ToolBox([], sources=[MCPTools(MCPServerConfig(name="http", url=f"http://127.0.0.1:{port}/mcp"))]),
    }
    times: dict[str, list[float]] = {name: [] for name in boxes}
    try:
        for box in boxes.values():
            await box.begin_episode()
            await timed(box, args.warmup)
        session = boxes["stdio"].sources[0]._conn.session  # the SDK's own ClientSession, for the split
        times["stdio_sdk"] = []
        for _ in range(args.rounds):
            for name, box in boxes.items():
                times[name] += await timed(box, args.calls)
            times["stdio_sdk"] += await timed_sdk(session, args.calls)
    finally:
        for box in boxes.values():
            with contextlib.suppress(Exception):
                await box.aclose()
    p50 = {name: statistics.median(t) for name, t in times.items()}
    return {"benchmark": "mcp_overhead", "calls_per_side": args.calls * args.rounds,
            "python_p50_us": round(p50["python"], 1), "stdio_p50_us": round(p50["stdio"], 1),
            "http_p50_us": round(p50["http"], 1), "stdio_sdk_p50_us": round(p50["stdio_sdk"], 1), "stdio_ratio": round(p50["stdio"] / p50["python"], 2),
            "http_ratio": round(p50["http"] / p50["python"], 2),
            "load_avg_1m": round(os.getloadavg()[0], 1)}  # a busy machine delays every cross-process round trip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per side and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=20)
    print(json.dumps(run(parser.parse_args())))
