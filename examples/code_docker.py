"""The code-in-Docker example's data: products answered by a program the sandbox runs.

``What is 37*48?`` (the tool-use example's products, ``examples.tool_agent``: two operands
0..99), on ``agentrl/ToolUse-v0`` with no tool offered (``tools: []``) and a sandbox
(``sandbox: {backend: docker}``): a reply with a ```python block is run in a container of the
Docker pool and what it printed comes back as a tool turn; a reply without one is the final
answer. The tiny model cannot multiply in its head; an episode is right when the model writes
``print(37*48)``, reads ``1776`` and answers ``\\boxed{1776}``. The reward is for the right
answer only: running a program earns nothing by itself.

The supervised stage (``examples/code_docker_sft.yaml``) shows both behaviours: ``CODE_SHARE``
of its conversations write the program, the rest answer at once, so that RL starts from a
model that writes a program in some samples and greedily rarely: room for RL to teach that
running one pays.

The pools never share a problem: SFT conversations from the *train* split
(``sft_conversations``), RL prompts from the *rl* split and held-out problems from the *eval*
split (``examples.tool_agent:training_rows`` and ``eval_rows``).

    python -m examples.code_docker > /tmp/code.jsonl     # the SFT conversations as JSONL
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

from agentrl.model.arith_data import ArithProblem, format_answer
from examples.tool_agent import problems

CODE_SHARE = 0.3
"""Share of the supervised conversations that write a program; the rest answer at once."""


def program(problem: ArithProblem) -> str:
    """The reply that runs the question's expression: a ```python block that prints it."""
    return f"```python\nprint({problem.expression})\n```"


def conversation(problem: ArithProblem, write_code: bool = True) -> dict[str, Any]:
    """The question, then either a program, what it printed and the boxed answer, or the boxed
    answer at once."""
    answer = {"role": "assistant", "content": format_answer(problem.answer)}
    if not write_code:
        return {"messages": [{"role": "user", "content": problem.question}, answer]}
    return {"messages": [
        {"role": "user", "content": problem.question},
        {"role": "assistant", "content": program(problem)},
        {"role": "tool", "content": str(problem.answer)},  # what the program printed, as the env returns it
        answer,
    ]}


def sft_conversations(seed: int, n: int = 2048) -> list[dict[str, Any]]:
    """``data: [examples.code_docker:sft_conversations]``: train split, ``CODE_SHARE`` of them
    with a program."""
    rng = random.Random(seed)
    return [conversation(p, rng.random() < CODE_SHARE) for p in problems(n, 2_000_003 + seed, "train")]


def sft_heldout(seed: int, n: int = 64) -> list[dict[str, Any]]:
    """``heldout: [examples.code_docker:sft_heldout]``: programs on the evaluation pool."""
    return [conversation(p) for p in problems(n, 0, "eval")]


if __name__ == "__main__":
    for row in sft_conversations(int(sys.argv[1]) if len(sys.argv) > 1 else 0):
        print(json.dumps(row))
