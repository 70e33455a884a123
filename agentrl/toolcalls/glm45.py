"""The GLM-4.5 family (``glm45``): ``<tool_call>NAME`` then ``<arg_key>``/``<arg_value>`` pairs.

What it is: the parser SGLang names ``glm45`` (vLLM: ``glm45``). A call is::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

Values are text, read by the parameter's type in the tool's JSON schema (``string`` stays
text; other types and parameters the schema does not name are read as JSON when they are).
What it is not: GLM-4.7's form without the newline after the name (``glm47``).
"""

from __future__ import annotations

import re

from agentrl.toolcalls.output import (
    CallsFound,
    ToolCall,
    Tools,
    one,
    parameter_types,
    scan_blocks,
    typed_value,
    unknown_tool_error,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MARKERS = (OPEN,)
EXAMPLE = f"{OPEN}tool_name\n<arg_key>arg</arg_key>\n<arg_value>value</arg_value>\n{CLOSE}"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)
_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def parse_calls(text: str, tools: Tools = None) -> CallsFound:
    return scan_blocks(text, _BLOCK, CLOSE, lambda body, closed: one(*_read_call(body, closed, tools)))


def _read_call(body: str, closed: bool, tools: Tools) -> tuple[ToolCall | None, str]:
    if not closed:
        return None, f"tool call is missing its closing {CLOSE}; write {EXAMPLE}"
    name, _, rest = body.partition("\n")
    name = name.strip()
    if not name or "<" in name:
        return None, f"tool call needs the tool's name on its first line; write {EXAMPLE}"
    leftover = _PAIR.sub("", rest).strip()
    if leftover:
        return None, f"tool call {name!r} has text outside <arg_key>/<arg_value> pairs: {leftover[:40]!r}"
    refused = unknown_tool_error(name, tools)
    if refused:
        return None, refused
    types = parameter_types(name, tools)
    args = {}
    for key, value in _PAIR.findall(rest):
        args[key.strip()], error = typed_value(value, types.get(key.strip()))
        if error:
            return None, f"parameter {key.strip()!r} of {name!r} must be {error}"
    return ToolCall(name, args), ""
