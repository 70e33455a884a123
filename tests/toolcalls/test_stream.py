"""``StreamParser``: a reply fed in pieces reads exactly as the whole reply does (issue 28's
"streaming split at every character boundary"), and what can stream does stream.

Replies from the conformance corpus (every pair and kind) are fed one character at a time and
in random chunks: the reasoning and content deltas must add up to ``parse``'s reasoning and
content, the calls come at the end equal to ``parse``'s, and no delta ever has to be taken back.
"""

from __future__ import annotations

import random

import pytest

from agentrl.toolcalls import StreamParser, parse

from .corpus import PAIRS, TOOLS, corpus


def _sample():
    picked: dict[tuple, list] = {}
    for case in corpus():
        key = (case.tool_parser, case.reasoning_parser, case.kind)
        if len(picked.setdefault(key, [])) < 3:
            picked[key].append(case)
    return [c for cases in picked.values() for c in cases]


SAMPLE = _sample()


def _stream(text: str, pieces: list[str], tool_parser: str, reasoning_parser: str | None):
    parser = StreamParser(tool_parser, reasoning_parser, TOOLS)
    reasoning, content, early = "", "", ""
    for piece in pieces:
        delta = parser.feed(piece)
        reasoning, content = reasoning + delta.reasoning, content + delta.content
        early += delta.reasoning + delta.content
    delta, out = parser.close()
    return reasoning + delta.reasoning, content + delta.content, out, early


@pytest.mark.parametrize("tool_parser,reasoning_parser", PAIRS)
def test_a_reply_fed_at_every_character_boundary_reads_as_the_whole(tool_parser, reasoning_parser):
    rng = random.Random(0)
    for case in [c for c in SAMPLE if (c.tool_parser, c.reasoning_parser) == (tool_parser, reasoning_parser)]:
        whole = parse(case.text, tool_parser, reasoning_parser, TOOLS)
        cuts = sorted(rng.sample(range(1, len(case.text)), min(8, len(case.text) - 1)))
        chunked = [case.text[a:b] for a, b in zip([0, *cuts], [*cuts, len(case.text)], strict=True)]
        for pieces in (list(case.text), chunked):
            reasoning, content, out, _ = _stream(case.text, pieces, tool_parser, reasoning_parser)
            assert (reasoning, content) == (whole.reasoning or "", whole.content), (case.id, pieces[:3])
            assert [(c.name, c.arguments) for c in out.tool_calls] == [(c.name, c.arguments) for c in whole.tool_calls]
            assert out.errors == whole.errors


def test_reasoning_and_content_stream_before_the_reply_ends():
    text = '<think>\nLet me look.\n</think>\n\nChecking now.\n<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'
    parser = StreamParser("qwen25", "qwen3", TOOLS)
    deltas = [parser.feed(ch) for ch in text]
    streamed_reasoning = "".join(d.reasoning for d in deltas)
    streamed_content = "".join(d.content for d in deltas)
    assert streamed_reasoning == "Let me look." and streamed_content == "Checking now."
    # the call's text never streams as content: it was held from its first '<'
    last, out = parser.close()
    assert (last.reasoning, last.content) == ("", "") and [c.name for c in out.tool_calls] == ["ping"]


def test_a_partial_end_tag_is_held_back():
    parser = StreamParser("qwen25", "deepseek-r1")
    assert parser.feed("thinking </thi").reasoning == "thinking"
    assert parser.feed("nk>answer").content == "answer"
