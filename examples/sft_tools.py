"""Calculator conversations in OpenAI's messages format, for ``agentrl sft examples/sft_tools.yaml``.

Each conversation asks two arithmetic questions in a row; the assistant answers each by calling
the ``calculator`` tool (``agentrl.model.arith_data.CALCULATOR_TOOL``, the one the tiny model was
built with) with the question's expression, reads the ``tool`` message and answers
``\\boxed{N}``. The committed tiny model makes such calls but does not copy the question's
expression into them (``build_info.json``: ``tool_expression_rate`` 0), which is what this data
teaches. ``train_conversations`` draws from the supervised split, ``heldout_conversations``
from the evaluation pool, so no held-out problem is trained on.

    python examples/sft_tools.py > /tmp/tools.jsonl     # the same data as a JSONL file
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

from agentrl.model.arith_data import CALCULATOR_TOOL, calculate, format_answer, generate_problems


def conversation(problems: list[Any], rng: random.Random) -> dict[str, Any]:
    """One conversation: per problem, the question, a calculator call, its result, the answer."""
    messages: list[dict[str, Any]] = []
    for p in problems:
        call_id = f"call_{rng.randrange(16 ** 8):08x}"
        messages += [
            {"role": "user", "content": p.question},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": "calculator", "arguments": json.dumps({"expression": p.expression})}}]},
            {"role": "tool", "tool_call_id": call_id, "content": calculate(p.expression)},
            {"role": "assistant", "content": format_answer(p.answer)},
        ]
    return {"messages": messages, "tools": [CALCULATOR_TOOL]}


def conversations(n: int, seed: int, split: str) -> list[dict[str, Any]]:
    problems = generate_problems(2 * n, seed, num_terms=(2, 3), split=split)
    rng = random.Random(seed)
    return [conversation(problems[2 * i: 2 * i + 2], rng) for i in range(n)]


def train_conversations(seed: int, n: int = 256) -> list[dict[str, Any]]:
    """``data: [examples.sft_tools:train_conversations]``: from the supervised split."""
    return conversations(n, 1_000_003 + seed, "train")


def heldout_conversations(seed: int, n: int = 32) -> list[dict[str, Any]]:
    """``heldout: [examples.sft_tools:heldout_conversations]``: from the evaluation pool, the same
    for every seed."""
    return conversations(n, 0, "eval")


if __name__ == "__main__":
    for row in train_conversations(int(sys.argv[1]) if len(sys.argv) > 1 else 0):
        print(json.dumps(row))
