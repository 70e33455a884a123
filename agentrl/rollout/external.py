"""Episodes that agents play through the gateway on their own, as groups for the trainer.

What it is: ``GatewayEpisodes(executor, group_size)``, the bridge between a ``Gateway`` whose
agents open their own sessions (any process, any language: ``POST /v1/sessions``, the OpenAI
API, a reward, ``/end``) and the ``RolloutExecutor``'s queue of finished groups. A session's
metadata may name its group (``{"group": "task-17"}``): the episodes of one group are one
GRPO group, complete after ``group_size`` of them; sessions that name none are packed into
groups in arrival order. Its two hooks go on the gateway:

  * ``admits(metadata)`` (``gateway.admission``): a session of a group that is already open
    is admitted while the group has places left; a session of a new group only while the
    staleness bound has room (``rollout_capacity`` with the open groups as running) — else
    the agent gets 429 with ``Retry-After`` and tries again once the trainer has moved on;
  * ``on_episode(trajectories, session)`` (``gateway.on_episode``): adds an ended session's
    trajectories to its group and hands complete groups to the executor.

Failures are data: a session that ended failed (the agent disconnected and the session idled
out, every upstream died) counts as an episode of its group with failed trajectories, which
the trainer counts and never trains on. A call whose client hung up before the answer is not
in the episode at all (the gateway takes it back: ``agentrl.rollout.gateway``), so it never
enters a group's advantage; it is counted (``rollout/gateway_calls_abandoned``), and a session
left with no call counts as a failed episode. What it is not: resumable — groups still open when a
run stops are lost (the agents' calls cannot be replayed without the agents).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from agentrl.api import Trajectory, TrajectoryStatus
from agentrl.rollout.executor import Group, RolloutExecutor


class GatewayEpisodes:
    """Groups of gateway sessions, admitted within the executor's staleness bound."""

    def __init__(self, executor: RolloutExecutor, group_size: int) -> None:
        self.executor, self.group_size = executor, group_size
        self._opened: dict[str, int] = {}  # group key -> sessions admitted into it
        self._groups: dict[str, Group] = {}  # group key -> episodes ended so far
        self._auto = itertools.count()
        self._auto_key: str | None = None

    @property
    def open_groups(self) -> int:
        return len(self._opened)

    def _key(self, metadata: Mapping[str, Any]) -> str:
        key = metadata.get("group")
        if key is not None:
            return f"g:{key}"
        if self._auto_key is None or self._opened.get(self._auto_key, 0) >= self.group_size:
            self._auto_key = f"auto:{next(self._auto)}"
        return self._auto_key

    def admits(self, metadata: Mapping[str, Any]) -> bool:
        """Admit (and reserve a place for) a session with ``metadata``; see the module doc."""
        key = self._key(metadata)
        opened = self._opened.get(key)
        if opened is None and self.executor.capacity(running=self.open_groups) <= 0:
            return False
        if opened is not None and opened >= self.group_size:
            return False  # this group is full; its key becomes free again once it completes
        self._opened[key] = (opened or 0) + 1
        if isinstance(metadata, dict):
            metadata["agentrl_group"] = key  # the session keeps the group it was admitted into
        return True

    async def on_episode(self, trajectories: list[Trajectory], session: Any) -> None:
        key = session.metadata.get("agentrl_group") or self._key(session.metadata)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = Group(index=-1, row=dict(session.metadata))
        group.episodes += 1
        self.executor.counters["gateway_calls_abandoned"] += session.chat.conversation.abandoned
        if not trajectories or any(t.status is not TrajectoryStatus.OK for t in trajectories):
            group.failed += 1
        group.trajectories.extend(trajectories)
        if group.episodes >= self.group_size:
            del self._groups[key]
            self._opened.pop(key, None)
            self.executor.accept_group(group)
        else:
            self.executor.counters["gateway_episodes_waiting"] = sum(g.episodes for g in self._groups.values())
