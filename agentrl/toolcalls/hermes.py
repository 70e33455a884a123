"""The Hermes/Qwen2.5 family (``qwen25``, ``hermes``): ``<tool_call>{json}</tool_call>`` blocks.

What it is: the parser SGLang names ``qwen25`` and ``hermes`` (vLLM: ``hermes``). Each call is
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen's template puts a newline
inside each tag); several calls are several blocks. It is the format the tiny model's chat
template renders, and ``parse_tool_calls`` (today's default, no reasoning) reads it.
What it is not: a validator of arguments against a tool's schema (the environment does that).

A malformed block is never an exception: it is reported in ``errors`` with a message written
for the model to read, and left in ``content``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agentrl.toolcalls.output import CallsFound, ToolCall, Tools, call_from_json, load_json, one, scan_blocks

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)


@dataclass
class ParsedToolCalls:
    content: str  # the text with every well-formed call block removed, stripped
    calls: list[ToolCall]
    errors: list[str]  # one message per malformed block, written for the model


def parse_calls(text: str, tools: Tools = None) -> CallsFound:
    """Split text into plain content, well-formed calls and malformed-call errors."""
    return scan_blocks(text, _BLOCK, CLOSE, lambda body, closed: one(*_parse_one(body.strip(), closed, tools)))


def parse_tool_calls(text: str) -> ParsedToolCalls:
    """Today's default (``qwen25``, no reasoning parser, every tool name accepted)."""
    found = parse_calls(text)
    return ParsedToolCalls(found.content, found.calls, found.errors)


EXAMPLE = f'{OPEN}{{"name": "tool_name", "arguments": {{"arg": "value"}}}}{CLOSE}'


def _parse_one(body: str, closed: bool, tools: Tools) -> tuple[ToolCall | None, str]:
    if not closed:
        return None, f"tool call is missing its closing {CLOSE}; write {EXAMPLE}"
    obj, error = load_json(body, "tool call", EXAMPLE)
    if error:
        return None, error
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None, f'tool call needs a string "name"; write {EXAMPLE}'
    args = obj["arguments"] if "arguments" in obj else obj.get("parameters", {})
    return call_from_json(obj["name"], args, tools, EXAMPLE)
