"""Tools an environment offers the model: declared from typed Python functions, run with a timeout.

What it is: ``tool(fn)`` turns a typed function (or coroutine function) with a docstring
into a ``Tool`` whose OpenAI JSON schema is derived from the signature (types -> JSON types,
defaults -> optional, ``Literal`` -> enum) and the docstring (the summary becomes the
description, Google-style ``Args:`` lines the parameter descriptions). ``ToolBox`` holds an
env's tools: it parses the calls in a reply (by default ``<tool_call>{json}</tool_call>``,
the chat template's format; any family ``agentrl.toolcalls`` reads, by SGLang's parser names,
with ``tool_call_parser`` and ``reasoning_parser`` — a call written in reasoning is never
run), checks the arguments against the schema, runs
each call with a timeout and answers with ``role: tool`` messages. What it is not: a
sandbox — tools run in this process; run untrusted code through ``agentrl.api.Sandbox``.

Never an exception for the model's mistakes: a malformed block, an unknown tool, wrong or
missing arguments, a tool that raises or times out — each becomes a tool message saying
what was expected, so the model can correct itself (a tool raises ``ToolFailed`` to word
that message itself). A tool that raises an ``AgentRLError``
(``ToolError``, ``SandboxError``: the infrastructure failed, not the model) propagates it.
A bad *declaration* (no docstring, an unannotated or unsupported parameter) raises
``ToolError`` at once.

Sync tools run in a worker thread; a sync tool that hangs keeps its thread after the
timeout (Python threads cannot be killed), so write tools that may hang as coroutines.

Main hook::

    def lookup(key: str) -> str:
        '''Look up a key in the store.'''
    box = ToolBox([lookup], timeout_s=5)
    turn = await box.handle(reply_text, turn=1)   # turn.messages: the tool messages
"""

from __future__ import annotations

import asyncio
import copy
import enum
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from agentrl.api import Message
from agentrl.errors import AgentRLError, ToolError
from agentrl.toolcalls import DEFAULT_TOOL_PARSER, ToolCall, check_parser_names, parse

_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}


