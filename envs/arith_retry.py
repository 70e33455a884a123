"""Arithmetic with retries: the tiny demo model's multi-turn task.

What it is: ``ArithRetryEnv`` (``agentrl/ArithRetry-v0``), Arith-v0 over several turns: after a
wrong answer the user says whether it was too high or too low and asks again, up to
``max_attempts`` answers. The first turn is exactly Arith-v0's (the format the tiny model was
trained on); what RL can teach is to use the feedback — the tiny model's wrong sums are
mostly off by one or two. What it is not: a math grader (integers in ``\\boxed{}`` only).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agentrl.env import Reward, Rubric, Turn
from agentrl.env.rewards import discounted
from envs.arith import ArithEnv


class ArithRetryEnv(ArithEnv):
    """Integer sums, with feedback ("too high", "too low") and another try after a wrong answer.

    ## Description
    As Arith-v0; a wrong reply gets ``Too high. Try again.`` or ``Too low. Try again.``
    (``I could not find a final answer...`` when nothing was boxed) while attempts are left.
    ## Action Space
    ``Text``: the assistant's reply.
    ## Observation Space
    ``Messages``. Reset: the question. After a wrong attempt: one user message of feedback;
    after a right one or the last: ``[]``.
    ## Starting State
    As Arith-v0 (``options["task"]`` or a problem from the seed).
    ## Rewards
    ``correct``: ``discount ** (attempts - 1)`` when an attempt is right, else 0.
    ## Episode End
    Terminated on a right answer or after ``max_attempts`` answers.
    ## Information
    Step: ``correct``, ``answer``, ``attempts``, ``rewards`` (on the last step).
    ## Arguments
    ``max_attempts`` (default 3), ``discount`` (default 0.5), and Arith-v0's arguments by keyword.
    ## Version History
    * v0: initial version.
    """

    def __init__(self, max_attempts: int = 3, discount: float = 0.5, **arith_kwargs: Any) -> None:
        from agentrl.errors import EnvError

        if max_attempts < 1:
            raise EnvError(f"max_attempts must be >= 1, got {max_attempts}")
        super().__init__(**arith_kwargs)
        self.limits = dataclasses.replace(self.limits, max_turns=max_attempts)
        self.rubric = Rubric([Reward("correct", discounted("correct", discount))])
        self.max_attempts = max_attempts

    async def _turn(self, action: str) -> Turn:
        facts = dict((await super()._turn(action)).facts)
        facts["attempts"] = self._turns
        if facts["correct"] or self._turns >= self.max_attempts:
            return Turn([], done=True, facts=facts)
        if facts["answer"] is None:
            hint = "I could not find a final answer in \\boxed{}."
        else:
            hint = "Too high." if facts["answer"] > int(self.task["answer"]) else "Too low."
        return Turn([{"role": "user", "content": f"{hint} Try again."}], done=False, facts=facts)
