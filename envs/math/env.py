"""Math word problems graded by the math verifier: single-turn and with retries.

What it is: ``MathEnv`` (``agentrl/Math-v1``) and ``MathRetryEnv`` (``agentrl/MathRetry-v1``)
over rows ``{"question", "answer"}`` — GSM8K's ``... #### 18`` answers, AIME/AMC numbers and
LaTeX answers all work (see envs/math/verifier.py for how answers are compared). What it is
not: a dataset; the default rows are the repository's ``data/gsm8k_test.jsonl``.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from agentrl.api import Message
from agentrl.env.datasets import data_path, load_rows
from agentrl.env.rewards import Reward, RewardFn, Rubric, boxed_format, discounted, fact, length_penalty
from agentrl.env.text_env import EpisodeLimits, TextEnv, Turn
from agentrl.errors import EnvError, VerifierError
from envs.math.pool import VerifierPool, default_pool
from envs.math.verifier import extract_final_answer

SYSTEM_PROMPT = "Solve the problem step by step. Put the final answer in \\boxed{}."
DEFAULT_DATASET = "gsm8k_test.jsonl"


@functools.lru_cache(maxsize=8)
def _rows(path: str) -> tuple[dict[str, Any], ...]:
    return tuple(load_rows(path))


def check_math_row(task: dict[str, Any]) -> None:
    """Raise EnvError unless ``task`` has a string ``question`` and an ``answer``."""
    if not isinstance(task.get("question"), str) or task.get("answer") in (None, ""):
        raise EnvError(
            f"a math task needs 'question' (str) and 'answer' (str or number); got keys {sorted(task)}"
        )


class MathEnv(TextEnv):
    """Single-turn math: the model answers once and the verifier grades the final answer.

    ## Description
    A word problem from a dataset row is shown; the reply's final answer (every
    ``\\boxed{}`` — boxes that differ are a hedge and score 0 — else a line such as
    ``The answer is 18``) is compared with the gold answer under envs/math/verifier.py's
    rules (numbers by value, other answers by math-verify) in a killable process pool.

    ## Action Space
    ``Text``: the assistant's reply, any Unicode string.

    ## Observation Space
    ``Messages``. Reset: a system message (the instruction; omitted when ``system_prompt``
    is None) and the user's question. The step that grades the answer returns ``[]``.

    ## Starting State
    ``options["task"]`` (a row ``{"question", "answer"}``), else a row of ``dataset`` drawn
    with the seeded ``np_random``.

    ## Rewards
    ``correct`` (weight 1): 1.0 when the answer equals the gold answer, else 0.0.
    ``format`` (weight ``format_weight``, default 0): 1.0 when the reply uses ``\\boxed{}``.
    ``length`` (weight ``length_weight``, default 0): 0 up to ``length_budget`` characters,
    then down to -1 at twice the budget.

    ## Episode End
    Terminated after the first reply. Truncated only by ``max_tokens`` or ``max_wall_s``.

    ## Information
    Step: ``turn``, ``correct`` (bool), ``answer`` (the extracted answer or None),
    ``verifier_error`` (only when the verifier failed; the answer then scores 0), and
    ``rewards`` (every term by name).

    ## Arguments
    ``dataset``: a path ``load_rows`` reads (default: data/gsm8k_test.jsonl);
    ``system_prompt``; ``format_weight``; ``length_weight``, ``length_budget`` (4000);
    ``max_tokens``; ``max_wall_s``;
    ``verifier``: a ``VerifierPool`` (default: the shared pool); ``render_mode``: "ansi" or None.

    ## Version History
    * v1: every ``\\boxed{}`` of the reply is graded (a hedge across different boxes scores 0);
      numbers compare exactly (a decimal approximation of an exact answer scores 0; no absolute
      tolerance, so tiny numbers that differ no longer match).
    * v0: initial version.
    """

    def __init__(
        self,
        dataset: str | Path | None = None,
        system_prompt: str | None = SYSTEM_PROMPT,
        format_weight: float = 0.0,
        max_tokens: int | None = None,
        max_wall_s: float | None = None,
        verifier: VerifierPool | None = None,
        render_mode: str | None = None,
        length_weight: float = 0.0,
        length_budget: int = 4000,
        *,
        max_turns: int = 1,
        correct_term: RewardFn | None = None,
    ) -> None:
        super().__init__(
            rubric=Rubric([Reward("correct", correct_term or fact("correct")),
                           Reward("format", boxed_format, format_weight),
                           Reward("length", length_penalty(length_budget), length_weight)]),
            limits=EpisodeLimits(max_turns=max_turns, max_tokens=max_tokens, max_wall_s=max_wall_s),
            render_mode=render_mode,
        )
        self.dataset = str(dataset) if dataset is not None else None
        self.system_prompt = system_prompt
        self._verifier = verifier

    def sample_task(self) -> dict[str, Any]:
        path = self.dataset or str(data_path(DEFAULT_DATASET))
        return self.pick(_rows(path))

    async def _start(self, task: dict[str, Any]) -> list[Message]:
        check_math_row(task)
        messages: list[Message] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": task["question"]})
        return messages

    async def grade(self, action: str) -> dict[str, Any]:
        """The facts about one reply: ``correct``, ``answer`` and maybe ``verifier_error``."""
        assert self.task is not None
        facts: dict[str, Any] = {"answer": extract_final_answer(action)}
        try:
            facts["correct"] = await (self._verifier or default_pool()).averify(action, self.task["answer"])
        except VerifierError as e:
            facts["correct"], facts["verifier_error"] = False, str(e)
        return facts

    async def _turn(self, action: str) -> Turn:
        return Turn([], done=True, facts=await self.grade(action))


class MathRetryEnv(MathEnv):
    """Multi-turn math: after a wrong answer the env says so and the model may try again.

    ## Description
    As ``agentrl/Math-v1``, but a wrong (or missing) answer gets a user message with
    feedback and the number of attempts left, up to ``max_attempts`` attempts.

    ## Action Space
    ``Text``: the assistant's reply, any Unicode string.

    ## Observation Space
    ``Messages``. Reset: system + question. After a wrong attempt: one user message of
    feedback (``"That is not correct. ..."``, or a reminder to box the answer when none
    was found). After the last attempt, or a right one: ``[]``.

    ## Starting State
    ``options["task"]`` (a row ``{"question", "answer"}``), else a seeded row of ``dataset``.

    ## Rewards
    ``correct`` (weight 1): ``discount ** (attempts - 1)`` when an attempt is right, else 0.
    ``format`` (weight ``format_weight``, default 0): the last reply uses ``\\boxed{}``.
    ``length`` (weight ``length_weight``, default 0): the last reply's length penalty.

    ## Episode End
    Terminated on a right answer or after ``max_attempts`` wrong ones. Truncated by
    ``max_tokens`` or ``max_wall_s``.

    ## Information
    Step: ``turn``, ``attempts``, ``correct``, ``answer``, maybe ``verifier_error``;
    ``rewards`` on the last step.

    ## Arguments
    As ``MathEnv``, plus ``max_attempts`` (default 3) and ``discount`` (default 0.5).

    ## Version History
    * v1: every ``\\boxed{}`` of the reply is graded (a hedge across different boxes scores 0);
      numbers compare exactly (a decimal approximation of an exact answer scores 0; no absolute
      tolerance, so tiny numbers that differ no longer match).
    * v0: initial version.
    """

    def __init__(
        self,
        dataset: str | Path | None = None,
        max_attempts: int = 3,
        discount: float = 0.5,
        system_prompt: str | None = SYSTEM_PROMPT,
        format_weight: float = 0.0,
        max_tokens: int | None = None,
        max_wall_s: float | None = None,
        verifier: VerifierPool | None = None,
        render_mode: str | None = None,
        length_weight: float = 0.0,
        length_budget: int = 4000,
    ) -> None:
        if max_attempts < 1:
            raise EnvError(f"max_attempts must be >= 1, got {max_attempts}")
        super().__init__(dataset, system_prompt, format_weight, max_tokens, max_wall_s, verifier,
                         render_mode, length_weight, length_budget, max_turns=max_attempts,
                         correct_term=discounted("correct", discount))
        self.max_attempts = max_attempts

    async def _turn(self, action: str) -> Turn:
        facts = await self.grade(action)
        attempts = self._turns
        facts["attempts"] = attempts
        if facts["correct"] or attempts >= self.max_attempts:
            return Turn([], done=True, facts=facts)
        left = self.max_attempts - attempts
        if facts["answer"] is None:
            text = "I could not find a final answer. Put it in \\boxed{}."
        else:
            shown = facts["answer"] if len(facts["answer"]) <= 200 else facts["answer"][:200] + "..."
            text = f"That is not correct: {shown} is not the answer."
        text += f" Try again; {left} attempt{'s' if left > 1 else ''} left."
        return Turn([{"role": "user", "content": text}], done=False, facts=facts)
