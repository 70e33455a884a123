"""Tools from MCP servers: a server's ``tools/list`` offered to the model, its ``tools/call`` run on a call.

What it is: ``MCPServerConfig`` (one server: a stdio command, or a URL speaking streamable
HTTP or the older HTTP+SSE; which of its tools, per episode or shared, a call timeout) and
``MCPTools``, the ``ToolSource`` a ``ToolBox`` opens at each episode's start
(``ToolBox(..., sources=[MCPTools(cfg)])``; envs take ``mcp_servers=[{...}]`` and do this;
a task's own servers join for one episode, ``ToolBox.add_episode_sources``). Each offered
tool is a ``Tool`` whose schema is the server's ``inputSchema`` (JSON-schema
``title``/``$schema`` annotations dropped: the model reads names and descriptions) and whose
function sends ``tools/call`` through the official ``mcp`` client SDK, so calls are parsed,
checked, timed out and bounded by the ToolBox like any Python tool's.

What comes back: text blocks and embedded text resources as they are, joined by newlines;
``structuredContent`` as JSON when no text came with it; images, audio, binary resources and
resource links each as one typed placeholder line (``[image/png image, 1234 bytes, not
shown]``): the tool turn is text. A result with ``isError``, a protocol error, a call past
its timeout and a server that crashed or closed its connection each answer the model with a
tool-error message (``error: ...``), never a failed step; a shared server that died is
started again at the next episode. A server that cannot start or list its tools at an
episode's start raises ``ToolError`` there (the episode is failed data). A stdio server's
stderr goes to an unnamed temporary file for as long as it runs; its tail is quoted when the
server fails (a server that logs every request fills it: turn its logging down).

Scope. ``episode`` (the default, for stateful servers): a fresh process or HTTP session per
episode, closed when it ends. ``worker``: one connection per event loop and config, shared
by every env of the process, closed when the last env using it closes.

What it is not: a sandbox (a stdio server runs with this process's rights), nor MCP's
resources, prompts, sampling or elicitation (only tools).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agentrl.config import check_options, from_dict, option
from agentrl.env.tools import Tool, ToolFailed
from agentrl.errors import ConfigError, ToolError
from agentrl.plugins import import_optional

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


@dataclass
class MCPServerConfig:
    """One MCP server whose tools an env offers (an entry of an env's ``mcp_servers``)."""

    name: str = option(help="what the server is called in errors and logs")
    command: str | None = option(None, help="stdio: the program that starts the server (node, uvx, ...; "
                                            "python: this process's own interpreter)")
    args: list[str] = option([], help="stdio: the program's arguments")
    env: dict[str, str] = option({}, help="stdio: environment variables added to the SDK's safe defaults "
                                          "(HOME, PATH, ...); nothing else of ours is passed on")
    cwd: str | None = option(None, help="stdio: the server's working directory (None: ours)")
    url: str | None = option(None, help="HTTP: the server's endpoint (e.g. http://127.0.0.1:3001/mcp)")
    headers: dict[str, str] = option({}, help="HTTP: headers of every request (e.g. Authorization)")
    sse: bool = option(False, help="url: the server speaks MCP's older HTTP+SSE transport (a GET stream, "
                                   "e.g. http://127.0.0.1:8000/sse), not streamable HTTP")
    tools: list[str] | None = option(None, help="offer only these of the server's tools (None: all it lists)")
    prefix: str = option("", help="prepended to the server's tool names (two servers with the same names)")
    scope: Literal["episode", "worker"] = option("episode", help="episode: a fresh process/session per episode "
                                                                 "(stateful servers); worker: one shared by the "
                                                                 "process's envs (stateless ones)")
    call_timeout_s: float | None = option(None, gt=0, help="seconds one call may take (None: the ToolBox's "
                                                           "timeout_s)")
    connect_timeout_s: float = option(30.0, gt=0, help="seconds to start, initialize and list tools")

    def __post_init__(self) -> None:
        try:
            check_options(self)
        except ValueError as e:
            raise ConfigError(f"MCP server {self.name!r}: {e}") from None
        if (self.command is None) == (self.url is None):
            raise ConfigError(f"MCP server {self.name!r}: give either command (stdio) or url (HTTP), "
                              f"not {'both' if self.command else 'neither'}")
        if self.sse and self.url is None:
            raise ConfigError(f"MCP server {self.name!r}: sse is a url's transport; a command speaks stdio")

    @classmethod
    def of(cls, entry: MCPServerConfig | Mapping[str, Any]) -> MCPServerConfig:
        """A config from a YAML entry (unknown keys get "did you mean")."""
        return entry if isinstance(entry, MCPServerConfig) else from_dict(cls, entry, prefix="mcp_servers.")

    def key(self) -> str:
        """What identifies a shared connection: everything that reaches the server."""
        return json.dumps([self.command, self.args, self.env, self.cwd, self.url, self.headers, self.sse],
                          sort_keys=True)


def mcp_sources(entries: Sequence[MCPServerConfig | Mapping[str, Any]] | None) -> list[MCPTools]:
    """The tool sources of an env's ``mcp_servers`` (YAML entries or configs)."""
    return [MCPTools(MCPServerConfig.of(e)) for e in entries or ()]


class MCPConnection:
    """One live client session to one server, held open by a task of its own (the SDK's
    transports are anyio task groups, entered and left in one task)."""

    def __init__(self, config: MCPServerConfig) -> None:
        self.config = config
        self.session: Any = None
        self.error: str | None = None  # why it is down
        self._stop = asyncio.Event()
        self._ready = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._stderr: Any = None
        self.users = 0  # envs holding a shared connection

    @property
    def alive(self) -> bool:
        return self.session is not None and self.error is None and self._task is not None and not self._task.done()

    async def open(self) -> None:
        """Start the server (or connect), initialize, within ``connect_timeout_s``; ToolError if not."""
        self._task = asyncio.get_running_loop().create_task(self._hold(), name=f"mcp-{self.config.name}")
        try:
            async with asyncio.timeout(self.config.connect_timeout_s):
                await self._ready.wait()
        except TimeoutError:
            self.error = f"no answer to initialize within {self.config.connect_timeout_s:g} s"
        if not self.alive:
            await self.close()
            raise ToolError(f"MCP server {self.config.name!r} could not start: {self.error}{self._stderr_tail()}")

    async def _hold(self) -> None:
        mcp = import_optional("mcp", extra="mcp", purpose="tools from MCP servers")
        try:
            async with contextlib.AsyncExitStack() as stack:
                streams = await stack.enter_async_context(self._transport(mcp))
                session = await stack.enter_async_context(mcp.ClientSession(streams[0], streams[1]))
                await session.initialize()
                self.session = session
                self._ready.set()
                await self._stop.wait()
        except BaseException as e:  # noqa: BLE001 (the holder's end is reported to the callers)
            while isinstance(e, BaseExceptionGroup) and e.exceptions:  # anyio's task groups wrap the cause
                e = e.exceptions[0]
            self.error = self.error or f"{type(e).__name__}: {e}"
            if not isinstance(e, Exception):
                raise
        finally:
            self.error = self.error or "closed"
            self._ready.set()

    def _transport(self, mcp: Any) -> Any:
        cfg = self.config
        if cfg.command is not None:
            from mcp.client.stdio import get_default_environment, stdio_client

            self._stderr = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
            command = sys.executable if cfg.command == "python" else cfg.command
            params = mcp.StdioServerParameters(command=command, args=list(cfg.args), cwd=cfg.cwd,
                                               env={**get_default_environment(), **cfg.env})
            return stdio_client(params, errlog=self._stderr)
        if cfg.sse:
            from mcp.client.sse import sse_client

            return sse_client(cfg.url, headers=dict(cfg.headers), timeout=cfg.connect_timeout_s)
        import httpx
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        client = create_mcp_http_client(headers=dict(cfg.headers),
                                        timeout=httpx.Timeout(cfg.connect_timeout_s, read=300.0))
        return streamable_http_client(cfg.url, http_client=client)

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        with contextlib.suppress(Exception):
            self._stderr.seek(0)
            tail = self._stderr.read()[-600:].strip()
            return f"; its stderr ends: {tail}" if tail else ""
        return ""

    async def list_tools(self) -> list[Any]:
        """Every tool the server lists (all pages)."""
        out, cursor = [], None
        async with asyncio.timeout(self.config.connect_timeout_s):
            while True:
                page = await self.session.list_tools(cursor)
                out += page.tools
                cursor = page.nextCursor
                if not cursor:
                    return out

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """``tools/call``; raises ``ToolFailed`` when the server is down or answers an error."""
        if not self.alive:
            raise ToolFailed(f"the MCP server {self.config.name!r} is down ({self.error}){self._stderr_tail()}")
        call = asyncio.ensure_future(self.session.call_tool(name, arguments))
        try:
            # a server that dies mid-call ends the holder: the call fails at once instead of at its timeout
            await asyncio.wait({call, self._task}, return_when=asyncio.FIRST_COMPLETED)
            if not call.done():
                raise ToolFailed(f"the MCP server {self.config.name!r} went down during the call "
                                 f"({self.error}){self._stderr_tail()}")
            return call.result()
        except ToolFailed:
            raise
        except Exception as e:  # an McpError (protocol error, connection closed) or a broken stream
            if "Connection closed" in str(e):
                self.error = "connection closed"
            raise ToolFailed(f"the MCP server {self.config.name!r} answered with an error: {e}"
                             f"{self._stderr_tail() if not self.alive else ''}") from None
        finally:
            if not call.done():
                call.cancel()
                with contextlib.suppress(BaseException):
                    await call

    async def close(self) -> None:
        """Stop the holder (which closes the session and ends a stdio server), bounded in time."""
        self._stop.set()
        task, self._task = self._task, None
        try:
            if task is not None and not task.done():
                try:
                    async with asyncio.timeout(10):
                        await asyncio.shield(task)
                except TimeoutError:
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
        finally:
            self.session = None
            if self._stderr is not None:
                self._stderr.close()
                self._stderr = None


_SHARED: dict[tuple[int, str], MCPConnection] = {}
"""Shared (``scope: worker``) connections by (event loop, config key)."""
_STARTING: dict[tuple[int, str], asyncio.Lock] = {}


class MCPTools:
    """One server's tools as a ``ToolSource`` of a ``ToolBox``; see the module docstring."""

    def __init__(self, config: MCPServerConfig) -> None:
        self.config = config
        self._conn: MCPConnection | None = None  # this episode's
        self._held: MCPConnection | None = None  # the shared one this env counts in its users

    async def open(self) -> list[Tool]:
        """Connect (a fresh server per episode, or the shared one) and list the offered tools."""
        await self.end()
        if self.config.scope == "episode":
            self._conn = MCPConnection(self.config)
            await self._conn.open()
        else:
            self._conn = await self._shared()
        try:
            return self._tools(await self._conn.list_tools())
        except Exception as e:
            raise ToolError(f"MCP server {self.config.name!r}: tools/list failed: {type(e).__name__}: {e}") from e

    async def _shared(self) -> MCPConnection:
        key = (id(asyncio.get_running_loop()), self.config.key())
        async with _STARTING.setdefault(key, asyncio.Lock()):  # the envs of a batch start one server, not many
            conn = _SHARED.get(key)
            if conn is None or not conn.alive:  # none yet, or the last one died: start one
                if conn is not None:
                    await conn.close()
                conn = _SHARED[key] = MCPConnection(self.config)
                try:
                    await conn.open()
                except BaseException:
                    _SHARED.pop(key, None)
                    raise
        if self._held is not conn:  # each env holds the shared connection once
            conn.users += 1
            self._held = conn
        return conn

    def _tools(self, listed: list[Any]) -> list[Tool]:
        cfg = self.config
        by_name = {t.name: t for t in listed}
        wanted = list(by_name) if cfg.tools is None else cfg.tools
        missing = [n for n in wanted if n not in by_name]
        if missing:
            raise ToolError(f"MCP server {cfg.name!r} has no tool(s) {missing}; it lists {sorted(by_name)}")
        out = []
        for name in wanted:
            listed_tool, offered = by_name[name], cfg.prefix + name
            if not _NAME.fullmatch(offered):
                raise ToolError(f"MCP server {cfg.name!r}: tool name {offered!r} does not match "
                                f"[A-Za-z_][A-Za-z0-9_-]* (64 chars at most); leave it out with `tools`")
            out.append(Tool(offered, listed_tool.description or "", offer_schema(listed_tool.inputSchema),
                            self._caller(name), timeout_s=cfg.call_timeout_s))
        return out

    def _caller(self, name: str) -> Any:
        async def call(**arguments: Any) -> str:
            if self._conn is None:
                raise ToolFailed(f"the MCP server {self.config.name!r} is not connected (the episode ended)")
            return result_text(await self._conn.call(name, arguments))
        return call

    async def end(self) -> None:
        """The episode ended: close a per-episode server; a shared one stays up."""
        conn, self._conn = self._conn, None
        if conn is not None and self.config.scope == "episode":
            await conn.close()

    async def aclose(self) -> None:
        """The env closed: also let go of a shared server (closed when no env holds it)."""
        await self.end()
        conn, self._held = self._held, None
        if conn is not None:
            conn.users -= 1
            if conn.users <= 0:
                for key in [k for k, c in _SHARED.items() if c is conn]:
                    del _SHARED[key]
                await conn.close()


def offer_schema(schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """The parameters offered to the model: the server's schema with ``type``, ``properties``
    and ``required`` first and the ``title``/``$schema`` annotations dropped."""
    schema = dict(schema or {})
    properties = {name: {k: v for k, v in prop.items() if k != "title"} if isinstance(prop, Mapping) else prop
                  for name, prop in (schema.pop("properties", None) or {}).items()}
    rest = {k: v for k, v in schema.items() if k not in ("type", "required", "title", "$schema")}
    return {"type": "object", "properties": properties, "required": list(schema.get("required") or []), **rest}


def result_text(result: Any) -> str:
    """A ``CallToolResult`` as the tool turn's text; ``ToolFailed`` when it is an error result."""
    parts = [_block_text(block) for block in result.content or []]
    if result.structuredContent is not None and not any(b.type == "text" for b in result.content or []):
        parts.append(json.dumps(result.structuredContent, ensure_ascii=False))
    text = "\n".join(p for p in parts if p)
    if result.isError:
        raise ToolFailed(text or "the tool reported an error and said nothing more")
    return text


def _block_text(block: Any) -> str:
    kind = block.type
    if kind == "text":
        return block.text
    if kind in ("image", "audio"):
        return f"[{block.mimeType} {kind}, {len(block.data) * 3 // 4} bytes, not shown]"
    if kind == "resource_link":
        return f"[resource link: {block.uri}" + (f" ({block.mimeType})" if block.mimeType else "") + "]"
    if kind == "resource":
        res = block.resource
        if getattr(res, "text", None) is not None:
            return res.text
        return f"[{res.mimeType or 'binary'} resource {res.uri}, not shown]"
    return f"[{kind} content, not shown]"