@dataclass(frozen=True)
class Tool:
    """One declared tool: its name, description, JSON-schema parameters and the function."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    timeout_s: float | None = None  # seconds a call may take; None: the ToolBox's timeout_s

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def schema(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry: ``{"type": "function", "function": {...}}``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": copy.deepcopy(self.parameters),
            },
        }


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Declare ``fn`` as a tool (usable bare, ``@tool``, or as ``@tool(name="...")``)."""
    if fn is None:
        return lambda f: tool(f, name=name)
    if isinstance(fn, Tool):
        return fn
    if not callable(fn):
        raise ToolError(f"a tool is a function, got {type(fn).__name__} {fn!r}")
    tool_name = name or fn.__name__
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]{0,63}", tool_name):
        raise ToolError(f"tool name {tool_name!r} must match [A-Za-z_][A-Za-z0-9_-]* (at most 64 chars)")
    doc = inspect.getdoc(fn)
    if not doc:
        raise ToolError(f"tool {tool_name!r} needs a docstring: its first paragraph is what the model reads")
    summary, arg_docs = _parse_docstring(doc)
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:
        raise ToolError(f"tool {tool_name!r}: cannot resolve its type annotations ({e})") from e
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolError(f"tool {tool_name!r}: *args/**kwargs cannot be described to the model; name each parameter")
        if pname not in hints:
            raise ToolError(f"tool {tool_name!r}: parameter {pname!r} needs a type annotation (e.g. {pname}: str)")
        prop = _json_type(hints[pname], f"tool {tool_name!r}, parameter {pname!r}")
        if pname in arg_docs:
            prop["description"] = arg_docs[pname]
        if param.default is param.empty:
            required.append(pname)
        elif _jsonable(param.default):
            prop["default"] = param.default
        properties[pname] = prop
    parameters = {"type": "object", "properties": properties, "required": required}
    return Tool(tool_name, summary, parameters, fn)


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(summary, {arg: description}) from a Google-style docstring."""
    summary = " ".join(doc.split("\n\n", 1)[0].split())
    args: dict[str, str] = {}
    match = re.search(r"^(?:Args|Arguments|Parameters):\s*$", doc, re.MULTILINE)
    if match:
        base, current = None, None
        for line in doc[match.end():].splitlines():
            if not line.strip():
                continue
            indent = len(line) - len(line.lstrip())
            if indent == 0:
                break  # the next section (Returns:, Raises:, ...)
            base = indent if base is None else base
            item = re.match(r"(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)", line.strip())
            if indent <= base and item:
                current = item.group(1)
                args[current] = item.group(2).strip()
            elif current is not None:
                args[current] = f"{args[current]} {line.strip()}".strip()
    return summary, args


def _json_type(tp: Any, where: str) -> dict[str, Any]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        out = _json_type(rest[0], where) if len(rest) == 1 else {"anyOf": [_json_type(a, where) for a in rest]}
        if type(None) in args:  # Optional[T]: JSON null is allowed too
            if isinstance(out.get("type"), str):
                out["type"] = [out["type"], "null"]
            else:
                out = {"anyOf": [*out.get("anyOf", [out]), {"type": "null"}]}
        return out
    if origin is typing.Literal:
        kinds = {type(a) for a in args}
        if len(kinds) != 1 or next(iter(kinds)) not in _SCALARS:
            raise ToolError(f"{where}: Literal values must share one of the types str/int/float/bool")
        return {"type": _SCALARS[next(iter(kinds))], "enum": list(args)}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _json_type(typing.Literal[tuple(m.value for m in tp)], where)
    if tp in (list, tuple) or origin in (list, tuple, Sequence):
        out: dict[str, Any] = {"type": "array"}
        if args and args[0] is not Ellipsis:
            out["items"] = _json_type(args[0], where)
        return out
    if tp is dict or origin in (dict, Mapping):
        return {"type": "object"}
    raise ToolError(
        f"{where}: type {tp!r} has no JSON-schema form; use str, int, float, bool, Literal, "
        "list[...] or dict"
    )


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


def check_arguments(tool_: Tool, arguments: Mapping[str, Any]) -> str | None:
    """What is wrong with ``arguments`` for ``tool_`` (a message for the model), or None."""
    props = tool_.parameters["properties"]
    unknown = sorted(set(arguments) - set(props))
    if unknown:
        return f"{tool_.name} has no argument(s) {unknown}; its arguments are {sorted(props)}"
    missing = [p for p in tool_.parameters["required"] if p not in arguments]
    if missing:
        return f"{tool_.name} needs argument(s) {missing}"
    for key, value in arguments.items():
        problem = _check_value(props[key], value)
        if problem:
            return f"argument {key!r} of {tool_.name}: {problem}"
    return None


def _check_value(schema: Mapping[str, Any], value: Any) -> str | None:
    if "anyOf" in schema:
        problems = [_check_value(s, value) for s in schema["anyOf"]]
        return None if any(p is None for p in problems) else "; or ".join(p for p in problems if p)
    kind = schema.get("type")
    if isinstance(kind, list):  # [T, "null"] from Optional[T]
        if value is None and "null" in kind:
            return None
        problems = [_check_value({**schema, "type": k}, value) for k in kind if k != "null"]
        return None if any(p is None for p in problems) else "; or ".join(p for p in problems if p)
    ok = {
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
        "null": value is None,
    }.get(kind, True)
    if not ok:
        return f"expected a JSON {kind}, got {json.dumps(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"expected one of {schema['enum']}, got {json.dumps(value)}"
    if kind == "array" and "items" in schema:
        for i, item in enumerate(value):
            problem = _check_value(schema["items"], item)
            if problem:
                return f"item {i}: {problem}"
    return None


# --------------------------------------------------------------------------- running calls


@dataclass
class ToolTurn:
    """What one reply's tool calls produced. ``messages``: one tool message per call and per
    malformed block, in order. ``content``: the reply with well-formed call blocks removed.
    ``results``: the contents of the calls that succeeded (what a later answer may use)."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    reasoning: str | None = None  # the reply's reasoning, when a reasoning parser is set
    messages: list[Message] = field(default_factory=list)
    num_errors: int = 0
    results: list[str] = field(default_factory=list)  # the contents of the calls that succeeded, in order

    @property
    def attempted(self) -> bool:
        """Whether the reply tried to call a tool at all (well-formed or not)."""
        return bool(self.messages)


class ToolFailed(Exception):
    """Raised by a tool to answer the model ``error: <name> failed: <message>``, the message as is
    (an MCP server's error result, a server that went down)."""


class ToolSource(Protocol):
    """Tools that come from elsewhere (``agentrl.env.mcp_tools.MCPTools``), listed afresh per episode."""

    async def open(self) -> list[Tool]:
        """The episode starts: connect if need be, and return the tools to offer."""

    async def end(self) -> None:
        """The episode ended: release what was held for it."""

    async def aclose(self) -> None:
        """The env closed: release everything."""


