"""Staleness: how far behind the trainer rollout data may fall (DESIGN.md §4, Staleness).

What it is: two pure functions. ``rollout_capacity`` tells the rollout executor how many new
episodes it may start so that no accepted sample can be more than η versions old when the
trainer reaches it; ``split_stale`` is the trainer's own guard, dropping (and counting) every
trajectory whose oldest sampled token is more than η versions behind. What it is not: the
executor that admits episodes, or the queue that holds them.

Main hooks: ``rollout_capacity(...)``, ``split_stale(trajectories, version, max_staleness)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentrl.api import NOT_SAMPLED, Trajectory


def rollout_capacity(
    *, batch_size: int, version: int, max_staleness: int, max_concurrent: int, accepted: int, running: int
) -> int:
    """``min(max_concurrent − running, (η + v + 1)·B − (accepted + running))``, floored at 0.

    ``batch_size`` B is prompts (groups) per train step, ``version`` v the trainer's current
    version, ``accepted`` the episodes finished and accepted so far, ``running`` those in flight.
    With η = 0 at most one batch is ever ahead of the trainer: synchronous RL.
    """
    for name, value in (("batch_size", batch_size), ("max_concurrent", max_concurrent)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    for name, value in (("version", version), ("max_staleness", max_staleness),
                        ("accepted", accepted), ("running", running)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    by_concurrency = max_concurrent - running
    by_staleness = (max_staleness + version + 1) * batch_size - (accepted + running)
    return max(0, min(by_concurrency, by_staleness))


def is_stale(oldest_version: int, version: int, max_staleness: int) -> bool:
    """True when a trajectory whose oldest sampled token has ``oldest_version`` may not be
    trained on by a trainer at ``version``. A trajectory with no sampled token is never stale."""
    return oldest_version != NOT_SAMPLED and version - oldest_version > max_staleness


def split_stale(
    trajectories: Sequence[Trajectory], version: int, max_staleness: int
) -> tuple[list[Trajectory], list[Trajectory]]:
    """``(fresh, stale)``, order kept. The caller counts (and warns about) the stale ones."""
    fresh, stale = [], []
    for t in trajectories:
        (stale if is_stale(t.oldest_version, version, max_staleness) else fresh).append(t)
    return fresh, stale
