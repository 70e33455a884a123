"""The DeepSeek families (``deepseekv3``, ``deepseekv31``): calls between DeepSeek's special tokens.

What it is: the parsers SGLang and vLLM name ``deepseekv3`` (V3, R1-0528) and
``deepseekv31`` (V3.1, V3.2-Exp's chat form). Both wrap the calls in
``<｜tool▁calls▁begin｜>`` ... ``<｜tool▁calls▁end｜>`` with one
``<｜tool▁call▁begin｜>`` ... ``<｜tool▁call▁end｜>`` per call. Inside one call V3 writes
``function<｜tool▁sep｜>NAME`` then the arguments in a fenced json block; V3.1 writes
``NAME<｜tool▁sep｜>{json}``.
What it is not: DeepSeek V3.2's DSML (``<｜DSML｜invoke>``) nor V4's formats.

Content is the text outside the calls section.
"""

from __future__ import annotations

import re

from agentrl.toolcalls.output import CallsFound, ToolCall, Tools, call_from_json, load_json, one, scan_section

BEGIN, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
MARKERS = (BEGIN, CALL_BEGIN)
_CALL = re.compile(re.escape(CALL_BEGIN) + r"(.*?)(?:" + re.escape(CALL_END) + r"|$)", re.DOTALL)
_V3_BODY = re.compile(r"(\w*)" + re.escape(SEP) + r"(.*?)\n```json\n(.*)\n```\s*$", re.DOTALL)
EXAMPLE_V3 = f"{BEGIN}{CALL_BEGIN}function{SEP}tool_name\n```json\n{{\"arg\": \"value\"}}\n```{CALL_END}{END}"
EXAMPLE_V31 = f'{BEGIN}{CALL_BEGIN}tool_name{SEP}{{"arg": "value"}}{CALL_END}{END}'


def parse_v3(text: str, tools: Tools = None) -> CallsFound:
    return _parse(text, tools, _v3_call, EXAMPLE_V3)


def parse_v31(text: str, tools: Tools = None) -> CallsFound:
    return _parse(text, tools, _v31_call, EXAMPLE_V31)


def _parse(text: str, tools: Tools, read_call, example: str) -> CallsFound:
    def read(body: str, closed: bool) -> tuple[list[ToolCall], str]:
        if not closed:
            return [], f"tool call is missing its closing {CALL_END}"
        return one(*read_call(body, tools))

    return scan_section(text, BEGIN, END, _CALL, CALL_END, read, example)


def _v3_call(body: str, tools: Tools) -> tuple[ToolCall | None, str]:
    match = _V3_BODY.match(body)
    if match is None:
        return None, f"tool call is not in the form {EXAMPLE_V3}"
    args, error = load_json(match.group(3), "the arguments", EXAMPLE_V3)
    if error:
        return None, error
    return call_from_json(match.group(2).strip(), args, tools, EXAMPLE_V3)


def _v31_call(body: str, tools: Tools) -> tuple[ToolCall | None, str]:
    name, sep, raw = body.partition(SEP)
    if not sep:
        return None, f"tool call has no {SEP}; write {EXAMPLE_V31}"
    args, error = load_json(raw, "the arguments", EXAMPLE_V31)
    if error:
        return None, error
    return call_from_json(name.strip(), args, tools, EXAMPLE_V31)
