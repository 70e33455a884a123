"""Integer arithmetic problems generated from a seed: the tiny demo model's task.

What it is: ``ArithEnv`` (``agentrl/Arith-v0``), a single-turn env over ``agentrl.model.arith_data``'s
problems (``What is 17+72+97?`` -> ``\\boxed{186}``), shown exactly as the tiny model was
trained to see them (the question alone as the user turn, no system message). What it is
not: a free-form math grader — the answer must be an integer in the last ``\\boxed{}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrl.api import Message
from agentrl.env.rewards import Reward, Rubric, fact
from agentrl.env.text_env import EpisodeLimits, TextEnv, Turn
from agentrl.errors import EnvError
from agentrl.model.arith_data import extract_answer, format_answer, generate_problems


class ArithEnv(TextEnv):
    """Integer arithmetic word problems, answered in one turn.

    ## Description
    ``What is 17+72+97?``: the reply's last ``\\boxed{N}`` must hold the integer answer.
    Problems come from ``agentrl.model.arith_data.generate_problems``: by default from its RL
    pool (``split="rl"``), which the supervised data and the evaluation pool never share; an
    evaluation passes ``split="eval"``.

    ## Action Space
    ``Text``: the assistant's reply, any Unicode string.

    ## Observation Space
    ``Messages``. Reset: one user message, the question. The step returns ``[]``.

    ## Starting State
    ``options["task"]`` (a row ``{"question", "answer"}``, e.g. ``ArithProblem.to_row()``),
    else a problem generated from a seed drawn with the seeded ``np_random``.

    ## Rewards
    ``correct`` (weight 1): 1.0 when the last box holds the answer.
    ``format`` (weight ``format_weight``, default 0): 1.0 when the reply is exactly
    ``\\boxed{N}`` for some integer N (what the tiny model is trained to write).

    ## Episode End
    Terminated after the first reply. Truncated only by ``max_tokens`` or ``max_wall_s``.

    ## Information
    Step: ``turn``, ``correct``, ``answer`` (the integer read, or None), ``rewards``.

    ## Arguments
    ``num_terms`` (default (3,)), ``max_operand`` (99), ``ops`` (("+",)), ``split``
    ("rl"; "eval" to evaluate): passed to ``generate_problems``; ``format_weight``; ``max_tokens``;
    ``max_wall_s``; ``render_mode``: "ansi" or None.

    ## Version History
    * v0: initial version.
    """

    def __init__(
        self,
        num_terms: Sequence[int] = (3,),
        max_operand: int = 99,
        ops: Sequence[str] = ("+",),
        split: str = "rl",
        format_weight: float = 0.0,
        max_tokens: int | None = None,
        max_wall_s: float | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(
            rubric=Rubric([Reward("correct", fact("correct")), Reward("format", fact("exact_format"), format_weight)]),
            limits=EpisodeLimits(max_turns=1, max_tokens=max_tokens, max_wall_s=max_wall_s),
            render_mode=render_mode,
        )
        self.generator_args = {"num_terms": tuple(num_terms), "max_operand": max_operand,
                               "ops": tuple(ops), "split": split}
        try:
            generate_problems(1, seed=0, **self.generator_args)
        except ValueError as e:
            raise EnvError(f"ArithEnv arguments: {e}") from e

    def sample_task(self) -> dict[str, Any]:
        seed = int(self.np_random.integers(2**31))
        return generate_problems(1, seed=seed, **self.generator_args)[0].to_row()

    async def _start(self, task: dict[str, Any]) -> list[Message]:
        if not isinstance(task.get("question"), str) or "answer" not in task:
            raise EnvError(f"an arithmetic task needs 'question' and 'answer'; got keys {sorted(task)}")
        try:
            int(task["answer"])
        except (TypeError, ValueError):
            raise EnvError(f"an arithmetic task's answer must be an integer, got {task['answer']!r}") from None
        return [{"role": "user", "content": task["question"]}]

    async def _turn(self, action: str) -> Turn:
        assert self.task is not None
        gold = int(self.task["answer"])
        answer = extract_answer(action)
        facts = {
            "correct": answer == gold,
            "answer": answer,
            "exact_format": answer is not None and action.strip() == format_answer(answer),
        }
        return Turn([], done=True, facts=facts)


def training_rows(seed: int, n: int = 20_000) -> list[dict[str, Any]]:
    """Rows for RL on Arith-v0 (``rollout.dataset: envs.arith:training_rows``): ``a+b+c``
    problems of the RL pool, in an order drawn from ``seed``; never an ``eval_rows`` problem."""
    return [p.to_row() for p in generate_problems(n, seed=1_000_003 + seed, split="rl")]


def eval_rows(seed: int, n: int = 1_000) -> list[dict[str, Any]]:
    """Rows for evaluation (``eval.dataset: envs.arith:eval_rows``): ``a+b+c`` problems of the
    evaluation pool (the ones ``build_info.json`` is measured on), the same for every run
    whatever its seed."""
    return [p.to_row() for p in generate_problems(n, seed=0, split="eval")]
