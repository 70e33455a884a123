"""Each family's parser on hand-made replies: the bug stories behind ``agentrl.toolcalls.parse``.

The conformance suite (``test_conformance.py``) compares whole corpora with SGLang and vLLM;
these pin the rules that are ours: a call written in reasoning never runs, a malformed reply
is an error and never an exception (checked on every prefix of a reply, as a stream cut
anywhere would leave it), an unknown parser name lists the known ones.
"""

from __future__ import annotations

import pytest

from agentrl.toolcalls import REASONING_PARSERS, TOOL_PARSERS, parse, parse_tool_calls

from .corpus import PAIRS, TOOLS, Call, render, render_calls

CALLS = [Call("get_weather", {"city": "Zürich \"centre\"", "days": 3}), Call("search_docs", {"query": "東京", "filters": {"tags": ["a", {"b": None}]}})]


@pytest.mark.parametrize("tool_parser,reasoning_parser", PAIRS)
def test_each_family_reads_its_own_format(tool_parser, reasoning_parser):
    reasoning = "Two lookups are needed." if reasoning_parser else None
    content = "" if tool_parser in ("pythonic", "llama3", "gpt-oss") else "Looking it up."
    out = parse(render(tool_parser, reasoning_parser, content, reasoning, CALLS), tool_parser, reasoning_parser, TOOLS)
    assert [(c.name, c.arguments) for c in out.tool_calls] == [(c.name, c.arguments) for c in CALLS]
    assert (out.content, out.errors) == (content, [])
    assert out.reasoning == (reasoning if reasoning_parser else None)


@pytest.mark.parametrize("tool_parser,reasoning_parser", [p for p in PAIRS if p[1] and p[0] != "gpt-oss"])
def test_a_call_written_in_reasoning_is_never_run(tool_parser, reasoning_parser):
    hidden = "maybe " + render_calls(tool_parser, CALLS[:1])
    out = parse(render(tool_parser, reasoning_parser, "No tool needed.", hidden, []), tool_parser, reasoning_parser, TOOLS)
    assert out.tool_calls == [] and out.content == "No tool needed."
    assert "inside the reasoning was not run" in out.errors[-1]


def test_an_unclosed_think_with_a_call_is_reasoning_not_a_call():
    # SGLang's qwen3 (and vLLM's) end the reasoning at <tool_call>; we keep it reasoning: the model never closed it
    out = parse("<think>I will call <tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>", "qwen25", "qwen3")
    assert out.tool_calls == [] and out.content == "" and "<tool_call>" in out.reasoning
    assert "not run" in out.errors[0]


def test_gpt_oss_call_on_the_analysis_channel_is_not_run():
    text = ('<|channel|>analysis to=functions.ping <|constrain|>json<|message|>{}<|call|>')
    out = parse(text, "gpt-oss", "gpt-oss")
    assert out.tool_calls == [] and out.reasoning is None and "analysis channel" in out.errors[0]
    out = parse(text, "gpt-oss")
    assert out.tool_calls == [] and "analysis channel" in out.errors[0]


@pytest.mark.parametrize("tool_parser,reasoning_parser", PAIRS)
def test_every_prefix_of_a_reply_parses_without_raising(tool_parser, reasoning_parser):
    text = render(tool_parser, reasoning_parser, "ok", "hmm" if reasoning_parser else None, CALLS)
    for cut in range(len(text) + 1):
        out = parse(text[:cut], tool_parser, reasoning_parser, TOOLS)
        assert len(out.tool_calls) <= len(CALLS)
        for call in out.tool_calls:  # a call is only ever one the model finished writing
            assert (call.name, call.arguments) in [(c.name, c.arguments) for c in CALLS], (cut, text[:cut])


@pytest.mark.parametrize("text,tool_parser,fragment", [
    ("<tool_call>\n{\"name\": \"ping\", \"arguments\": {}\n</tool_call>", "qwen25", "not valid JSON"),
    ("<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>", "qwen25", "there is no tool 'nope'"),
    ("<tool_call>\n<function=ping>\n</tool_call>", "qwen3_coder", "missing its closing </function>"),
    ("<|python_tag|>{\"name\": \"ping\", \"parameters\": {", "llama3", "not valid JSON"),
    ("[TOOL_CALLS]ping{}", "mistral", "has no [ARGS]"),
    ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>ping<｜tool▁sep｜>{}", "deepseekv31", "missing its closing"),
    ("<|tool_calls_section_begin|><|tool_call_begin|>3<|tool_call_argument_begin|>{}<|tool_call_end|>"
     "<|tool_calls_section_end|>", "kimi_k2", "is not functions.NAME:N"),
    ("<tool_call>ping\n<arg_key>a</arg_key>oops\n</tool_call>", "glm45", "outside <arg_key>"),
    ("<|start|>assistant<|channel|>commentary to=functions.ping <|constrain|>json<|message|>{x}<|call|>", "gpt-oss",
     "not valid JSON"),
    ("[ping(x=open('f'))]", "pythonic", "must be literals"),
])
def test_malformed_calls_are_errors_for_the_model(text, tool_parser, fragment):
    out = parse(text, tool_parser, None, TOOLS)
    assert out.tool_calls == [] and fragment in " ".join(out.errors), out.errors


def test_unknown_parser_names_list_the_known_ones():
    with pytest.raises(ValueError, match="known: .*qwen25.*Did you mean 'qwen25'"):
        parse("x", "qwen2.5")
    with pytest.raises(ValueError, match="deepseek-r1, gpt-oss, kimi, qwen3"):
        parse("x", "qwen25", "deepseek_r1")
    assert {"qwen25", "hermes", "qwen3_coder", "llama3", "mistral", "deepseekv3", "deepseekv31", "kimi_k2", "glm45",
            "gpt-oss", "pythonic"} <= set(TOOL_PARSERS)
    assert {"deepseek-r1", "qwen3", "gpt-oss", "kimi"} <= set(REASONING_PARSERS)


def test_the_default_is_todays_behaviour():
    text = 'Sure. <tool_call>{"name": "calc", "arguments": {"e": "1+2"}}</tool_call> and <tool_call>{bad}</tool_call>'
    old, new = parse_tool_calls(text), parse(text)
    assert (old.content, old.errors) == (new.content, new.errors) and new.reasoning is None
    assert [(c.name, c.arguments) for c in old.calls] == [(c.name, c.arguments) for c in new.tool_calls]


def test_schema_types_the_text_values_of_xml_families():
    text = ("<tool_call>\n<function=set_plan>\n<parameter=steps>\n[1, \"a\"]\n</parameter>\n<parameter=ratio>\n2.5\n"
            "</parameter>\n<parameter=owner>\n42\n</parameter>\n</function>\n</tool_call>")
    assert parse(text, "qwen3_coder", None, TOOLS).tool_calls[0].arguments == {"steps": [1, "a"], "ratio": 2.5, "owner": "42"}
    text = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>7</arg_value>\n<arg_key>days</arg_key>\n<arg_value>7</arg_value>\n</tool_call>"
    assert parse(text, "glm45", None, TOOLS).tool_calls[0].arguments == {"city": "7", "days": 7}
