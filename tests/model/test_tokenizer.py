"""The tiny model's tokenizer: bytes in, bytes out; chat turns concatenate exactly."""

from __future__ import annotations

import pytest

from agentrl.model.tokenizer import END, VOCAB_SIZE, build_tokenizer, special_token_ids


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_any_unicode_round_trips_and_ids_are_bytes(tok):
    text = "héllo ✓ 数学 \x00\t\n🙂"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert len(tok) == VOCAB_SIZE


def test_tokenizing_a_concatenation_equals_concatenating(tok):
    a, b = "What is 1+2?", " \\boxed{3}"
    assert tok.encode(a + b, add_special_tokens=False) == tok.encode(a, add_special_tokens=False) + tok.encode(b, add_special_tokens=False)


def test_multi_turn_prompt_extends_exactly(tok):
    """Rendering turn k+1 starts with turn k's prompt plus the assistant reply plus END."""
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+2?"}]
    first = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)["input_ids"]
    reply = tok.encode("\\boxed{3}", add_special_tokens=False) + [special_token_ids()[END]]
    msgs += [{"role": "assistant", "content": "\\boxed{3}"}, {"role": "user", "content": "Again?"}]
    second = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert second[: len(first) + len(reply)] == first + reply


def test_tool_calls_and_results_render_in_the_documented_format(tok):
    msgs = [
        {"role": "user", "content": "1+2?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "1+2"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
    ]
    tools = [{"type": "function", "function": {"name": "calculator"}}]
    text = tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|system|># Tools\ncalculator()\n<|end|>"
        "<|user|>1+2?<|end|>"
        '<|assistant|><tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call><|end|>'
        "<|tool|>3<|end|><|assistant|>"
    )


def test_tools_render_as_one_signature_per_line(tok):
    """A compact signature (optional arguments marked ``?``), not the JSON schema: a byte-level
    model pays one token per byte, and the schema tripled the length of a calculator trace."""
    lookup = {"type": "function", "function": {
        "name": "lookup", "description": "Price of an item.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}, "n": {"type": "integer"},
                                                        "tags": {}}, "required": ["key"]}}}
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(msgs, tools=[lookup], add_generation_prompt=True, tokenize=False)
    assert text == ("<|system|>Be brief.\n# Tools\nlookup(key: string, n?: integer, tags?: any) - Price of an item."
                    "\n<|end|><|user|>hi<|end|><|assistant|>")
