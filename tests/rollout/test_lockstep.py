"""The lockstep clock's rules (agentrl.rollout.lockstep), on a fake engine: chunks advance one per
round, a round waits for every live episode (however slow its env step), weights change only
between rounds and at the round the schedule says, whatever the timing."""

from __future__ import annotations

import asyncio
import random

from agentrl.api import Completion, SamplingParams, continuation_seed
from agentrl.rollout.lockstep import Lockstep, LockstepClient, LockstepConfig


class FakeEngine:
    """Answers each chunk with its seed-derived tokens, tagged with the current version; logs calls."""

    def __init__(self) -> None:
        self.version = 0
        self.inflight = 0
        self.calls: list[tuple[int, int, int]] = []  # (round, prompt length, version)
        self.clock: Lockstep | None = None

    async def generate(self, input_ids, sampling: SamplingParams, *, on_progress=None) -> Completion:
        self.inflight += 1
        self.calls.append((self.clock.round, len(input_ids), self.version))
        await asyncio.sleep(random.random() * 0.01)  # timing that must not matter
        self.inflight -= 1
        rnd = random.Random(sampling.seed)
        tokens = [rnd.randrange(100) for _ in range(sampling.max_new_tokens)]
        return Completion(tokens, [-1.0] * len(tokens), [self.version] * len(tokens), "length")


def run_schedule(seed: int) -> tuple[list, list, list]:
    """Three episodes of two 6-token calls (chunks of 4) with env steps of random length between,
    and a publish expected after round 2 whose train step takes a random time."""
    random.seed(seed)

    async def main():
        engine = FakeEngine()
        clock = Lockstep(LockstepConfig(chunk_tokens=4, overlap_rounds=1))
        engine.clock = clock
        publishes: list[tuple[int, int]] = []
        results: list = [None] * 3
        tasks: list[asyncio.Task] = []

        async def episode(i: int) -> None:
            try:
                client = LockstepClient(engine, clock)
                outs = []
                for call in range(2):
                    await asyncio.sleep(random.random() * 0.02)  # the env's step
                    outs.append(await client.generate([1] * (5 + i), SamplingParams(max_new_tokens=6, seed=10 * i + call)))
                results[i] = [(c.tokens, c.versions) for c in outs]
            finally:
                clock.ended()

        def admit() -> None:
            if clock.round == 0:
                clock.began(3)
                tasks.extend(asyncio.create_task(episode(i)) for i in range(3))

        async def train_and_publish() -> None:
            clock.expect_publish(1)  # batch 0 "complete" in round 0: published after round 1
            await asyncio.sleep(random.random() * 0.05)  # the train step

            async def publish() -> int:
                assert engine.inflight == 0  # between rounds: nothing in flight
                engine.version = 1
                publishes.append((clock.round, engine.version))
                return 1
            assert await clock.publish(1, publish) == 1

        clock.on_boundary = admit
        clock.start()
        await train_and_publish()
        await asyncio.gather(*tasks)
        await clock.stop()
        return sorted(engine.calls), publishes, results

    return asyncio.run(main())


def test_the_schedule_is_the_same_whatever_the_timing():
    first = run_schedule(0)
    for seed in (1, 2, 3):
        assert run_schedule(seed) == first
    calls, publishes, results = first
    assert publishes == [(1, 1)]  # after round 1 (the expected round 0 + overlap 1)
    # every call is two chunks (4 + 2 tokens), one a round, each continuing from the tokens so far
    assert calls == sorted((r, n + 5 + i, v) for i in range(3)
                           for r, n, v in [(1, 0, 0), (2, 4, 1), (3, 0, 1), (4, 4, 1)])
    # the first call's generation spans the publish: 4 tokens of version 0, then 2 of version 1
    for i, calls_of_episode in enumerate(results):
        (tokens, versions), second = calls_of_episode
        assert versions == [0, 0, 0, 0, 1, 1] and second[1] == [1] * 6
        rnd, cont = random.Random(10 * i), random.Random(continuation_seed(10 * i, 4))
        assert tokens == [rnd.randrange(100) for _ in range(4)] + [cont.randrange(100) for _ in range(2)]
