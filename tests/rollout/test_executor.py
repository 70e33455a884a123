"""RolloutExecutor: admission within the staleness bound, groups, failures as data, filtering,
and counters that survive a restore. A scripted workflow stands in for episodes (unit tests of
the executor's logic; the real loop is tested in tests/run)."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.api import NOT_SAMPLED, Trajectory, TrajectoryStatus
from agentrl.rollout.episode import guarded
from agentrl.rollout.executor import RolloutExecutor, RowSource
from agentrl.rollout.rollout_config import RolloutConfig


def traj(reward: float, version: int = 0) -> Trajectory:
    return Trajectory([1, 2, 3], [0, 1, 1], [0.0, -0.5, -0.5], [NOT_SAMPLED, version, version], reward=reward)


class Scripted:
    """Episodes that take ``delay`` seconds and score ``reward(row, call)``; records concurrency."""

    def __init__(self, reward=lambda row, n: 1.0, delay: float = 0.01, fail=lambda row, n: False):
        self.reward, self.delay, self.fail = reward, delay, fail
        self.calls = 0
        self.running_groups: set[int] = set()
        self.started_rows: list[int] = []

    async def arun_episode(self, client, row):
        self.calls += 1
        n = self.calls
        self.started_rows.append(row["i"])
        await asyncio.sleep(self.delay)
        if self.fail(row, n):
            raise RuntimeError("the env broke")
        return [traj(self.reward(row, n))]


def rows(n: int = 1000) -> RowSource:
    return RowSource([{"i": i} for i in range(n)], seed=0, shuffle=False)


def executor(workflow, max_staleness: int = 0, lockstep=None, **rollout) -> RolloutExecutor:
    config = RolloutConfig(**{"group_size": 2, "batch_size": 3, "max_concurrent": 64, **rollout})
    return RolloutExecutor(workflow, None, rows(), config, max_staleness=max_staleness, lockstep=lockstep)


async def settle():
    for _ in range(20):
        await asyncio.sleep(0.02)


async def test_eta_zero_admits_one_batch_ahead_and_waits_for_the_trainer():
    wf = Scripted()
    ex = executor(wf, max_staleness=0)
    await ex.start()
    await settle()
    assert ex.accepted == 3 and ex.running == 0 and wf.calls == 6  # B groups of n, then nothing
    batch = await ex.next_batch()
    assert [g.index for g in batch.groups] == [0, 1, 2]
    await settle()
    assert wf.calls == 6  # the trainer has not moved: synchronous RL admits nothing more
    ex.set_version(1)
    await settle()
    assert ex.accepted == 6 and wf.calls == 12
    await ex.stop()


async def test_eta_bounds_groups_ahead_of_the_trainer():
    wf = Scripted()
    ex = executor(wf, max_staleness=2)
    await ex.start()
    await settle()
    assert ex.accepted == (2 + 0 + 1) * 3  # (η + v + 1)·B
    for v in range(1, 4):
        await ex.next_batch()
        ex.set_version(v)
        await settle()
        assert ex.accepted == (2 + v + 1) * 3
    await ex.stop()


async def test_concurrency_cap_counts_whole_groups():
    wf = Scripted(delay=1.0)  # none ends before the check, even on a loaded machine
    ex = executor(wf, max_staleness=10, max_concurrent=5)  # 5 episodes = 2 groups of 2
    await ex.start()
    await asyncio.sleep(0.05)
    assert ex.running == 2 and wf.calls == 4
    await ex.stop()


async def test_failed_episodes_are_data_and_counted():
    wf = Scripted(fail=lambda row, n: n % 3 == 0)
    ex = executor(wf)
    await ex.start()
    batch = await ex.next_batch(max_wait_s=10)
    statuses = [t.status for t in batch.trajectories]
    assert statuses.count(TrajectoryStatus.ENV_ERROR) == 2 and len(statuses) == 6
    assert "the env broke" in next(t.error for t in batch.trajectories if t.status is TrajectoryStatus.ENV_ERROR)
    assert ex.counters["episodes_failed"] == 2
    assert all(t.group_id and t.episode_id for t in batch.trajectories)
    await ex.stop()


async def test_timeout_is_a_failure_status():
    # the time budget is the workflow's own (its timeout_s); one that runs out is a TIMEOUT
    async def episode(client, row):
        return await guarded(Scripted(delay=5.0).arun_episode(client, row), timeout_s=0.05)

    ex = executor(episode)
    await ex.start()
    batch = await ex.next_batch(max_wait_s=10)
    assert {t.status for t in batch.trajectories} == {TrajectoryStatus.TIMEOUT}
    await ex.stop()


async def test_equal_reward_groups_are_filtered_and_replaced():
    # rows with an even index: both episodes score 1 (no signal); odd: 0 and 1
    wf = Scripted(reward=lambda row, n: 1.0 if row["i"] % 2 == 0 else float(n % 2))
    ex = executor(wf, filter_equal_rewards=True)
    await ex.start()
    batch = await ex.next_batch(max_wait_s=10)
    assert all(g.index % 2 == 1 for g in batch.groups)
    assert len(batch.groups) == ex.batch_size  # refilled with new groups, not shrunk (DAPO's dynamic sampling)
    assert ex.counters["groups_filtered"] >= 3 and ex.accepted == 3
    await ex.stop()


async def test_restore_keeps_counters_and_admits_pending_groups_first():
    wf = Scripted()
    ex = executor(wf, max_staleness=1)
    await ex.start()
    await ex.next_batch()
    ex.set_version(1)
    await settle()
    await ex.stop()
    state = ex.state()
    assert state["accepted"] == 3  # what the trainer consumed; queued groups are pending again
    assert state["pending"] == [3, 4, 5, 6, 7, 8]
    assert state["counters"]["groups_finished"] == 9

    wf2 = Scripted()
    ex2 = executor(wf2, max_staleness=1)
    ex2.restore(state, version=1)
    await ex2.start()
    await settle()
    assert wf2.started_rows[:12] == [3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8]
    assert ex2.accepted == (1 + 1 + 1) * 3 and ex2.cursor == 9  # not zero: set from the restored step
    assert ex2.counters["groups_finished"] == 9 + 6
    await ex2.stop()


def test_row_source_is_deterministic_and_reshuffles_each_epoch():
    a = RowSource([{"i": i} for i in range(10)], seed=3)
    b = RowSource([{"i": i} for i in range(10)], seed=3)
    first = [a[k]["i"] for k in range(10)]
    assert first == [b[k]["i"] for k in range(10)] and sorted(first) == list(range(10))
    second = [a[k]["i"] for k in range(10, 20)]
    assert sorted(second) == list(range(10)) and second != first
    assert [a[k]["i"] for k in range(10)] == first  # asking again (a resume) gives the same rows


def test_bad_sizes_are_refused_with_the_key():
    from agentrl.errors import ConfigError

    with pytest.raises(ConfigError, match="max_concurrent"):
        executor(Scripted(), group_size=8, max_concurrent=4)
    with pytest.raises(ConfigError, match="empty"):
        RowSource([])


async def test_a_failure_in_the_lockstep_clock_reaches_the_trainer_waiting_for_a_batch():
    from agentrl.rollout.lockstep import Lockstep, LockstepConfig

    ex = executor(Scripted(), lockstep=Lockstep(LockstepConfig()))

    def broken_capacity(running=None):
        raise RuntimeError("admission broke")
    ex.capacity = broken_capacity  # admission runs in the clock, between rounds
    await ex.start()
    with pytest.raises(RuntimeError, match="admission broke"):
        await ex.next_batch(max_wait_s=5)
    await ex.stop()
