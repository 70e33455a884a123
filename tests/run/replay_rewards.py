"""Reward functions for tests/run/test_replay.py (named ``replay_rewards:NAME`` with this folder on
PYTHONPATH): ``correct`` is agentrl/Arith-v0's own rubric (its ``format`` term has weight 0), so
re-scoring with it changes nothing; ``exact_format`` pays for the answer's form alone."""

from __future__ import annotations

from agentrl.env.rewards import Reward, Rubric, fact

rubric = Rubric([Reward("correct", fact("correct"))])


def correct(inp) -> float:
    return float(inp.facts["correct"])


async def exact_format(inp) -> float:
    return float(inp.facts["exact_format"])


def raises(inp):
    """A reward function with a bug (issue 49: replay printed its traceback)."""
    return 1 / 0
