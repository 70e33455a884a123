"""What a parser returns: ``ParsedOutput`` (content, reasoning, tool calls, errors) and ``ToolCall``.

What it is: the shared result types of every family module in ``agentrl.toolcalls`` and the
few helpers they share — reading a call's JSON arguments, typing a text value by the tool's
JSON schema (the XML-ish families write every value as text), and the unknown-tool check.
What it is not: a parser of any one format (each family has its own module).

Every helper reports a problem as an error string written for the model to read; none raises.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

Tools = Sequence[dict[str, Any]] | None  # OpenAI tool definitions ({"type": "function", "function": {...}})


@dataclass
class ToolCall:
    """One parsed call. ``arguments`` is a dict; ``id`` follows OpenAI's ``call_<hex>`` form."""

    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self, index: int = 0) -> dict[str, Any]:
        return {
            "id": self.id,
            "index": index,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }


@dataclass
class ParsedOutput:
    """A model's output read by one tool parser and, optionally, one reasoning parser.

    ``content`` is the text outside reasoning with every well-formed call removed (stripped;
    a malformed block stays in it, so the model sees what it wrote); ``reasoning`` is the
    reasoning text (stripped) or None when the reasoning parser found none or none was asked
    for; ``tool_calls`` are the calls to run — never one written inside reasoning; ``errors``
    holds one message per malformed or refused call, written for the model.
    """

    content: str
    reasoning: str | None
    tool_calls: list[ToolCall]
    errors: list[str]


@dataclass
class CallsFound:
    """What a family's tool parser returns for text already free of reasoning."""

    content: str
    calls: list[ToolCall]
    errors: list[str]


ReadCall = Callable[[str, bool], tuple[list[ToolCall], str]]
"""A family's reader of one call's body (and whether its closing marker came): (its calls, an
error for the model; empty when the calls are good)."""


