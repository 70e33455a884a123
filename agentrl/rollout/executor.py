"""The rollout executor: episodes run ahead of the trainer, as far as the staleness bound allows.

What it is: ``RolloutExecutor`` — one coroutine per episode (``Workflow.arun_episode``), ``n``
episodes per prompt run as a *group*, a cap on groups in flight, and admission by
``rollout_capacity`` (DESIGN.md §4, Staleness): with B groups per train step, trainer version v
and bound η, at most ``(η + v + 1)·B`` groups are ever accepted or running, so no accepted
sample can be more than η versions old when the trainer reaches it. Finished groups wait in a
queue; ``next_batch()`` hands the trainer the oldest B as soon as they exist while generation
goes on, in row order (not finish order: the batch's order is fixed by the data, not timing). η = 0 is synchronous RL with the same code.

Failures are data: an episode that raises, times out or returns failed trajectories comes
back as ``Trajectory.failed(...)`` and is counted; the trainer excludes it from the loss. With
``filter_equal_rewards`` (DAPO's dynamic sampling) a finished group whose rewards are all
equal carries no GRPO signal: it is dropped, counted, and another prompt is admitted instead.

Seeded: a seed in the workflow's sampling settings becomes one seed per call of each episode
(``agentrl.rollout.seeds``), so the samples do not depend on the order episodes run in.

Deterministic: with a ``lockstep`` clock (``agentrl.rollout.lockstep``), groups are admitted
only between generation rounds, every generation call goes chunk by chunk through the clock,
and batch k is the B accepted groups that follow batch k - 1 in row order (waiting for lower
rows still running), formed in the round its last group finished.

Recorded: with ``record_max_bytes``, every episode runs inside an ``EpisodeRecord``
(``agentrl.rollout.record``) that ends up on its first trajectory.

Resumable: every episode runs with a ``ReplayClient`` over an ``EpisodeLog`` (see
``agentrl.rollout.journal``), so the generations of a crashed run are replayed, not redone;
``state()`` / ``restore(state)`` carry the data cursor, the counters and the groups admitted
but not yet trained on. Counters restart from the restored values, never from zero.

What it is not: the trainer (it only reads ``version``), the inference client, or the
workflow. Main hooks: ``await executor.start()``, ``await executor.next_batch()``,
``executor.set_version(v)``, ``pause_admission()`` / ``resume_admission()`` (the weight
publisher's hooks), ``await executor.stop()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.api import InferenceClient, Trajectory, TrajectoryStatus, Workflow
from agentrl.errors import ConfigError
from agentrl.rollout.episode import guarded
from agentrl.rollout.journal import EpisodeLog, ReplayClient
from agentrl.rollout.lockstep import Lockstep, LockstepClient
from agentrl.rollout.record import recording
from agentrl.rollout.rollout_config import RolloutConfig
from agentrl.rollout.seeds import SeededClient
from agentrl.trainer.staleness import rollout_capacity

log = logging.getLogger(__name__)


class RowSource:
    """Row ``k`` of a run's training data, deterministically: the same seed gives the same order.

    The rows are visited in epochs; each epoch is a fresh permutation drawn from ``seed`` and the
    epoch number, so a resumed run that asks for row k again gets the same row.
    """

    def __init__(self, rows: Sequence[Mapping[str, Any]], *, seed: int = 0, shuffle: bool = True) -> None:
        if not rows:
            raise ConfigError("the rollout dataset is empty; give it at least one row")
        self.rows = list(rows)
        self.seed, self.shuffle = seed, shuffle
        self._orders: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, k: int) -> dict[str, Any]:
        epoch, i = divmod(k, len(self.rows))
        if not self.shuffle:
            return dict(self.rows[i])
        order = self._orders.get(epoch)
        if order is None:
            order = list(range(len(self.rows)))
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
            self._orders = {epoch: order}  # keep one epoch: rows are drawn in order
        return dict(self.rows[order[i]])


@dataclass(frozen=True)
class EpisodeKey:
    """An episode's name in the episode log (``"index:sample"``): its row's place in the run's
    order, and which of the group's samples it is."""

    index: int
    sample: int

    def __str__(self) -> str:
        return f"{self.index}:{self.sample}"

    @classmethod
    def parse(cls, key: str) -> EpisodeKey:
        index, sample = key.split(":")
        return cls(int(index), int(sample))


