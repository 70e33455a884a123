"""The parser registry and ``parse``: model output in, content, reasoning, calls and errors out.

What it is: the one entry point every reader of model output uses (``agentrl serve``'s OpenAI
routes, the gateway, ``TextEnv``'s tools, ``ChatClient``), with the parsers named as SGLang
names them (``--tool-call-parser``, ``--reasoning-parser``). Reasoning is split off first and
the tool parser reads only what is left, so a call written inside reasoning is never run: it
is reported in ``errors`` instead.
What it is not: the streaming reader (``stream.StreamParser``, built on this), nor a
chat-template renderer.

Main hook: ``parse(text, tool_parser="qwen25", reasoning_parser=None, tools=None)``. With
``tools`` (OpenAI tool definitions) a call to a tool not offered is an error, and the XML-ish
families type their text values by each tool's JSON schema.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

from agentrl.toolcalls import (
    deepseek,
    glm45,
    gpt_oss,
    hermes,
    kimi_k2,
    llama3,
    mistral,
    pythonic,
    qwen3_coder,
    thinking,
)
from agentrl.toolcalls.output import CallsFound, ParsedOutput, Tools

# name -> (parse_calls(text, tools), the markers that open a call, for spotting calls in reasoning)
TOOL_PARSERS: dict[str, tuple[Callable[[str, Tools], CallsFound], tuple[str, ...]]] = {
    "qwen25": (hermes.parse_calls, (hermes.OPEN,)),
    "qwen": (hermes.parse_calls, (hermes.OPEN,)),
    "hermes": (hermes.parse_calls, (hermes.OPEN,)),
    "qwen3_coder": (qwen3_coder.parse_calls, qwen3_coder.MARKERS),
    "llama3": (llama3.parse_calls, llama3.MARKERS),
    "mistral": (mistral.parse_calls, mistral.MARKERS),
    "deepseekv3": (deepseek.parse_v3, deepseek.MARKERS),
    "deepseekv31": (deepseek.parse_v31, deepseek.MARKERS),
    "kimi_k2": (kimi_k2.parse_calls, kimi_k2.MARKERS),
    "glm45": (glm45.parse_calls, glm45.MARKERS),
    "gpt-oss": (gpt_oss.parse_calls, gpt_oss.MARKERS),
    "pythonic": (pythonic.parse_calls, pythonic.MARKERS),
}

# name -> split(text) -> (reasoning or None, the rest)
REASONING_PARSERS: dict[str, Callable[[str], tuple[str | None, str]]] = {
    "deepseek-r1": thinking.DEEPSEEK_R1.split,
    "qwen3": thinking.QWEN3.split,
    "kimi": thinking.KIMI.split,
    "gpt-oss": gpt_oss.split_reasoning,
}

DEFAULT_TOOL_PARSER = "qwen25"


def format_hint(text: str, tool_parser: str) -> list[str]:
    """The tool parsers whose call markers ``text`` holds when ``tool_parser``'s it does not: a
    sign the model writes calls in another family's format (the parser does not match its
    chat template). Empty when ``text`` holds none, or holds ``tool_parser``'s own."""
    read, own = TOOL_PARSERS[tool_parser]
    if any(marker in text for marker in own):
        return []
    return sorted(name for name, (other, markers) in TOOL_PARSERS.items()
                  if other is not read and any(marker in text for marker in markers))


def check_parser_names(tool_parser: str, reasoning_parser: str | None) -> None:
    """Raise ValueError naming the known parsers when either name is unknown."""
    _check(tool_parser, TOOL_PARSERS, "tool_parser")
    if reasoning_parser is not None:
        _check(reasoning_parser, REASONING_PARSERS, "reasoning_parser")


def _check(name: str, known: dict, what: str) -> None:
    if name not in known:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown {what} {name!r}; known: {', '.join(sorted(known))}.{hint}")


def parse(
    text: str,
    tool_parser: str = DEFAULT_TOOL_PARSER,
    reasoning_parser: str | None = None,
    tools: Tools = None,
) -> ParsedOutput:
    """Read one reply. Never raises on the text (malformed calls are ``errors``); an unknown
    parser name raises ValueError listing the known ones.

    Args:
        text: the model's reply as decoded text (special tokens of the format kept).
        tool_parser: a name in ``TOOL_PARSERS`` (SGLang's ``--tool-call-parser`` names).
        reasoning_parser: a name in ``REASONING_PARSERS``, or None for no reasoning.
        tools: the OpenAI tool definitions offered, or None to accept any tool name.
    """
    check_parser_names(tool_parser, reasoning_parser)
    reasoning, rest = None, text
    if reasoning_parser is not None:
        reasoning, rest = REASONING_PARSERS[reasoning_parser](text)
    read_calls, markers = TOOL_PARSERS[tool_parser]
    try:
        found = read_calls(rest, tools if tools is None or isinstance(tools, list | tuple) else [])
    except RecursionError:  # JSON (or Python) nested deeper than the interpreter's recursion limit
        found = CallsFound(rest.strip(), [], ["a tool call nested too deeply to read; write its arguments with "
                                              "fewer levels of nesting"])
    errors = list(found.errors)
    if reasoning and any(marker in reasoning for marker in markers):
        errors.append(
            "a tool call written inside the reasoning was not run; write calls after the reasoning ends"
        )
    return ParsedOutput(found.content, reasoning, found.calls, errors)