def scan_blocks(text: str, block: re.Pattern, close: str, read: ReadCall) -> CallsFound:
    """Calls written as tagged blocks anywhere in the text (Hermes' ``<tool_call>``, GLM-4.5's,
    Qwen3-Coder's): each ``block`` match — closed by ``close``, or cut off at the end — read by
    ``read``; the good ones leave the content, a block with an error stays in it."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    kept: list[str] = []
    pos = 0
    for match in block.finditer(text):
        kept.append(text[pos : match.start()])
        pos = match.end()
        found, error = read(match.group(1), match.group(0).endswith(close))
        if error:
            errors.append(error)
            kept.append(match.group(0))
        else:
            calls.extend(found)
    kept.append(text[pos:])
    return CallsFound("".join(kept).strip(), calls, errors)


def scan_section(text: str, begin: str, end: str, call: re.Pattern, call_end: str, read: ReadCall,
                 example: str) -> CallsFound:
    """Calls inside one section of special tokens (DeepSeek's, Kimi-K2's): each ``call`` match
    in ``begin`` ... ``end`` read by ``read``. A section with any error is refused whole (left
    in the content, every error said), so the model writes it again; the content is the text
    outside the section."""
    if begin not in text:
        return CallsFound(text.strip(), [], [])
    before, _, section = text.partition(begin)
    section, closed, after = section.partition(end)
    calls: list[ToolCall] = []
    errors: list[str] = []
    for match in call.finditer(section):
        found, error = read(match.group(1), match.group(0).endswith(call_end))
        if error:
            errors.append(error)
        else:
            calls.extend(found)
    if not calls and not errors:
        errors.append(f"the tool calls section holds no call; write {example}")
    if not closed and not errors:
        errors.append(f"the tool calls section is missing its closing {end}")
    if errors:
        return CallsFound(text.strip(), [], errors)
    return CallsFound((before.strip() + " " + after.strip()).strip(), calls, [])


def one(call: ToolCall | None, error: str) -> tuple[list[ToolCall], str]:
    """A reader's single call as ``ReadCall``'s (calls, error)."""
    return ([call] if call is not None else []), error


def tool_function(tool: Any) -> dict[str, Any]:
    """The function object of one offered tool (``{"type": "function", "function": {...}}``, or
    the function itself); ``{}`` for an entry of another shape (``{"function": null}``, a string)."""
    if not isinstance(tool, dict):
        return {}
    fn = tool.get("function", tool)
    return fn if isinstance(fn, dict) else {}


def tool_names(tools: Tools) -> list[str] | None:
    """The names of the offered tools, or None when no list was given (every name is accepted);
    an entry without a string name names nothing."""
    if tools is None:
        return None
    return [name for t in tools if isinstance(name := tool_function(t).get("name"), str)]


def unknown_tool_error(name: str, tools: Tools) -> str | None:
    """An error when ``tools`` were given and ``name`` is not one of them, else None."""
    names = tool_names(tools)
    if names is None or name in names:
        return None
    return f"there is no tool {name!r}; the tools are {sorted(names)}"


def call_from_json(name: Any, args: Any, tools: Tools, example: str) -> tuple[ToolCall | None, str]:
    """A call from a decoded name and arguments (an object, or a string holding one)."""
    if not isinstance(name, str) or not name:
        return None, f"tool call needs a string name; write {example}"
    if args is None:
        args = {}
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return None, f"the arguments of {name!r} are a string that is not JSON; write an object"
    if not isinstance(args, dict):
        return None, f"the arguments of {name!r} must be a JSON object, got {type(args).__name__}"
    refused = unknown_tool_error(name, tools)
    if refused:
        return None, refused
    return ToolCall(name, args), ""


def load_json(text: str, what: str, example: str) -> tuple[Any, str]:
    """``json.loads`` with the error as a message (value, "") or (None, message)."""
    try:
        return json.loads(text), ""
    except json.JSONDecodeError as e:
        return None, f"{what} is not valid JSON ({e.msg} at char {e.pos}); write {example}"


def parameter_types(name: str, tools: Tools) -> dict[str, str]:
    """The JSON-schema type of each parameter of tool ``name`` ({} when unknown)."""
    for tool in tools or ():
        fn = tool_function(tool)
        if fn.get("name") == name:
            params = fn.get("parameters")
            props = params.get("properties") if isinstance(params, dict) else None
            return {k: _schema_type(v) for k, v in props.items() if isinstance(v, dict)} if isinstance(props, dict) \
                else {}
    return {}


def _schema_type(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):  # ["string", "null"]: the first that is not null
        kind = next((k for k in kind if k != "null"), "string")
    if not isinstance(kind, str):
        return "string" if "enum" in schema else "object"
    return kind


def typed_value(text: str, kind: str | None) -> tuple[Any, str]:
    """A parameter written as text, read by its schema type: (value, "") or (None, error).

    ``string`` stays text; ``integer``/``number``/``boolean``/``object``/``array`` must read as
    such (JSON for the last two), else the error says what was expected; a parameter the schema
    does not type is read as JSON, then as a Python literal, and stays text when it is neither.
    ``null`` is None for every type.
    """
    if text.lower() == "null":
        return None, ""
    if kind == "string":
        return text, ""
    expected = f"{kind}, got {text[:40]!r}"
    if kind == "integer":
        try:
            return int(text), ""
        except ValueError:
            return None, expected
    if kind == "number":
        try:
            value = float(text)
        except ValueError:
            return None, expected
        return (int(value) if value.is_integer() and not any(c in text.lower() for c in ".e") else value), ""
    if kind == "boolean":
        return (text.lower() == "true", "") if text.lower() in ("true", "false") else (None, expected)
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        if kind in ("object", "array"):
            return None, f"{kind} (as JSON), got {text[:40]!r}"
        try:
            return ast.literal_eval(text), ""
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return text, ""
    if kind == "object" and not isinstance(value, dict) or kind == "array" and not isinstance(value, list):
        return None, expected
    return value, ""
