"""A workflow for tests that compare whole runs: EnvWorkflow whose k-th episode of a row samples
with a seed of its own (for tests/run/test_multinode.py).

Every generation call of that episode gets ``seed = crc32(row, k) + call``, so two runs that
admit the same rows draw the same tokens whatever the order the episodes run in, and the
same groups reach the trainer. Named in a config as ``seeded_workflow:SeededEnvWorkflow``
with this folder on PYTHONPATH.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import zlib
from typing import Any

from workflows.env import EnvWorkflow


class SeededClient:
    """The run's InferenceClient with this episode's seeds put into every call's sampling."""

    def __init__(self, client: Any, seed: int) -> None:
        self.client, self.seed, self.calls = client, seed, 0

    async def generate(self, input_ids, sampling, **kwargs):
        self.calls += 1
        return await self.client.generate(input_ids, dataclasses.replace(sampling, seed=self.seed + self.calls),
                                          **kwargs)


class SeededEnvWorkflow(EnvWorkflow):
    """EnvWorkflow with one seed per (row, k-th episode of that row)."""

    def __init__(self, env_id: str, tokenizer: Any, sampling: Any = None, env_kwargs: Any = None,
                 **kwargs: Any) -> None:  # named: the loop passes tokenizer and sampling when they are
        super().__init__(env_id, tokenizer, sampling, env_kwargs, **kwargs)
        self.drawn: collections.Counter[str] = collections.Counter()

    async def arun_episode(self, client, row):
        key = json.dumps(row, sort_keys=True)
        k, self.drawn[key] = self.drawn[key], self.drawn[key] + 1
        return await super().arun_episode(SeededClient(client, zlib.crc32(f"{key}|{k}".encode()) % 2**31), row)
