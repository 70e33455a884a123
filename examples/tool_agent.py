"""The tool-use example's data: products the tiny model cannot do in its head, and a calculator.

``What is 37*48?`` (two operands 0..99, so mostly two-digit by two-digit): the tiny model was
built on sums and answers a product right almost never without help (``eval_before`` of
``examples/tool_agent.yaml`` measures it). With ``agentrl/ToolUse-v0`` offering only the
calculator (``kinds: [calc]``, the tool the tiny model was built with), an episode is right when
the model calls ``calculator("37*48")``, reads ``1776`` and answers ``\\boxed{1776}``.

The supervised stage shows both behaviours (``TOOL_SHARE`` of its conversations call the
calculator, the rest answer at once) so that RL starts from a model that calls the tool in
about one sample of three and greedily never: room for RL to teach *when* to use the tool.

Three pools that never share a problem (``agentrl.model.arith_data.split_of``): supervised
conversations from the *train* split (``sft_conversations``, for the SFT stage
``examples/tool_agent_sft.yaml``), RL prompts from the *rl* split (``training_rows``) and
held-out problems from the *eval* split (``eval_rows``, the same for every seed).

    python examples/tool_agent.py > /tmp/calc.jsonl     # the SFT conversations as JSONL
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

from agentrl.model.arith_data import CALCULATOR_TOOL, calculate, format_answer, generate_problems

PRODUCTS: dict[str, Any] = {"num_terms": (2,), "ops": ("*",), "max_operand": 99}
"""The problem space: ``a*b``, operands 0..99."""


def problems(n: int, seed: int, split: str) -> list:
    return generate_problems(n, seed, split=split, **PRODUCTS)


TOOL_SHARE = 0.3
"""Share of the supervised conversations that call the calculator; the rest answer at once."""


def conversation(problem: Any, rng: random.Random, use_tool: bool = True) -> dict[str, Any]:
    """With the calculator offered: the question, then either a calculator call with its
    expression, the tool's result and the boxed answer, or the boxed answer at once."""
    if not use_tool:
        return {"tools": [CALCULATOR_TOOL], "messages": [
            {"role": "user", "content": problem.question},
            {"role": "assistant", "content": format_answer(problem.answer)}]}
    call_id = f"call_{rng.randrange(16 ** 8):08x}"
    return {"tools": [CALCULATOR_TOOL], "messages": [
        {"role": "user", "content": problem.question},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "calculator", "arguments": json.dumps({"expression": problem.expression})}}]},
        {"role": "tool", "tool_call_id": call_id, "content": calculate(problem.expression)},
        {"role": "assistant", "content": format_answer(problem.answer)},
    ]}


def sft_conversations(seed: int, n: int = 2048) -> list[dict[str, Any]]:
    """``data: [examples.tool_agent:sft_conversations]``: train split, ``TOOL_SHARE`` of them
    with a calculator call."""
    rng = random.Random(seed)
    return [conversation(p, rng, rng.random() < TOOL_SHARE) for p in problems(n, 2_000_003 + seed, "train")]


def sft_heldout(seed: int, n: int = 64) -> list[dict[str, Any]]:
    """``heldout: [examples.tool_agent:sft_heldout]``: the same from the evaluation pool."""
    rng = random.Random(0)
    return [conversation(p, rng) for p in problems(n, 0, "eval")]


def training_rows(seed: int, n: int = 20_000) -> list[dict[str, Any]]:
    """``rollout.dataset``: products of the RL pool, in an order drawn from ``seed``."""
    return [p.to_row() for p in problems(n, 1_000_003 + seed, "rl")]


def eval_rows(seed: int, n: int = 400) -> list[dict[str, Any]]:
    """``eval.dataset``: ``n`` distinct products of the evaluation pool (it holds about 415),
    the same for every seed."""
    rows: dict[str, dict[str, Any]] = {}
    for p in problems(20 * n, 0, "eval"):
        rows.setdefault(p.expression, p.to_row())
    return list(rows.values())[:n]


if __name__ == "__main__":
    for row in sft_conversations(int(sys.argv[1]) if len(sys.argv) > 1 else 0):
        print(json.dumps(row))
