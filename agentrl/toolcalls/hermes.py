"""Tool calls in model output: parsing ``<tool_call>{json}</tool_call>`` blocks.

What it is: the one parser shared by the OpenAI-compatible server (to fill
``message.tool_calls``) and the environments (to run the calls the model made). The format
is the one the tiny model's chat template renders and the Hermes/Qwen2.5 form SGLang's
``qwen25`` parser reads: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
What it is not: a validator of arguments against a tool's schema (the environment does that).

A malformed block is never an exception: it is reported in ``ParsedToolCalls.errors`` with a
message written for the model to read, and left in ``content``.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)


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
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }


@dataclass
class ParsedToolCalls:
    content: str  # the text with every well-formed call block removed, stripped
    calls: list[ToolCall]
    errors: list[str]  # one message per malformed block, written for the model


def parse_tool_calls(text: str) -> ParsedToolCalls:
    """Split model output into plain content, well-formed calls and malformed-call errors."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    kept: list[str] = []
    pos = 0
    for match in _BLOCK.finditer(text):
        kept.append(text[pos : match.start()])
        pos = match.end()
        body = match.group(1).strip()
        closed = match.group(0).endswith(CLOSE)
        call, error = _parse_one(body, closed)
        if call is not None:
            calls.append(call)
        else:
            errors.append(error)
            kept.append(match.group(0))
    kept.append(text[pos:])
    return ParsedToolCalls("".join(kept).strip(), calls, errors)


def _parse_one(body: str, closed: bool) -> tuple[ToolCall | None, str]:
    example = f'{OPEN}{{"name": "tool_name", "arguments": {{"arg": "value"}}}}{CLOSE}'
    if not closed:
        return None, f"tool call is missing its closing {CLOSE}; write {example}"
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return None, f"tool call is not valid JSON ({e.msg} at char {e.pos}); write {example}"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None, f'tool call needs a string "name"; write {example}'
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return None, f'"arguments" of {obj["name"]!r} is a string that is not JSON; use an object'
    if not isinstance(args, dict):
        return None, f'"arguments" of {obj["name"]!r} must be a JSON object, got {type(args).__name__}'
    return ToolCall(obj["name"], args), ""
