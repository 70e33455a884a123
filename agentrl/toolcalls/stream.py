"""``StreamParser``: a reply read as it streams — reasoning and content deltas as soon as they are
final, the calls when the reply ends.

What it is: the streaming side of ``parse`` for ``agentrl serve``'s streamed chat answers.
``feed(delta)`` returns the reasoning and content text that can no longer change; ``close()``
returns what is left and the ``ParsedOutput`` of the whole reply, which is exactly
``parse(whole reply)``: the deltas of each kind add up to its ``.reasoning`` and ``.content``.
What it is not: a streamer of calls piece by piece (calls come whole at the end, as parsing
them needs their closing syntax).

What is held back: a partial tag at the end (``</thi`` may become ``</think>``); whitespace at
the edges (the parsed text is stripped); everything from the first place a call may start
(a marker of the family, or a prefix of one; ``[`` for ``pythonic``, a reply opening with
``{`` for ``llama3``); the whole reply for ``gpt-oss`` (harmony's headers are read at the end)
and for ``qwen3``/``kimi`` when the reply does not open with the start tag (the template may
have opened the block, and only a later end tag would tell).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.toolcalls import thinking
from agentrl.toolcalls.output import ParsedOutput, Tools
from agentrl.toolcalls.parsers import DEFAULT_TOOL_PARSER, TOOL_PARSERS, check_parser_names, parse

_THINK_TAGS = {"deepseek-r1": thinking.DEEPSEEK_R1, "qwen3": thinking.QWEN3, "kimi": thinking.KIMI}


@dataclass
class StreamDelta:
    reasoning: str = ""
    content: str = ""


class StreamParser:
    """Feed a reply's text as it comes; see the module docstring."""

    def __init__(self, tool_parser: str = DEFAULT_TOOL_PARSER, reasoning_parser: str | None = None,
                 tools: Tools = None) -> None:
        check_parser_names(tool_parser, reasoning_parser)
        self.tool_parser, self.reasoning_parser, self.tools = tool_parser, reasoning_parser, tools
        self.markers = TOOL_PARSERS[tool_parser][1] + {"pythonic": ("[", "<|python_end|>")}.get(tool_parser, ())
        self.text = ""
        self.sent = StreamDelta()

    def feed(self, delta: str) -> StreamDelta:
        self.text += delta
        reasoning, content = self._stable()
        return self._advance(reasoning, content)

    def close(self) -> tuple[StreamDelta, ParsedOutput]:
        out = parse(self.text, self.tool_parser, self.reasoning_parser, self.tools)
        return self._advance(out.reasoning or "", out.content), out

    def _advance(self, reasoning: str, content: str) -> StreamDelta:
        """The new part of each (held back if it is not an extension of what was sent)."""
        delta = StreamDelta(
            reasoning[len(self.sent.reasoning):] if reasoning.startswith(self.sent.reasoning) else "",
            content[len(self.sent.content):] if content.startswith(self.sent.content) else "")
        self.sent.reasoning += delta.reasoning
        self.sent.content += delta.content
        return delta

    def _stable(self) -> tuple[str, str]:
        """The reasoning and content that no further text can change (as ``parse`` will strip them)."""
        if "gpt-oss" in (self.tool_parser, self.reasoning_parser):
            return "", ""
        rest = self.text
        reasoning = ""
        tags = _THINK_TAGS.get(self.reasoning_parser or "")
        if tags is not None:
            body = rest.lstrip()
            if tags.start.startswith(body):  # the start tag may be coming: nothing is known yet
                return "", ""
            if body.startswith(tags.start):
                body = body[len(tags.start):]
            elif not tags.forced:
                return "", ""  # a template-opened block would only show at its end tag
            if tags.end not in body:
                return _settled(body[: len(body) - _partial(body, (tags.end,))]), ""
            reasoning, _, rest = body.partition(tags.end)
            reasoning = reasoning.strip()
        stop = min((i for i in (rest.find(m) for m in self.markers) if i != -1), default=len(rest))
        stop = min(stop, len(rest) - _partial(rest, self.markers))
        if self.tool_parser == "llama3" and rest.lstrip().startswith("{"):
            stop = 0
        return reasoning, _settled(rest[:stop])


def _partial(text: str, markers: tuple[str, ...]) -> int:
    """The length of the longest end of ``text`` that begins one of ``markers``."""
    return max((k for m in markers for k in range(1, len(m)) if text.endswith(m[:k])), default=0)


def _settled(text: str) -> str:
    """``text`` without leading whitespace and without trailing whitespace (it may yet be the end)."""
    return text.strip()
