"""Episode seeds: one sampling seed per generation call of every episode, derived from the run's.

What it is: ``call_seed(seed, index, sample, call)`` — the seed of call ``call`` of the
``sample``-th episode of row ``index`` (the row's place in the run's order), drawn from the
run's ``seed`` by a stable hash; and ``SeededClient``, an episode's ``InferenceClient`` that
puts it into every call whose sampling settings carry a seed (``rollout.sampling.seed``).
Without it a seed in the sampling settings would give every sample of a group the same tokens;
with it, the episodes of a run draw the same tokens whatever order they run in or what shares
their server's batch (a seeded request samples from its own RNG), so two runs — or ``agentrl
train`` at η = 0 and the synchronous loop ``examples/grpo_arith.py`` — see the same samples.
Calls whose sampling has no seed pass unchanged (the server's own RNG).

What it is not: a guarantee of equal tokens across engines or hardware (the logits must be
equal too; vLLM and SGLang on GPUs are not batch-invariant by default).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Sequence

from agentrl.api import Completion, InferenceClient, SamplingParams


def call_seed(seed: int, index: int, sample: int, call: int) -> int:
    """The sampling seed of call ``call`` (0-based) of episode ``sample`` of row ``index``."""
    return zlib.crc32(f"{seed}:{index}:{sample}:{call}".encode()) & 0x7FFFFFFF


class SeededClient:
    """One episode's client: each call's seed becomes ``call_seed(its seed, index, sample, call)``."""

    def __init__(self, client: InferenceClient, index: int, sample: int) -> None:
        self.client, self.index, self.sample = client, index, sample
        self.calls = 0

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *,
                       on_progress: Callable[[Completion], None] | None = None) -> Completion:
        call, self.calls = self.calls, self.calls + 1
        if sampling.seed is not None:
            sampling = dataclasses.replace(sampling, seed=call_seed(sampling.seed, self.index, self.sample, call))
        return await self.client.generate(input_ids, sampling, on_progress=on_progress)
