"""Deterministic mode's schedule: generation in lockstep rounds, weights published between rounds.

What it is: with ``deterministic: true`` (DESIGN.md §4 "Deterministic mode"), what timing decides
in the default mode is fixed by the config instead:

- ``Lockstep``, the round clock. Every generation call of every episode is cut into chunks of
  ``chunk_tokens`` tokens; a chunk waits at the gate for the next round. A round ends when
  nothing is busy: every live episode is parked at the gate for its next chunk or has ended
  (its environment steps, tool calls and sandbox programs in between are waited for, however
  long they take). Between rounds, and only there, the trainer's weights are published and
  then the executor admits groups (``on_boundary``), whose episodes reach the gate in time
  for the next round.
- The publish of version v + 1 happens at the end of round ``R_v + overlap_rounds``, where
  ``R_v`` is the round in which batch v (the executor's B groups in row order) became
  complete: generation overlaps the train step by that many rounds. A train step that takes
  longer holds the round clock until its publish; a faster one waits for that round. So which
  tokens each version samples — and which generations a publish splits — is fixed.
- ``LockstepClient``, an episode's client under the clock: one ``generate`` call becomes
  chunks, each continuing from the prompt and the tokens so far with its own seed
  (``SamplingParams.continued``), every token tagged with the version that sampled it.

With batch-invariant servers (``agentrl serve --enable-deterministic-inference``) a chunk's
tokens do not depend on what else the round sends, so two runs of the same config and seed
sample the same tokens and train the same weights.

What it is not: the admission rule (``agentrl.trainer.staleness``) or the executor; a way to
make vLLM or SGLang on GPUs deterministic (they are not batch-invariant by default). Main
hooks: ``Lockstep.start()``, ``expect_publish(version)``, ``await publish(version, fn)``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.api import Completion, InferenceClient, SamplingParams
from agentrl.config import option
from agentrl.errors import ConfigError

log = logging.getLogger(__name__)

SETTLE_TICKS = 3
"""Event-loop ticks a round's end waits before it is taken: calls an episode starts together
(``asyncio.gather``) reach the gate on the next tick, not the same one."""


@dataclass
class LockstepConfig:
    """Deterministic mode's schedule (a run's ``rollout.lockstep``; used only with ``deterministic: true``)."""

    chunk_tokens: int = option(8, ge=1, help="deterministic mode: tokens a generation call samples per round; "
                                             "weights change only between rounds")
    overlap_rounds: int = option(2, ge=0, help="deterministic mode: rounds of generation that overlap a train "
                                               "step (0: generation waits for every publish)")


def chunkable(sampling: SamplingParams) -> str | None:
    """Why ``sampling`` cannot be cut into chunks, or None. A stop string or pattern may
    straddle two chunks (the server sees one chunk's output); a penalty counts the output so
    far, which a chunk's server does not see."""
    if sampling.stop or sampling.stop_regex:
        return "stop strings and stop_regex (use stop_token_ids)"
    if sampling.frequency_penalty or sampling.presence_penalty or sampling.repetition_penalty != 1.0:
        return "frequency, presence and repetition penalties"
    return None


class Lockstep:
    """The round clock; see the module doc. Single event loop."""

    def __init__(self, config: LockstepConfig) -> None:
        self.chunk_tokens, self.overlap_rounds = config.chunk_tokens, config.overlap_rounds
        self.round = 0
        self.busy = 0  # episodes (and finishing groups) doing anything but waiting at the gate
        self.on_boundary: Callable[[], None] | None = None  # admission, between rounds
        self.on_failure: Callable[[BaseException], None] | None = None  # the executor's: its trainer must hear
        self._parked: list[asyncio.Future] = []
        self._admitted_round = -1  # the round whose end last admitted groups
        self._due: dict[int, int] = {}  # version -> the round it is published after
        self._publishes: dict[int, tuple[Callable[[], Awaitable[Any]], asyncio.Future]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._failure: BaseException | None = None

    # ------------------------------------------------------------------ the executor's side

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._clock(), name="lockstep")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for f in self._parked:
            f.cancel()
        self._parked.clear()

    def began(self, n: int = 1) -> None:
        """``n`` episodes (or a finishing group) started work."""
        self.busy += n

    def ended(self) -> None:
        """One of them ended."""
        self.busy -= 1
        self._wake.set()

    def expect_publish(self, version: int) -> None:
        """Batch ``version - 1`` became complete in this round: version ``version`` goes out after
        round ``round + overlap_rounds`` (never before an earlier version)."""
        earlier = self._due.get(version - 1, 0)
        self._due[version] = max(earlier, self.round + self.overlap_rounds)
        self._wake.set()

    async def publish(self, version: int, fn: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``fn`` (the trainer's publish of ``version``) between the rounds it is due at."""
        if self._failure is not None:
            raise self._failure
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        self._publishes[version] = (fn, done)
        self._wake.set()
        return await done

    async def turn(self) -> None:
        """Park until the next round (the caller was busy; it is busy again when this returns)."""
        if self._failure is not None:
            raise self._failure
        waiter: asyncio.Future = asyncio.get_running_loop().create_future()
        self._parked.append(waiter)
        self.busy -= 1
        self._wake.set()
        try:
            await waiter
        except asyncio.CancelledError:
            if not waiter.done() or waiter.cancelled():
                self.busy += 1  # a cancelled episode leaves through ended()
            raise

    # ------------------------------------------------------------------ the clock

    async def _settled(self) -> bool:
        for _ in range(SETTLE_TICKS):
            await asyncio.sleep(0)
        return self.busy == 0

    async def _clock(self) -> None:
        try:
            while True:
                self._wake.clear()
                if self.busy > 0 or not await self._settled():
                    await self._wake.wait()
                    continue
                await self._between_rounds()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # a failed publish or admission must reach the trainer
            log.exception("the lockstep clock failed")
            self._failure = e
            for f in self._parked:
                if not f.done():
                    f.set_exception(e)
            for _, done in self._publishes.values():
                if not done.done():
                    done.set_exception(e)
            if self.on_failure is not None:  # a trainer waiting for a batch, not a publish
                self.on_failure(e)

    async def _between_rounds(self) -> None:
        """The end of round ``self.round``: the publishes due, admission, then the next round."""
        for version in sorted(v for v, r in self._due.items() if r <= self.round):
            while version not in self._publishes:  # the train step is still running: the clock waits
                self._wake.clear()
                await self._wake.wait()
            fn, done = self._publishes.pop(version)
            del self._due[version]
            try:
                done.set_result(await fn())
            except BaseException as e:
                done.set_exception(e)
                raise
        if self.on_boundary is not None and self._admitted_round != self.round:
            self._admitted_round = self.round
            self.on_boundary()
            if self.busy > 0:  # the groups just admitted reach the gate, then the round starts with them
                return
        if not self._parked and self.busy == 0:  # nothing live: skip to the next publish, or wait for one
            if self._due:
                self.round = max(self.round, min(self._due.values()))
            else:
                self._wake.clear()
                await self._wake.wait()
            return
        self.round += 1
        parked, self._parked = self._parked, []
        self.busy += len(parked)
        for f in parked:
            if not f.done():
                f.set_result(None)


class LockstepClient:
    """An episode's client under the round clock: each call generated a chunk per round."""

    def __init__(self, client: InferenceClient, clock: Lockstep) -> None:
        self.client, self.clock = client, clock

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *,
                       on_progress: Callable[[Completion], None] | None = None) -> Completion:
        why = chunkable(sampling)
        if why is not None:
            raise ConfigError(f"deterministic mode cuts generation into chunks and cannot honour {why}; "
                              "take them out of the sampling settings, or run without deterministic: true")
        prompt = [int(t) for t in input_ids]
        tokens: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        while True:
            await self.clock.turn()
            chunk = sampling.continued(len(tokens), self.clock.chunk_tokens)
            n = chunk.max_new_tokens
            out = await self.client.generate(prompt + tokens, chunk)
            tokens += out.tokens
            logprobs += out.logprobs
            versions += out.versions
            if out.finish_reason == "stop":
                return Completion(tokens, logprobs, versions, "stop", out.matched_stop)
            if len(tokens) >= sampling.max_new_tokens or len(out.tokens) < n:  # the budget, or the context
                return Completion(tokens, logprobs, versions, "length")
            if on_progress is not None:
                on_progress(Completion(list(tokens), list(logprobs), list(versions), "abort"))
