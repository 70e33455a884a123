"""The Qwen3-Coder family (``qwen3_coder``): XML-style calls with one tag per parameter.

What it is: the parser SGLang and vLLM name ``qwen3_coder``. A call is::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Every value is written as text: one newline after the opening and before the closing
parameter tag is dropped, and the value is read by the parameter's type in the tool's JSON
schema (``output.typed_value``); a parameter the schema does not name stays text.
What it is not: a checker that required parameters are present (the environment does that).
"""

from __future__ import annotations

import re

from agentrl.toolcalls.output import (
    CallsFound,
    ToolCall,
    Tools,
    parameter_types,
    scan_blocks,
    typed_value,
    unknown_tool_error,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MARKERS = (OPEN, "<function=")
EXAMPLE = f"{OPEN}\n<function=tool_name>\n<parameter=arg>\nvalue\n</parameter>\n</function>\n{CLOSE}"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)
_FUNCTION = re.compile(r"<function=([^>\n]*)>(.*?)(?:</function>|$)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]*)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)


def parse_calls(text: str, tools: Tools = None) -> CallsFound:
    return scan_blocks(text, _BLOCK, CLOSE, lambda body, closed: _parse_block(body, closed, tools))


def _parse_block(body: str, closed: bool, tools: Tools) -> tuple[list[ToolCall], str]:
    if not closed:
        return [], f"tool call is missing its closing {CLOSE}; write {EXAMPLE}"
    functions = list(_FUNCTION.finditer(body))
    if not functions:
        return [], f"tool call has no <function=NAME> tag; write {EXAMPLE}"
    calls = []
    for fn in functions:
        name = fn.group(1).strip()
        if not fn.group(0).endswith("</function>"):
            return [], f"function {name!r} is missing its closing </function>; write {EXAMPLE}"
        if not name:
            return [], f"tool call needs a function name; write {EXAMPLE}"
        refused = unknown_tool_error(name, tools)
        if refused:
            return [], refused
        types = parameter_types(name, tools)
        arguments = {}
        for param in _PARAMETER.finditer(fn.group(2)):
            value = param.group(2)
            value = value[1:] if value.startswith("\n") else value
            value = value[:-1] if value.endswith("\n") else value
            key = param.group(1).strip()
            arguments[key], error = typed_value(value, types.get(key, "string"))
            if error:
                return [], f"parameter {key!r} of {name!r} must be {error}"
        calls.append(ToolCall(name, arguments))
    return calls, ""
