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
