"""Tool declaration from typed functions, and running calls: good, malformed, failing, slow."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest

from agentrl.env.tools import ToolBox, check_arguments, tool
from agentrl.errors import SandboxError, ToolError
from agentrl.model.arith_data import CALCULATOR_TOOL
from agentrl.model.tokenizer import tool_call_text
from envs.tool_use import calculator


def search(query: str, limit: int = 5, mode: Literal["fast", "exact"] = "fast", tags: list[str] | None = None) -> list:
    """Search the notes.

    Longer explanation that the model does not need.

    Args:
        query: what to look for.
        limit: at most this many results,
            counted after filtering.
        mode (str): how to match.

    Returns:
        The matching notes.
    """
    return [query] * limit


async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return "woke"


def broken(x: int) -> int:
    """Always fails."""
    raise ValueError(f"cannot handle {x}")


def infra() -> str:
    """Fails outside the model's control."""
    raise SandboxError("the backend is down")


def test_schema_from_signature_and_docstring():
    schema = tool(search).schema()
    assert schema["function"]["name"] == "search"
    assert schema["function"]["description"] == "Search the notes."
    params = schema["function"]["parameters"]
    assert params["required"] == ["query"]
    assert params["properties"] == {
        "query": {"type": "string", "description": "what to look for."},
        "limit": {"type": "integer", "description": "at most this many results, counted after filtering.",
                  "default": 5},
        "mode": {"type": "string", "enum": ["fast", "exact"], "description": "how to match.", "default": "fast"},
        "tags": {"type": ["array", "null"], "items": {"type": "string"}, "default": None},
    }


def test_calculator_matches_the_tiny_models_training_schema():
    assert tool(calculator).schema() == CALCULATOR_TOOL


def test_bad_declarations_raise_tool_error():
    def undocumented(x: int) -> int:
        return x

    def untyped(x):
        """Doc."""

    def varargs(*xs: int) -> int:
        """Doc."""

    def odd_type(x: complex) -> int:
        """Doc."""

    for fn, fragment in [(undocumented, "needs a docstring"), (untyped, "needs a type annotation"),
                         (varargs, r"\*args"), (odd_type, "no JSON-schema form")]:
        with pytest.raises(ToolError, match=fragment):
            tool(fn)
    with pytest.raises(ToolError, match="unique"):
        ToolBox([search, search])
    with pytest.raises(ToolError, match="must match"):
        tool(search, name="has space")


def test_argument_checks_explain_what_was_expected():
    t = tool(search)
    assert check_arguments(t, {"query": "x"}) is None
    assert "needs argument(s) ['query']" in check_arguments(t, {})
    assert "no argument(s) ['q']" in check_arguments(t, {"query": "x", "q": 1})
    assert "expected a JSON integer, got true" in check_arguments(t, {"query": "x", "limit": True})
    assert "expected one of ['fast', 'exact']" in check_arguments(t, {"query": "x", "mode": "slow"})
    assert "item 1: expected a JSON string" in check_arguments(t, {"query": "x", "tags": ["a", 2]})
    assert check_arguments(t, {"query": "x", "tags": None}) is None


async def test_well_formed_calls_run_in_order_with_deterministic_ids():
    box = ToolBox([calculator, search])
    text = "Let me check. " + tool_call_text("calculator", {"expression": "6*7"}) + tool_call_text(
        "search", {"query": "a", "limit": 2})
    turn = await box.handle(text, turn=3)
    assert turn.content == "Let me check." and turn.num_errors == 0 and turn.attempted
    assert turn.messages == [
        {"role": "tool", "name": "calculator", "tool_call_id": "call_3_0", "content": "42"},
        {"role": "tool", "name": "search", "tool_call_id": "call_3_1", "content": '["a", "a"]'},
    ]


async def test_malformed_and_failing_calls_become_tool_messages():
    box = ToolBox([calculator, broken])
    cases = {
        "<tool_call>{not json}</tool_call>": "not valid JSON",
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}': "missing its closing",
        tool_call_text("nope", {}): "there is no tool 'nope'; the tools are ['broken', 'calculator']",
        tool_call_text("calculator", {}): "needs argument(s) ['expression']",
        tool_call_text("calculator", {"expression": 5}): "expected a JSON string, got 5",
        tool_call_text("calculator", {"expression": "2**9"}): "calculator failed: ValueError: only integers",
        tool_call_text("broken", {"x": 3}): "broken failed: ValueError: cannot handle 3",
    }
    for text, fragment in cases.items():
        turn = await box.handle(text)
        assert turn.num_errors == 1 and len(turn.messages) == 1, text
        assert turn.messages[0]["role"] == "tool" and turn.messages[0]["content"].startswith("error: ")
        assert fragment in turn.messages[0]["content"], (text, turn.messages)
    plain = await box.handle("The answer is \\boxed{2}.")
    assert not plain.attempted and plain.messages == []


async def test_timeouts_call_limits_and_long_results():
    box = ToolBox([slow, search], timeout_s=1.0, max_calls=2, max_result_chars=30)  # a thread hop may take a while
    turn = await box.handle(tool_call_text("slow", {"seconds": 5}))
    assert "did not finish within 1 s" in turn.messages[0]["content"]
    many = "".join(tool_call_text("slow", {"seconds": 0}) for _ in range(3))
    turn = await box.handle(many)
    assert [m["content"] for m in turn.messages][:2] == ["woke", "woke"]
    assert "at most 2 tool calls" in turn.messages[2]["content"] and turn.num_errors == 1
    turn = await box.handle(tool_call_text("search", {"query": "abcdef", "limit": 20}))
    assert turn.messages[0]["content"].endswith("more characters cut]")


async def test_infrastructure_errors_propagate():
    with pytest.raises(SandboxError, match="backend is down"):
        await ToolBox([infra]).handle(tool_call_text("infra", {}))
