"""The feedback example's data: sums, a wrong first answer, a hint, and a revised answer.

``What is 17+72+97?`` on ``agentrl/ArithRetry-v0`` with ``hint: last_digit``: after a wrong
answer the user says ``Too low. The answer ends in 6. Try again.`` and the model answers once
more. The tiny model's wrong sums are mostly off in the last digit only (on the evaluation
pool, greedy: 344 of 400 answers wrong, 302 of those with the right hundreds and tens), so the
hint is enough to fix most of them: keep the tens of the first answer, take the last digit from
the feedback. The tiny model was never shown a second turn: it repeats its answer.

The supervised stage (``examples/feedback_sft.yaml``) shows the second turn both ways:
``REVISE_SHARE`` of the revisions use the hint (the right answer), the rest repeat the wrong
first answer, so that RL starts from a model that uses the feedback in some samples and greedily
rarely: room for RL to teach that using it pays. The wrong first answers are context only
(``"weight": 0``: never trained on); ``PLAIN_SHARE`` of the conversations are a right answer at
the first turn, so that the model keeps its sums.

Three pools that never share a problem (``agentrl.model.arith_data.split_of``): supervised
conversations from the *train* split, RL prompts from the *rl* split
(``envs.arith:training_rows``) and held-out problems from the *eval* split
(``envs.arith:eval_rows``, the same for every seed).

    python examples/feedback.py > /tmp/feedback.jsonl     # the SFT conversations as JSONL
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

from agentrl.model.arith_data import ArithProblem, format_answer, generate_problems

REVISE_SHARE = 0.3
"""Share of the supervised second answers that use the hint; the rest repeat the first answer."""

PLAIN_SHARE = 0.3
"""Share of the supervised conversations that are a right first answer alone."""

ERRORS = (-3, -2, -1, 1, 2)
"""The supervised first answers' errors (the tiny model's are mostly -1 and -2)."""


def feedback(answer: int, gold: int) -> str:
    """What ``ArithRetry-v0`` with ``hint="last_digit"`` says after the wrong ``answer``."""
    return f"{'Too high.' if answer > gold else 'Too low.'} The answer ends in {abs(gold) % 10}. Try again."


def conversation(problem: ArithProblem, rng: random.Random, revise: bool = True) -> dict[str, Any]:
    """The question, a wrong first answer (context only), the feedback, and a second answer:
    the right one (``revise``) or the first one repeated."""
    wrong = max(0, problem.answer + rng.choice(ERRORS))
    if wrong == problem.answer:
        wrong = problem.answer + 1
    return {"messages": [
        {"role": "user", "content": problem.question},
        {"role": "assistant", "content": format_answer(wrong), "weight": 0},
        {"role": "user", "content": feedback(wrong, problem.answer)},
        {"role": "assistant", "content": format_answer(problem.answer if revise else wrong)},
    ]}


def plain(problem: ArithProblem) -> dict[str, Any]:
    """The question and its right answer, one turn (what the tiny model was built on)."""
    return {"messages": [{"role": "user", "content": problem.question},
                         {"role": "assistant", "content": format_answer(problem.answer)}]}


def sft_conversations(seed: int, n: int = 4096) -> list[dict[str, Any]]:
    """``data: [examples.feedback:sft_conversations]``: train split; ``PLAIN_SHARE`` right first
    answers, the rest a wrong one and a second answer that uses the hint ``REVISE_SHARE`` of the time."""
    rng = random.Random(seed)
    out = []
    for p in generate_problems(n, 2_000_003 + seed, split="train"):
        out.append(plain(p) if rng.random() < PLAIN_SHARE else conversation(p, rng, rng.random() < REVISE_SHARE))
    return out


def sft_heldout(seed: int, n: int = 64) -> list[dict[str, Any]]:
    """``heldout: [examples.feedback:sft_heldout]``: revisions that use the hint, evaluation pool."""
    rng = random.Random(0)
    return [conversation(p, rng) for p in generate_problems(n, 0, split="eval")]


if __name__ == "__main__":
    for row in sft_conversations(int(sys.argv[1]) if len(sys.argv) > 1 else 0):
        print(json.dumps(row))
