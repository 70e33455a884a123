"""The Llama 3.x JSON family (``llama3``): ``<|python_tag|>{"name": ..., "parameters": {...}}``.

What it is: the parser SGLang names ``llama3`` (vLLM: ``llama3_json``). Llama 3.1-3.3 write a
call as one JSON object with ``name`` and ``parameters`` (``arguments`` is accepted too), after
``<|python_tag|>`` or as the whole reply; several calls are separated by ``;``.
What it is not: Llama's built-in ``brave_search``/``wolfram_alpha`` python-call form, nor
Llama 4's pythonic form (``pythonic``).

A reply without ``<|python_tag|>`` is a call only when it starts with ``{"name"``; any
other reply is content.
"""

from __future__ import annotations

import json

from agentrl.toolcalls.output import CallsFound, ToolCall, Tools, call_from_json

TAG = "<|python_tag|>"
MARKERS = (TAG,)
EXAMPLE = f'{TAG}{{"name": "tool_name", "parameters": {{"arg": "value"}}}}'
_DECODER = json.JSONDecoder()


def parse_calls(text: str, tools: Tools = None) -> CallsFound:
    if TAG in text:
        before, _, body = text.partition(TAG)
    elif text.lstrip().startswith("{") and text.lstrip()[1:].lstrip().startswith('"name"'):
        before, body = "", text
    else:
        return CallsFound(text.strip(), [], [])
    calls: list[ToolCall] = []
    pos, end = 0, len(body)
    while True:
        while pos < end and (body[pos].isspace() or body[pos] == ";"):
            pos += 1
        if pos == end or (calls and body[pos] != "{"):  # text after the calls is content
            return CallsFound((before.strip() + " " + body[pos:].strip()).strip(), calls, [])
        try:
            obj, pos = _DECODER.raw_decode(body, pos)
        except json.JSONDecodeError as e:
            error = f"tool call is not valid JSON ({e.msg} at char {e.pos}); write {EXAMPLE}"
            return CallsFound(text.strip(), [], [error])
        if not isinstance(obj, dict):
            return CallsFound(text.strip(), [], [f"tool call must be a JSON object; write {EXAMPLE}"])
        args = obj["parameters"] if "parameters" in obj else obj.get("arguments", {})
        call, error = call_from_json(obj.get("name"), args, tools, EXAMPLE)
        if call is None:
            return CallsFound(text.strip(), [], [error])
        calls.append(call)
