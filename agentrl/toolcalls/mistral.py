"""The Mistral family (``mistral``): ``[TOOL_CALLS]`` then a JSON array, or ``name[ARGS]{...}``.

What it is: the parser SGLang and vLLM name ``mistral``. Two forms follow ``[TOOL_CALLS]``:
the JSON array of v0.3-era models, ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``,
and the compact form of newer templates, ``[TOOL_CALLS]name[ARGS]{...}``, repeated per call.
Content is the text before ``[TOOL_CALLS]``.
What it is not: a reader of Mistral's 9-character call ids (``[CALL_ID]``); ids are ours.
"""

from __future__ import annotations

import json

from agentrl.toolcalls.output import CallsFound, ToolCall, Tools, call_from_json

TAG, ARGS = "[TOOL_CALLS]", "[ARGS]"
MARKERS = (TAG,)
EXAMPLE = f'{TAG}[{{"name": "tool_name", "arguments": {{"arg": "value"}}}}]'
_DECODER = json.JSONDecoder()


def parse_calls(text: str, tools: Tools = None) -> CallsFound:
    if TAG not in text:
        return CallsFound(text.strip(), [], [])
    before, _, body = text.partition(TAG)
    body = body.lstrip()
    calls, error, rest = (_json_array if body.startswith("[") else _compact)(body, tools)
    if error:
        return CallsFound(text.strip(), [], [error])
    content = " ".join(part for part in (before.strip(), rest.strip()) if part)
    return CallsFound(content, calls, [])


def _json_array(body: str, tools: Tools) -> tuple[list[ToolCall], str, str]:
    try:
        items, end = _DECODER.raw_decode(body)
    except json.JSONDecodeError as e:
        return [], f"tool calls are not valid JSON ({e.msg} at char {e.pos}); write {EXAMPLE}", ""
    calls = []
    for item in items if isinstance(items, list) else [items]:
        if not isinstance(item, dict):
            return [], f"each tool call must be a JSON object; write {EXAMPLE}", ""
        call, error = call_from_json(item.get("name"), item.get("arguments", {}), tools, EXAMPLE)
        if call is None:
            return [], error, ""
        calls.append(call)
    return calls, "", body[end:]


def _compact(body: str, tools: Tools) -> tuple[list[ToolCall], str, str]:
    calls = []
    while True:
        name, sep, rest = body.partition(ARGS)
        if not sep:
            return [], f"tool call {name.strip()[:40]!r} has no {ARGS}; write {TAG}tool_name{ARGS}{{...}}", ""
        try:
            args, end = _DECODER.raw_decode(rest.lstrip())
        except json.JSONDecodeError as e:
            return [], f"the arguments of {name.strip()!r} are not valid JSON ({e.msg} at char {e.pos})", ""
        call, error = call_from_json(name.strip(), args, tools, EXAMPLE)
        if call is None:
            return [], error, ""
        calls.append(call)
        body = rest.lstrip()[end:].lstrip()
        if not body.startswith(TAG):
            return calls, "", body
        body = body[len(TAG) :].lstrip()
