"""Tool-call parsing: well-formed calls are extracted, malformed ones explained, never raised."""

from __future__ import annotations

import json

from agentrl.model.tokenizer import tool_call_text
from agentrl.toolcalls import parse_tool_calls


def test_two_calls_and_text():
    text = "Let me compute. " + tool_call_text("calculator", {"expression": "1+2"}) + tool_call_text("lookup", {"key": "x"})
    parsed = parse_tool_calls(text)
    assert parsed.content == "Let me compute."
    assert [(c.name, c.arguments) for c in parsed.calls] == [("calculator", {"expression": "1+2"}), ("lookup", {"key": "x"})]
    assert parsed.errors == []
    oa = parsed.calls[0].to_openai(0)
    assert oa["type"] == "function" and json.loads(oa["function"]["arguments"]) == {"expression": "1+2"}
    assert oa["id"].startswith("call_") and len(oa["id"]) == 29


def test_arguments_given_as_json_string_are_accepted():
    parsed = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert parsed.calls[0].arguments == {"a": 1}


def test_malformed_calls_become_errors_and_stay_in_content():
    cases = {
        "<tool_call>{not json}</tool_call>": "not valid JSON",
        '<tool_call>{"arguments": {}}</tool_call>': 'needs a string "name"',
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>': "must be a JSON object",
        '<tool_call>{"name": "f", "arguments": {}}': "missing its closing",
    }
    for text, fragment in cases.items():
        parsed = parse_tool_calls(text)
        assert parsed.calls == [], text
        assert len(parsed.errors) == 1 and fragment in parsed.errors[0], (text, parsed.errors)
        assert "<tool_call>" in parsed.content


def test_plain_text_has_no_calls():
    parsed = parse_tool_calls("  \\boxed{3}  ")
    assert (parsed.content, parsed.calls, parsed.errors) == ("\\boxed{3}", [], [])


def test_no_parser_raises_on_deep_nesting_or_on_tools_of_the_wrong_shape():
    """Issue 49: ``parse`` raised ``RecursionError`` on a 1,500-deep JSON argument for most
    parser pairs (the gateway then answered 500 and trained on the reply it never delivered),
    and ``AttributeError`` on tools like ``{"function": null}``. Every family, with and without
    each reasoning parser, now reads such text as content with an error for the model."""
    from agentrl.toolcalls import REASONING_PARSERS, TOOL_PARSERS, parse

    deep = "[" * 1500 + "]" * 1500
    bodies = [f'{{"name": "f", "arguments": {{"x": {deep}}}}}', f'[{{"name": "f", "arguments": {{"x": {deep}}}}}]',
              f"[f(x={deep})]", f'f{{"x": {deep}}}', f"<parameter=x>{deep}</parameter>", deep]
    bad_tools = [[{"function": None}], [{"type": "function", "function": {"name": 3, "parameters": "x"}}], ["f"],
                 [{"function": {"name": "f", "parameters": {"properties": []}}}]]
    for tool_parser, (_, markers) in TOOL_PARSERS.items():
        texts = [m + b for m in markers for b in bodies] + bodies
        cases = [(None, None, texts)] + [(r, None, texts[:1]) for r in REASONING_PARSERS] + [
            (None, tools, texts[:1]) for tools in bad_tools]
        for reasoning, tools, some in cases:
            for text in some:
                out = parse(text, tool_parser, reasoning, tools)
                assert isinstance(out.content, str) and not (tools and out.tool_calls), (tool_parser, text[:40])
    found = parse('<tool_call>{"name": "f", "arguments": {}}</tool_call>', tools=[{"function": None}])
    assert not found.tool_calls and "there is no tool 'f'" in found.errors[0]


def test_a_reply_in_another_family_s_format_is_named():
    """Issue 49: the gateway gave no hint when its tool parser did not match the model's template."""
    from agentrl.toolcalls import format_hint

    hermes = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert format_hint(hermes, "llama3") == ["glm45", "hermes", "qwen", "qwen25", "qwen3_coder"]
    assert format_hint(hermes, "qwen25") == [] and format_hint("no call here", "llama3") == []
    assert format_hint('[TOOL_CALLS][{"name": "f", "arguments": {}}]', "qwen25") == ["mistral"]