@dataclass
class Group:
    """The ``n`` episodes of one prompt (row ``index`` of the data)."""

    index: int
    row: dict[str, Any]
    trajectories: list[Trajectory] = field(default_factory=list)
    episodes: int = 0
    failed: int = 0
    rejected: int = 0
    seconds: float = 0.0

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories if t.status is TrajectoryStatus.OK]


@dataclass
class Batch:
    """What the trainer gets for one step: B groups and how long it waited for them."""

    groups: list[Group]
    wait_s: float

    @property
    def trajectories(self) -> list[Trajectory]:
        return [t for g in self.groups for t in g.trajectories]


EpisodeFn = Callable[[InferenceClient, dict[str, Any]], Awaitable[list[Trajectory] | None]]


class RolloutExecutor:
    """Runs groups of episodes ahead of the trainer within the staleness bound; see the module doc.

    Args:
        workflow: a ``Workflow`` (or any ``arun_episode``-shaped coroutine function).
        engine: the ``InferenceClient`` its episodes generate with.
        rows: the data, visited in order. With no workflow and rows, groups come only from
            ``accept_group`` (the gateway's agents).
        config: the run's ``rollout`` section; the executor reads ``group_size`` (n),
            ``batch_size`` (B), ``max_concurrent`` (*episodes* in flight, rounded down to whole
            groups) and ``filter_equal_rewards``.
        max_staleness: η, the trainer's bound (``trainer.max_staleness``).
        episode_log: the log that replays finished generations on a resume.
        run_id: the prefix of the episodes' ids.
        record_max_bytes: the bound of each episode's ``EpisodeRecord`` (None: no record).
        lockstep: deterministic mode's clock (None: episodes run freely).
    """

    def __init__(self, workflow: Workflow | EpisodeFn | None, engine: InferenceClient, rows: RowSource | None,
                 config: RolloutConfig, *, max_staleness: int, episode_log: EpisodeLog | None = None,
                 run_id: str = "run", record_max_bytes: int | None = None, lockstep: Lockstep | None = None) -> None:
        config.check_capacity()
        self.run_episode: EpisodeFn = getattr(workflow, "arun_episode", workflow)  # type: ignore[assignment]
        self.engine, self.rows, self.config = engine, rows, config
        self.group_size, self.batch_size, self.max_staleness = config.group_size, config.batch_size, max_staleness
        self.max_groups = config.max_concurrent // config.group_size
        self.filter_equal_rewards = config.filter_equal_rewards
        self.episode_log = episode_log
        self.run_id = run_id
        self.record_max_bytes = record_max_bytes
        self.lockstep = lockstep
        self._formed: deque[list[Group]] = deque()  # deterministic mode: batches in row order
        self.version = 0
        self.cursor = 0  # next row index to admit
        self.accepted = 0  # groups put in the queue, ever (consumed ones included)
        self.counters: Counter[str] = Counter()
        self._pending: deque[int] = deque()  # restored row indices to admit before the cursor's
        self._running: dict[int, asyncio.Task] = {}
        self._ready: deque[Group] = deque()
        self._changed = asyncio.Event()
        self._admitting = asyncio.Event()
        self._admitting.set()
        self._loop_task: asyncio.Task | None = None
        self._failure: BaseException | None = None
        self.gen_busy_s = 0.0  # wall time with at least one episode running
        self._busy_since: float | None = None

    # ------------------------------------------------------------------ control

    async def start(self) -> None:
        if self.rows is None or self.run_episode is None:
            raise ConfigError("this executor has no workflow and rows to play; groups reach it by accept_group")
        if self.lockstep is not None:
            self._next_version = self.version + 1  # what the next batch formed will train the policy to
            self.lockstep.on_boundary = self._admit
            self.lockstep.on_failure = self._fail
            self.lockstep.start()
        elif self._loop_task is None:
            self._loop_task = asyncio.create_task(self._admit_loop(), name="rollout-admission")

    async def stop(self) -> None:
        """Cancel the admission loop and every running episode (their logged generations stay,
        and their groups stay pending in ``state()``)."""
        self._pending = deque(sorted({*self._pending, *self._running}))
        if self.lockstep is not None:
            await self.lockstep.stop()
        tasks = [t for t in (self._loop_task, *self._running.values()) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._loop_task = None
        self._running.clear()

    def set_version(self, version: int) -> None:
        """The trainer finished step ``version``: more groups may be admitted."""
        self.version = version
        self._changed.set()

    async def pause_admission(self) -> None:
        """Start no new group (running ones go on); the weight publisher calls this before a pause."""
        self._admitting.clear()

    async def resume_admission(self) -> None:
        self._admitting.set()
        self._changed.set()

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def ready(self) -> int:
        return len(self._ready) + sum(len(b) for b in self._formed)

    def capacity(self, running: int | None = None) -> int:
        """Groups that may start now (``running``: groups in flight, default this executor's own)."""
        return rollout_capacity(batch_size=self.batch_size, version=self.version, max_staleness=self.max_staleness,
                                max_concurrent=self.max_groups, accepted=self.accepted,
                                running=self.running if running is None else running)

    def accept_group(self, group: Group) -> None:
        """A group played elsewhere (the gateway's agents) joins the queue like one of ours."""
        group.index = self._next_index()
        self._finish_group(group)
        self._changed.set()

    # ------------------------------------------------------------------ the trainer's side

    async def next_batch(self, max_wait_s: float | None = None) -> Batch:
        """The oldest ``batch_size`` finished groups, as soon as there are that many."""
        t0 = time.perf_counter()
        if self.lockstep is not None:
            async with asyncio.timeout(max_wait_s):
                while not self._formed:
                    if self._failure is not None:
                        raise self._failure
                    self._changed.clear()
                    await self._changed.wait()
            return Batch(self._formed.popleft(), time.perf_counter() - t0)
        async with asyncio.timeout(max_wait_s):
            while len(self._ready) < self.batch_size:
                if self._failure is not None:
                    raise self._failure
                self._changed.clear()
                await self._changed.wait()
        groups = sorted((self._ready.popleft() for _ in range(self.batch_size)), key=lambda g: g.index)
        self._changed.set()
        return Batch(groups, time.perf_counter() - t0)

    # ------------------------------------------------------------------ admission

    def _admit(self) -> None:
        """Start as many groups as the staleness bound and the cap allow, in row order."""
        n = self.capacity()
        for _ in range(n):
            index = self._pending.popleft() if self._pending else self._next_index()
            if self.lockstep is not None:
                self.lockstep.began(self.group_size)
            self._running[index] = asyncio.create_task(self._run_group(index), name=f"group-{index}")
        if n:
            self._mark_busy()

    def _form_batches(self) -> None:
        """Deterministic mode: the next batches in row order, as soon as no lower row is still to finish."""
        horizon = min([*self._running, *self._pending, self.cursor])
        while len(self._ready) >= self.batch_size:
            first = sorted(self._ready, key=lambda g: g.index)[: self.batch_size]
            if first[-1].index >= horizon:
                return
            for g in first:
                self._ready.remove(g)
            self._formed.append(first)
            self.lockstep.expect_publish(self._next_version)
            self._next_version += 1

    async def _admit_loop(self) -> None:
        try:
            while True:
                await self._admitting.wait()
                self._admit()
                self._changed.clear()
                if self.capacity() == 0 or not self._admitting.is_set():
                    await self._changed.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # a bug here must reach the trainer, not hang it
            log.exception("the rollout admission loop failed")
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        """Admission failed (here or in the lockstep clock): ``next_batch`` raises ``e``."""
        self._failure = e
        self._changed.set()

    def _next_index(self) -> int:
        index = self.cursor
        self.cursor += 1
        return index

    def _mark_busy(self) -> None:
        if self._busy_since is None and self._running:
            self._busy_since = time.perf_counter()

    def _mark_idle(self) -> None:
        if self._busy_since is not None and not self._running:
            self.gen_busy_s += time.perf_counter() - self._busy_since
            self._busy_since = None

    def generation_busy_s(self) -> float:
        """Wall time so far during which at least one episode was running."""
        extra = time.perf_counter() - self._busy_since if self._busy_since is not None else 0.0
        return self.gen_busy_s + extra

    async def _run_group(self, index: int) -> None:
        row = self.rows[index]
        group = Group(index, row)
        t0 = time.perf_counter()
        left = self.group_size

        async def episode(k: int) -> list[Trajectory] | None:
            nonlocal left
            try:
                return await self._run_episode(index, k, row)
            finally:
                left -= 1
                if self.lockstep is not None and left:  # the last one is held until the group is done
                    self.lockstep.ended()

        try:
            results = await asyncio.gather(*(episode(k) for k in range(self.group_size)))
            for trajectories in results:
                group.episodes += 1
                if trajectories is None:
                    group.rejected += 1
                    continue
                if any(t.status is not TrajectoryStatus.OK for t in trajectories):
                    group.failed += 1
                group.trajectories.extend(trajectories)
            group.seconds = time.perf_counter() - t0
            self._finish_group(group)
        finally:
            self._running.pop(index, None)
            self._mark_idle()
            if self.lockstep is not None:
                self._form_batches()
                self.lockstep.ended()
            self._changed.set()

    def _finish_group(self, group: Group) -> None:
        self.counters["groups_finished"] += 1
        self.counters["episodes_finished"] += group.episodes
        self.counters["episodes_failed"] += group.failed
        self.counters["episodes_rejected"] += group.rejected
        rewards = group.rewards
        if self.filter_equal_rewards and (len(set(rewards)) <= 1):
            self.counters["groups_filtered"] += 1
            if self.episode_log is not None:
                self.episode_log.forget([str(EpisodeKey(group.index, k)) for k in range(self.group_size)])
            return
        for t in group.trajectories:
            t.group_id = f"{self.run_id}-{group.index}"
        self._ready.append(group)
        self.accepted += 1

    async def _run_episode(self, index: int, sample: int, row: dict[str, Any]) -> list[Trajectory] | None:
        key = str(EpisodeKey(index, sample))
        episode_id = f"{self.run_id}-{key}"
        if self.episode_log is not None:
            done = self.episode_log.finished(key)
            if done is not None:
                self.counters["episodes_replayed"] += 1
                return done
            client: InferenceClient = ReplayClient(self._engine_client(), self.episode_log, key)
        else:
            client = self._engine_client()
        client = SeededClient(client, index, sample)  # a seeded sampling: a seed per call of this episode
        # the workflow's bug is the episode's failure, not the run's (its time budget is its own)
        with contextlib.ExitStack() as stack:
            record = (stack.enter_context(recording(self.record_max_bytes))
                      if self.record_max_bytes is not None else None)
            out = await guarded(self.run_episode(client, dict(row)), timeout_s=None, what=f"episode {episode_id}")
        if out is not None:
            for t in out:
                t.episode_id = t.episode_id or episode_id
            if out and record is not None and record.events and out[0].record is None:
                out[0].record = record.to_dict()
            if self.episode_log is not None:
                self.episode_log.record_episode(key, out)
        return out

    def _engine_client(self) -> InferenceClient:
        return self.engine if self.lockstep is None else LockstepClient(self.engine, self.lockstep)

    # ------------------------------------------------------------------ resume

    def state(self, consumed_groups: Sequence[Group] = ()) -> dict[str, Any]:
        """What a checkpoint keeps: the cursor, counters, and every admitted group not yet
        trained on (queued or running, plus ``consumed_groups`` taken but not trained yet)."""
        pending = sorted({*self._pending, *self._running, *(g.index for g in self._ready),
                          *(g.index for g in consumed_groups)})
        return {"cursor": self.cursor, "accepted": self.accepted - len(self._ready) - len(consumed_groups),
                "pending": pending, "counters": dict(self.counters)}

    def restore(self, state: Mapping[str, Any], version: int) -> None:
        """Continue from ``state()`` at trainer ``version``: the pending groups first, then the cursor's."""
        self.version = version
        self.cursor = int(state["cursor"])
        self.accepted = int(state["accepted"])
        self._pending = deque(int(i) for i in state["pending"])
        self.counters = Counter({k: int(v) for k, v in state.get("counters", {}).items()})
