"""The gateway's MCP endpoint: one session's environment tools served as an MCP server.

What it is: ``MCPEndpoint(gateway)``, mounted by ``build_app`` at ``/sessions/{id}/mcp``
(streamable HTTP, stateless, JSON answers). A session opened with ``tools`` (a
``SessionTools``: ``ExternalAgentWorkflow`` binds the episode's env — its ``ToolBox``, MCP
servers' tools included — through ``TextEnv.call_tool``) lists them at ``tools/list`` and runs
them at ``tools/call``, so an agent that speaks MCP (the OpenAI Agents SDK's
``MCPServerStreamableHttp``, any MCP-capable harness) plays the env while its model calls go
through the same session and are recorded. A call's failure (a wrong argument, a tool that
raised or timed out) is an ``isError`` result with the env's own message, as the model would
read it in the env's reply loop.

Trust boundary. Covered: every request needs the session's key (or the gateway's admin key)
as its bearer token, even on a gateway without an admin key (401 otherwise, 403 for another
session's key); an ended or unknown session gets 409/404; a session without tools answers
``tools/list`` with none and ``tools/call`` with an error result. Not covered: MCP's
resources, prompts, sampling and server-to-client requests (tools only); sessions of MCP's
own (each request stands alone: the gateway session is the state).

Main hook::

    session = gateway.open_session(metadata, tools=env_tools)   # SessionTools
    # the agent: MCP streamable HTTP at {base}/sessions/{session.id}/mcp, Bearer session.key
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Protocol

from agentrl.plugins import import_optional


class SessionTools(Protocol):
    """What a session serves over MCP: the OpenAI tool schemas and a way to run one."""

    def schemas(self) -> list[dict[str, Any]]:
        """The OpenAI ``tools`` entries offered."""

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """Run one tool: (the tool message's content, whether the call succeeded)."""


class MCPEndpoint:
    """The MCP server of a gateway's sessions; see the module docstring. ``handle`` serves one
    HTTP request for ``session`` (its key checked by the caller); ``aclose`` stops it."""

    def __init__(self, call_timeout_s: float = 600.0) -> None:
        self.call_timeout_s = call_timeout_s
        self._manager: Any = None
        self._holder: asyncio.Task | None = None
        self._stop = asyncio.Event()
        self._starting = asyncio.Lock()

    def _server(self) -> Any:
        import_optional("mcp", extra="mcp", purpose="the gateway's MCP endpoint")
        from mcp import types
        from mcp.server.lowlevel import Server

        server = Server("agentrl-env")

        def session_tools() -> SessionTools | None:
            return server.request_context.request.scope["agentrl.session"].tools

        @server.list_tools()
        async def list_tools() -> list[types.Tool]:
            tools = session_tools()
            return [types.Tool(name=t["function"]["name"], description=t["function"].get("description") or "",
                               inputSchema=t["function"].get("parameters") or {"type": "object", "properties": {}})
                    for t in (tools.schemas() if tools is not None else [])]

        @server.call_tool(validate_input=False)  # the env checks arguments and words the error itself
        async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
            tools = session_tools()
            if tools is None:
                content, ok = "error: this session's environment offers no tools", False
            else:
                async with asyncio.timeout(self.call_timeout_s):
                    content, ok = await tools.call(name, arguments)
            return types.CallToolResult(content=[types.TextContent(type="text", text=content)], isError=not ok)

        return server

    async def _started(self) -> Any:
        """The session manager, running in a task of its own (its task group is entered and
        left there) from the first request to ``aclose``."""
        async with self._starting:
            if self._manager is None:
                from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

                manager = StreamableHTTPSessionManager(self._server(), json_response=True, stateless=True)
                running = asyncio.Event()

                async def hold() -> None:
                    async with manager.run():
                        running.set()
                        await self._stop.wait()

                self._holder = asyncio.get_running_loop().create_task(hold(), name="gateway-mcp")
                waiter = asyncio.ensure_future(running.wait())
                try:
                    async with asyncio.timeout(30):
                        await asyncio.wait({self._holder, waiter}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                if self._holder.done():
                    self._holder.result()  # raises why it stopped
                self._manager = manager
        return self._manager

    async def handle(self, session: Any, scope: dict, receive: Any, send: Any) -> None:
        """Serve one MCP request (POST, GET or DELETE) of ``session``."""
        manager = await self._started()
        session.last_used = time.monotonic()  # a tool call is activity: the idle reaper waits
        await manager.handle_request({**scope, "agentrl.session": session}, receive, send)

    async def aclose(self) -> None:
        self._stop.set()
        holder, self._holder = self._holder, None
        if holder is not None and not holder.done():
            try:
                async with asyncio.timeout(10):
                    await holder
            except TimeoutError:
                holder.cancel()
                with contextlib.suppress(BaseException):
                    await holder
        self._manager = None
