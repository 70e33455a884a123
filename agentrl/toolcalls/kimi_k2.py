"""The Kimi-K2 family (``kimi_k2``): a calls section with ``functions.NAME:N`` ids.

What it is: the parser SGLang and vLLM name ``kimi_k2``. A reply's calls are::

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
    <|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

The id is ``functions.NAME:N`` (``NAME:N`` accepted); N counts calls across the conversation
and is not kept (our calls get OpenAI ids). Content is the text outside the section.
What it is not: a guesser of a bare counter id (``<|tool_call_begin|>3``): SGLang infers the
tool from the argument names there; we return an error asking for the full id.
"""

from __future__ import annotations

import re

from agentrl.toolcalls.output import CallsFound, ToolCall, Tools, call_from_json, load_json, one, scan_section

BEGIN, END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGS, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
MARKERS = (BEGIN, CALL_BEGIN)
EXAMPLE = f'{BEGIN}{CALL_BEGIN}functions.tool_name:0{ARGS}{{"arg": "value"}}{CALL_END}{END}'
_CALL = re.compile(re.escape(CALL_BEGIN) + r"(.*?)(?:" + re.escape(CALL_END) + r"|$)", re.DOTALL)
_ID = re.compile(r"^(?:functions\.)?([\w.\-]+):\d+$")


def parse_calls(text: str, tools: Tools = None) -> CallsFound:
    return scan_section(text, BEGIN, END, _CALL, CALL_END, lambda body, closed: one(*_read_call(body, closed, tools)),
                        EXAMPLE)


def _read_call(body: str, closed: bool, tools: Tools) -> tuple[ToolCall | None, str]:
    if not closed:
        return None, f"tool call is missing its closing {CALL_END}; write {EXAMPLE}"
    call_id, sep, raw = body.partition(ARGS)
    if not sep:
        return None, f"tool call has no {ARGS}; write {EXAMPLE}"
    match = _ID.match(call_id.strip())
    if match is None:
        return None, f"tool call id {call_id.strip()[:40]!r} is not functions.NAME:N; write {EXAMPLE}"
    args, error = load_json(raw.strip(), "the arguments", EXAMPLE)
    if error:
        return None, error
    return call_from_json(match.group(1), args, tools, EXAMPLE)
