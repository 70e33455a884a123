"""An Arith-v0 whose step raises on about 30% of episodes (for tests/run/test_reliability.py).

Importing this module registers ``test/FlakyArith-v0``; ``rows`` is its dataset function, so a
run config naming ``flaky_arith:rows`` registers the env in every process that loads the rows.
"""

from __future__ import annotations

import random

import gymnasium

from envs.arith import ArithEnv, training_rows


class FlakyArithEnv(ArithEnv):
    """Arith-v0 whose step raises RuntimeError for 30% of replies (a seeded coin per reply)."""

    async def _turn(self, action):
        if random.Random(f"{self.task['question']}|{action}").random() < 0.3:
            raise RuntimeError("the flaky env broke on purpose")
        return await super()._turn(action)


gymnasium.register("test/FlakyArith-v0", entry_point=FlakyArithEnv)


def rows(seed: int) -> list[dict]:
    return training_rows(seed, n=2000)


class BrokenArithEnv(ArithEnv):
    """Arith-v0 whose every step raises (a run of it learns from nothing)."""

    async def _turn(self, action):
        raise RuntimeError("the broken env broke on purpose")


gymnasium.register("test/BrokenArith-v0", entry_point=BrokenArithEnv)
