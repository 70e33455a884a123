"""Arithmetic with retries: the tiny demo model's multi-turn task.

What it is: ``ArithRetryEnv`` (``agentrl/ArithRetry-v0``), Arith-v0 over several turns: after a
wrong answer the user says whether it was too high or too low and asks again, up to
``max_attempts`` answers. The first turn is exactly Arith-v0's (the format the tiny model was
trained on); what RL can teach is to use the feedback. ``hint="last_digit"`` makes the feedback
something a model can act on without redoing the sum: the direction and the answer's last digit
(``examples/feedback.yaml``: the tiny model's wrong sums are mostly off in the last digit only).
Each episode reports ``first_wrong`` and ``fixed`` (reward terms of weight 0): their ratio over
episodes is the share of first-wrong answers corrected by the last one. What it is not: a math
grader (integers in ``\\boxed{}`` only).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agentrl.env import Reward, Rubric, Turn
from agentrl.env.rewards import discounted, fact
from envs.arith import ArithEnv

HINTS = ("direction", "last_digit")
"""What the feedback after a wrong answer says: ``Too high.`` / ``Too low.``, or that plus
``The answer ends in D.``"""


class ArithRetryEnv(ArithEnv):
    """Integer sums, with feedback ("too high", "too low") and another try after a wrong answer.

    ## Description
    As Arith-v0; a wrong reply gets ``Too high. Try again.`` or ``Too low. Try again.``
    (``I could not find a final answer...`` when nothing was boxed) while attempts are left.
    With ``hint="last_digit"``: ``Too high. The answer ends in 6. Try again.`` (the last digit
    of the answer's absolute value).
    ## Action Space
    ``Text``: the assistant's reply.
    ## Observation Space
    ``Messages``. Reset: the question. After a wrong attempt: one user message of feedback;
    after a right one or the last: ``[]``.
    ## Starting State
    As Arith-v0 (``options["task"]`` or a problem from the seed).
    ## Rewards
    ``correct``: ``discount ** (attempts - 1)`` when an attempt is right, else 0.
    ``first_wrong`` (weight 0, reported only): 1.0 when the first answer was wrong.
    ``fixed`` (weight 0, reported only): 1.0 when the first answer was wrong and a later one right.
    ## Episode End
    Terminated on a right answer or after ``max_attempts`` answers.
    ## Information
    Step: ``correct``, ``answer``, ``attempts``, ``first_wrong``, ``fixed``, ``rewards`` (on the last step).
    ## Arguments
    ``max_attempts`` (default 3), ``discount`` (default 0.5), ``hint`` (one of ``HINTS``,
    default "direction"), and Arith-v0's arguments by keyword.
    ## Version History
    * v0: initial version; ``hint`` and the ``first_wrong``/``fixed`` terms added later (the
      default feedback and the reward unchanged).
    """

    def __init__(self, max_attempts: int = 3, discount: float = 0.5, hint: str = "direction",
                 **arith_kwargs: Any) -> None:
        from agentrl.errors import EnvError

        if max_attempts < 1:
            raise EnvError(f"max_attempts must be >= 1, got {max_attempts}")
        if hint not in HINTS:
            raise EnvError(f"hint must be one of {HINTS}, got {hint!r}")
        super().__init__(**arith_kwargs)
        self.limits = dataclasses.replace(self.limits, max_turns=max_attempts)
        self.rubric = Rubric([Reward("correct", discounted("correct", discount)),
                              Reward("first_wrong", fact("first_wrong"), 0.0),
                              Reward("fixed", fact("fixed"), 0.0)])
        self.max_attempts = max_attempts
        self.hint = hint

    async def _turn(self, action: str) -> Turn:
        facts = dict((await super()._turn(action)).facts)
        facts["attempts"] = self._turns
        if self._turns == 1:
            facts["first_wrong"] = not facts["correct"]
        facts["fixed"] = self._turns > 1 and facts["correct"]
        if facts["correct"] or self._turns >= self.max_attempts:
            return Turn([], done=True, facts=facts)
        gold = int(self.task["answer"])
        if facts["answer"] is None:
            hint = "I could not find a final answer in \\boxed{}."
        else:
            hint = "Too high." if facts["answer"] > gold else "Too low."
            if self.hint == "last_digit":
                hint += f" The answer ends in {abs(gold) % 10}."
        return Turn([{"role": "user", "content": f"{hint} Try again."}], done=False, facts=facts)
