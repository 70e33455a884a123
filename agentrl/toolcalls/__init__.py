"""Tool calls and reasoning in model output, for every model family agentrl serves.

What it is: ``parse(text, tool_parser=NAME, reasoning_parser=NAME_OR_None, tools=None)`` →
``ParsedOutput`` (``.content``, ``.reasoning``, ``.tool_calls`` each with ``.name`` and
``.arguments`` as a dict, ``.errors``), with one small module per format family behind it.
Parser names are SGLang's; ``tests/toolcalls/`` checks each family against SGLang's and vLLM's
own parsers. What it is not: a chat-template renderer, nor a validator of arguments against a
schema.

    parsers.py      the parser registry and ``parse``
    output.py       what a parser returns: ParsedOutput, ToolCall
    stream.py       StreamParser: a reply read as it streams
    hermes.py       ``qwen25``, ``hermes``: ``<tool_call>{json}</tool_call>`` blocks
    qwen3_coder.py  ``qwen3_coder``: XML-style calls, one tag per parameter
    llama3.py       ``llama3``: ``<|python_tag|>`` and JSON
    mistral.py      ``mistral``: ``[TOOL_CALLS]`` then JSON
    deepseek.py     ``deepseekv3``, ``deepseekv31``: calls between DeepSeek's special tokens
    kimi_k2.py      ``kimi_k2``: a calls section with ``functions.NAME:N`` ids
    glm45.py        ``glm45``: ``<tool_call>NAME`` then key/value pairs
    gpt_oss.py      ``gpt-oss``: the harmony format (tool parser and reasoning parser)
    pythonic.py     ``pythonic``: a Python list of calls
    thinking.py     reasoning between think tags (``deepseek-r1``, ``qwen3``, ``kimi``)

A malformed call is never an exception: it is an error written for the model, and a call
written inside reasoning is never run. ``parse_tool_calls`` is the default (``qwen25``, no
reasoning) in its older shape.
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
