"""The staleness bound: the executor's capacity formula and the trainer's filter."""

from __future__ import annotations

import pytest

from agentrl.api import Trajectory
from agentrl.trainer.staleness import is_stale, rollout_capacity, split_stale


def test_capacity_pinned():
    # (η + v + 1)·B − (accepted + running) = (1 + 2 + 1)·4 − (5 + 3) = 8; concurrency allows 97
    assert rollout_capacity(batch_size=4, version=2, max_staleness=1, max_concurrent=100,
                            accepted=5, running=3) == 8
    # the concurrency cap binds: 10 − 7 = 3
    assert rollout_capacity(batch_size=4, version=2, max_staleness=1, max_concurrent=10,
                            accepted=5, running=7) == 3
    # synchronous (η = 0) at v = 0: only the first batch, never negative
    assert rollout_capacity(batch_size=4, version=0, max_staleness=0, max_concurrent=100,
                            accepted=3, running=1) == 0
    assert rollout_capacity(batch_size=4, version=0, max_staleness=0, max_concurrent=100,
                            accepted=9, running=0) == 0
    with pytest.raises(ValueError, match="batch_size"):
        rollout_capacity(batch_size=0, version=0, max_staleness=0, max_concurrent=1, accepted=0, running=0)


def _traj(versions):
    n = len(versions)
    return Trajectory([1] * (n + 1), [0] + [1] * n, [0.0] + [-1.0] * n, [-1] + versions)


def test_filter_drops_only_trajectories_beyond_eta():
    assert not is_stale(3, 5, 2) and is_stale(2, 5, 2)
    fresh, stale = split_stale([_traj([3, 5]), _traj([2, 5]), _traj([5]), _traj([])], version=5, max_staleness=2)
    assert [t.oldest_version for t in fresh] == [3, 5, -1]  # no sampled token: never stale
    assert [t.oldest_version for t in stale] == [2]  # the *oldest* token decides
