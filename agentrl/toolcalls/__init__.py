"""Tool calls and reasoning in model output, for every model family agentrl serves.

What it is: ``parse(text, tool_parser=NAME, reasoning_parser=NAME_OR_None, tools=None)`` →
``ParsedOutput`` (``.content``, ``.reasoning``, ``.tool_calls`` each with ``.name`` and
``.arguments`` as a dict, ``.errors``), with one small module per format family behind it
(``hermes``, ``qwen3_coder``, ``llama3``, ``mistral``, ``deepseek``, ``kimi_k2``, ``glm45``,
``gpt_oss``, ``pythonic``; reasoning in ``thinking`` and ``gpt_oss``). Parser names are
SGLang's; ``tests/toolcalls/`` checks each family against SGLang's and vLLM's own parsers.
What it is not: a chat-template renderer, nor a validator of arguments against a schema.

A malformed call is never an exception: it is an error written for the model, and a call
written inside reasoning is never run. ``parse_tool_calls`` is the default (``qwen25``, no
reasoning) in its older shape; ``StreamParser`` reads a reply as it streams.
"""

from agentrl.toolcalls.hermes import ParsedToolCalls, parse_tool_calls
from agentrl.toolcalls.output import ParsedOutput, ToolCall
from agentrl.toolcalls.parsers import (
    DEFAULT_TOOL_PARSER,
    REASONING_PARSERS,
    TOOL_PARSERS,
    check_parser_names,
    format_hint,
    parse,
)
from agentrl.toolcalls.stream import StreamDelta, StreamParser

__all__ = [
    "DEFAULT_TOOL_PARSER",
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "ParsedOutput",
    "ParsedToolCalls",
    "StreamDelta",
    "StreamParser",
    "ToolCall",
    "check_parser_names",
    "format_hint",
    "parse",
    "parse_tool_calls",
]
