"""Running one of our HTTP apps (``agentrl serve``, ``agentrl sandbox serve``) in the foreground.

What it is: bind the socket first (so ``--port 0`` picks a free port we can report), run
uvicorn on it, and print one ready line with the real URL once it listens — the line that
``agentrl.launcher`` and the tests wait for. What it is not: the apps themselves.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from typing import Any


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on (host, port); port 0 picks a free one."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def run_app(app: Any, sock: socket.socket, *, ready_line: str, log_level: str = "warning",
            before_ready: Callable[[], Awaitable[None]] | None = None, **uvicorn_options: Any) -> None:
    """Serve ``app`` on ``sock`` until stopped; print ``ready_line + URL`` once it listens.

    ``before_ready`` runs first (warming a pool, starting a fork server), so "ready" means
    the first request is served without a cold start.
    """
    import asyncio

    import uvicorn

    host, port = sock.getsockname()[:2]
    url_host = f"[{host}]" if ":" in host else host
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5,
                                           **uvicorn_options))

    async def main() -> None:
        if before_ready is not None:
            await before_ready()
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():  # noqa: ASYNC110 (uvicorn offers no event)
            await asyncio.sleep(0.05)
        if server.started:
            print(f"{ready_line}http://{url_host}:{port}", flush=True)
        await task

    asyncio.run(main())
