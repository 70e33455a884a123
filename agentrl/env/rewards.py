"""Composable rewards: an environment's reward is a weighted sum of named reward functions.

What it is: ``RewardInput`` (what a reward function sees), ``Reward`` (one named, weighted
term), ``Rubric`` (their weighted sum, each term reported by name so it can be logged in
``info["rewards"]``) and a few reusable terms: ``fact`` (read a fact the env measured, such
as ``correct``), ``discounted`` (a fact discounted per attempt), ``boxed_format`` and
``length_penalty``. What it is not: a verifier. Checks that are slow or need I/O (math-verify,
running tests in a sandbox) run inside the env's turn and arrive here as facts, so reward
functions stay small pure functions that are easy to test on hand-made inputs.

Main hook::

    rubric = Rubric([Reward("correct", fact("correct")), Reward("format", boxed_format, 0.1)])
    total, terms = rubric.score(RewardInput(response, task, transcript, facts))
    # terms == {"correct": 1.0, "format": 1.0}; total == 1.1

A reward function may be a coroutine function (``ascore`` awaits it; ``score`` refuses it).
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.api import Message
from agentrl.errors import EnvError


@dataclass(frozen=True)
class RewardInput:
    """What a reward function sees at the end of an episode.

    ``response``: the last assistant reply; ``task``: the dataset row; ``transcript``: the
    whole conversation; ``facts``: what the env measured (``correct``, ``attempts``,
    ``tests_passed``, ...), the latest value of each.
    """

    response: str
    task: Mapping[str, Any] = field(default_factory=dict)
    transcript: Sequence[Message] = ()
    facts: Mapping[str, Any] = field(default_factory=dict)


RewardFn = Callable[[RewardInput], float] | Callable[[RewardInput], Awaitable[float]]


@dataclass(frozen=True)
class Reward:
    """One named term of a rubric: ``weight * fn(input)``."""

    name: str
    fn: RewardFn
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise EnvError(f"a reward term needs a non-empty name, got {self.name!r}")
        if not callable(self.fn):
            raise EnvError(f"reward term {self.name!r}: fn must be callable, got {self.fn!r}")
        if not math.isfinite(self.weight):
            raise EnvError(f"reward term {self.name!r}: weight must be finite, got {self.weight!r}")


class Rubric:
    """A weighted sum of named reward terms; each term's unweighted value is reported."""

    def __init__(self, terms: Sequence[Reward]) -> None:
        names = [t.name for t in terms]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise EnvError(f"reward term names must be unique, repeated: {dupes}")
        self.terms = list(terms)

    def __repr__(self) -> str:
        return "Rubric(" + " + ".join(f"{t.weight:g}*{t.name}" for t in self.terms) + ")"

    async def ascore(self, inp: RewardInput) -> tuple[float, dict[str, float]]:
        values = {}
        for term in self.terms:
            value = term.fn(inp)
            if inspect.isawaitable(value):
                value = await value
            values[term.name] = _check(term.name, value)
        return self._total(values), values

    def score(self, inp: RewardInput) -> tuple[float, dict[str, float]]:
        values = {}
        for term in self.terms:
            value = term.fn(inp)
            if inspect.isawaitable(value):
                if hasattr(value, "close"):
                    value.close()
                raise EnvError(f"reward term {term.name!r} is async; use `await rubric.ascore(...)`")
            values[term.name] = _check(term.name, value)
        return self._total(values), values

    def _total(self, values: Mapping[str, float]) -> float:
        return float(sum(t.weight * values[t.name] for t in self.terms))


def _check(name: str, value: Any) -> float:
    if isinstance(value, bool):
        value = float(value)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise EnvError(f"reward term {name!r} returned {value!r}; a reward is a finite number")
    return float(value)


# --------------------------------------------------------------------------- reusable terms


def fact(name: str, default: float = 0.0) -> Callable[[RewardInput], float]:
    """A term that reads the fact ``name`` the env measured (bools become 1.0/0.0)."""

    def read(inp: RewardInput) -> float:
        value = inp.facts.get(name, default)
        return float(value) if value is not None else default

    read.__name__ = f"fact_{name}"
    return read


def discounted(name: str, gamma: float, attempts: str = "attempts") -> Callable[[RewardInput], float]:
    """``facts[name] * gamma ** (facts[attempts] - 1)``: full credit on the first attempt."""
    if not 0 < gamma <= 1:
        raise EnvError(f"discount gamma must be in (0, 1], got {gamma}")

    def score(inp: RewardInput) -> float:
        n = max(1, int(inp.facts.get(attempts, 1)))
        return float(inp.facts.get(name, 0.0)) * gamma ** (n - 1)

    score.__name__ = f"discounted_{name}"
    return score


_BOXED = re.compile(r"\\boxed\s*\{")


def boxed_format(inp: RewardInput) -> float:
    """1.0 when the final reply puts an answer in ``\\boxed{...}``, else 0.0."""
    return 1.0 if _BOXED.search(inp.response) else 0.0


def length_penalty(budget: int, count: Callable[[str], int] = len) -> Callable[[RewardInput], float]:
    """0.0 up to ``budget`` units of the final reply, then falling linearly to -1.0 at twice
    the budget (and staying there). ``count`` measures the reply (characters by default)."""
    if budget < 1:
        raise EnvError(f"length budget must be >= 1, got {budget}")

    def penalty(inp: RewardInput) -> float:
        over = count(inp.response) - budget
        return -min(1.0, over / budget) if over > 0 else 0.0

    penalty.__name__ = "length_penalty"
    return penalty