class ToolBox:
    """An env's tools: schemas for the prompt, and ``handle(reply)`` to run the calls in it.

    ``sources`` (MCP servers) add their tools at each episode's start (``begin_episode``,
    which ``TextEnv.areset`` calls) and release them at its end (``end_episode``)."""

    def __init__(
        self,
        tools: Sequence[Callable[..., Any] | Tool],
        *,
        timeout_s: float = 10.0,
        max_calls: int = 8,
        max_result_chars: int = 4000,
        tool_call_parser: str = DEFAULT_TOOL_PARSER,
        reasoning_parser: str | None = None,
        sources: Sequence[ToolSource] = (),
    ) -> None:
        declared = [tool(t) for t in tools]
        names = [t.name for t in declared]
        if len(set(names)) != len(names):
            raise ToolError(f"tool names must be unique, got {names}")
        if timeout_s <= 0 or max_calls < 1 or max_result_chars < 1:
            raise ToolError(f"need timeout_s > 0, max_calls >= 1, max_result_chars >= 1; got "
                            f"{timeout_s}, {max_calls}, {max_result_chars}")
        self.tools = {t.name: t for t in declared}
        self.own = dict(self.tools)  # the declared tools; sources add theirs per episode
        self.sources = list(sources)
        self.episode_sources: list[ToolSource] = []  # this episode's alone (add_episode_sources)
        self.read_as(tool_call_parser, reasoning_parser)
        self.timeout_s = timeout_s
        self.max_calls = max_calls
        self.max_result_chars = max_result_chars

    def read_as(self, tool_call_parser: str, reasoning_parser: str | None = None) -> None:
        """Read replies in these formats (``agentrl.toolcalls`` names); ValueError lists the known ones."""
        check_parser_names(tool_call_parser, reasoning_parser)
        self.tool_call_parser, self.reasoning_parser = tool_call_parser, reasoning_parser

    async def begin_episode(self) -> None:
        """Open the sources and offer their tools beside the declared ones (ToolError on a clash)."""
        await self.end_episode()
        for source in self.sources:
            self._offer(await source.open())

    async def add_episode_sources(self, sources: Sequence[ToolSource]) -> None:
        """Open sources for this episode alone (a task's own MCP servers) and offer their tools;
        they are closed for good when the episode ends."""
        for source in sources:
            self.episode_sources.append(source)  # before opening: a half-opened one is closed too
            self._offer(await source.open())

    def _offer(self, tools: Sequence[Tool]) -> None:
        for t in tools:
            if t.name in self.tools:
                raise ToolError(f"two tools are named {t.name!r}; give an MCP server a prefix or a tools filter")
            self.tools[t.name] = t

    async def end_episode(self) -> None:
        """Release what the sources hold for the episode (every source, even when one fails)."""
        self.tools = dict(self.own)
        once, self.episode_sources = self.episode_sources, []
        await _each([s.end for s in self.sources] + [s.aclose for s in once])

    async def aclose(self) -> None:
        """Release the sources for good (the env closed)."""
        await self.end_episode()
        await _each([s.aclose for s in self.sources])

    def schemas(self) -> list[dict[str, Any]]:
        """The OpenAI ``tools`` list (pass it to the chat template or the API)."""
        return [t.schema() for t in self.tools.values()]

    async def handle(self, text: str, *, turn: int = 0) -> ToolTurn:
        """Parse the calls in ``text`` and run them in order. Call ids are ``call_<turn>_<i>``
        (deterministic, so seeded episodes repeat exactly)."""
        parsed = parse(text, self.tool_call_parser, self.reasoning_parser, self.schemas())
        out = ToolTurn(parsed.content, reasoning=parsed.reasoning)
        for error in parsed.errors:
            out.messages.append({"role": "tool", "content": f"error: {error}"})
            out.num_errors += 1
        for i, call in enumerate(parsed.tool_calls):
            call = replace(call, id=f"call_{turn}_{i}")
            out.calls.append(call)
            if i >= self.max_calls:
                content, ok = f"error: at most {self.max_calls} tool calls per reply; this one was not run", False
            else:
                content, ok = await self.run(call)
            out.num_errors += not ok
            if ok:
                out.results.append(content)
            out.messages.append({"role": "tool", "name": call.name, "tool_call_id": call.id, "content": content})
        return out

    async def run(self, call: ToolCall) -> tuple[str, bool]:
        """Run one call: (the tool message's content, whether the call succeeded)."""
        tool_ = self.tools.get(call.name)
        if tool_ is None:
            return f"error: there is no tool {call.name!r}; the tools are {sorted(self.tools)}", False
        problem = check_arguments(tool_, call.arguments)
        if problem:
            return f"error: {problem}", False
        timeout_s = tool_.timeout_s or self.timeout_s
        try:
            if tool_.is_async:
                result = await asyncio.wait_for(tool_.fn(**call.arguments), timeout_s)
            else:
                result = await asyncio.wait_for(asyncio.to_thread(tool_.fn, **call.arguments), timeout_s)
        except TimeoutError:
            return f"error: {call.name} did not finish within {timeout_s:g} s", False
        except ToolFailed as e:
            return self._format(f"error: {call.name} failed: {e}"), False
        except AgentRLError:
            raise  # the infrastructure failed (a sandbox, a ToolError): the episode fails, not the call
        except Exception as e:  # the tool's own failure is the model's information, not a crash
            return f"error: {call.name} failed: {type(e).__name__}: {e}", False
        return self._format(result), True

    def _format(self, result: Any) -> str:  # bounded to max_result_chars
        text = result if isinstance(result, str) else json.dumps(result, default=str)
        if len(text) > self.max_result_chars:
            cut = len(text) - self.max_result_chars
            text = text[: self.max_result_chars] + f"... [{cut} more characters cut]"
        return text


async def _each(closers: Sequence[Callable[[], Any]]) -> None:
    """Run every closer; the first error is raised after all of them ran."""
    first: BaseException | None = None
    for close in closers:
        try:
            await close()
        except Exception as e:  # noqa: BLE001 (the others still run)
            first = first or e
    if first is not None:
        raise first
