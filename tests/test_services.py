"""The plumbing every service of ours shares (``agentrl.process.services``): the event loop and
HTTP parser they run on, the ports handed to programs that must be told one, and SIGTERM/SIGHUP
turned into an exit that runs the ``finally`` blocks stopping a program's children."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentrl.process.services import HTTP_PARSER, background_server, free_port, run_async


def test_services_run_on_uvloop_and_parse_http_with_httptools():
    seen = {}

    async def where(request):
        seen["loop"] = type(asyncio.get_running_loop()).__module__
        return JSONResponse({"ok": True})

    async def main():
        async with background_server(Starlette(routes=[Route("/", where)])) as url, httpx.AsyncClient() as http:
            assert (await http.get(url)).json() == {"ok": True}

    run_async(main())
    assert seen["loop"].startswith("uvloop")
    config = uvicorn.Config(Starlette(), http=HTTP_PARSER)
    config.load()
    assert config.http_protocol_class.__name__ == "HttpToolsProtocol"


def test_free_port_is_free_and_outside_the_ephemeral_range():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        port = free_port()
        assert 10_000 <= port < low  # bind(0) and outgoing connections never take it meanwhile
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_sighup_in_exit_on_signals_runs_the_finally_blocks_then_handlers_come_back():
    code = """
import signal, sys, time
from agentrl.process.services import exit_on_signals
with exit_on_signals("prog"):
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored after the block
try:
    with exit_on_signals("prog"):
        print("ready", flush=True)
        time.sleep(60)
finally:
    print("cleaned up", flush=True)
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGHUP)
    out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 128 + signal.SIGHUP
    assert "prog: SIGHUP received; stopping its processes" in out and out.endswith("cleaned up\n")
