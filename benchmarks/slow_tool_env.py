"""The agentic workload of ``benchmarks/async_rl.py``: episodes that wait on a slow tool.

``bench/SlowTool-v0``: the Arith-v0 question; the model's first reply is graded (reward 1 for
the right boxed sum), then the episode goes on for ``calls`` more turns, each answered by a
"tool" that takes a log-normal time before it returns (like a web search or a compile step):
``lognormal(mu=-0.125, sigma=0.5)`` seconds, mean exp(mu + sigma²/2) = 1.0 s, median 0.88 s,
95th percentile ~2.0 s. Latencies come from a seeded RNG per episode. The model's later replies
are sampled and trained like any turn; only the first is graded.

Importing this module registers the env; ``rows(seed)`` is the dataset of the benchmark's runs.
"""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

import gymnasium

from agentrl.env import EpisodeLimits, Reward, Rubric, TextEnv, Turn, fact
from agentrl.model.arith_data import extract_answer
from envs.arith import training_rows

LATENCY_MU, LATENCY_SIGMA = -0.125, 0.5
"""Log-normal tool latency: mean exp(mu + sigma²/2) = 1.0 s."""
TOOL_CALLS = 3


class SlowToolEnv(TextEnv):
    """An arithmetic question, then ``calls`` turns that each wait on a slow tool (see module doc).

    ## Description
    Reply to the question; every later turn gets a tool result after a log-normal delay.
    ## Action Space / ## Observation Space
    ``Text`` / ``Messages``.
    ## Starting State
    ``options["task"]``: an Arith-v0 row.
    ## Rewards
    ``correct`` (1.0): the first reply's boxed sum is right.
    ## Episode End
    After ``calls`` + 1 replies.
    ## Information / ## Arguments
    ``correct``, ``latency_s``; ``calls`` (3), ``render_mode``.
    ## Version History
    * v0: initial version.
    """

    def __init__(self, calls: int = TOOL_CALLS, render_mode: str | None = None) -> None:
        super().__init__(rubric=Rubric([Reward("correct", fact("correct"))]),
                         limits=EpisodeLimits(max_turns=calls + 1), render_mode=render_mode)
        self.calls = calls

    def sample_task(self) -> dict[str, Any]:
        return training_rows(int(self.np_random.integers(2**31)), n=1)[0]

    async def _start(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        self._rng = random.Random(task["question"])
        self._correct = False
        return [{"role": "user", "content": task["question"]}]

    async def _turn(self, action: str) -> Turn:
        if self._turns == 1:
            self._correct = extract_answer(action) == int(self.task["answer"])
        if self._turns > self.calls:
            return Turn(done=True, facts={"correct": self._correct})
        latency = math.exp(self._rng.gauss(LATENCY_MU, LATENCY_SIGMA))
        await asyncio.sleep(latency)
        return Turn([{"role": "user", "content": f"tool result {self._turns}: ok"}], done=False,
                    facts={"latency_s": latency})


if "bench/SlowTool-v0" not in gymnasium.registry:
    gymnasium.register("bench/SlowTool-v0", entry_point=SlowToolEnv)


def rows(seed: int) -> list[dict[str, Any]]:
    return training_rows(seed, n=2000)
