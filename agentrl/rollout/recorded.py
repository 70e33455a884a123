"""A run's recorded steps as the groups of another run: training off-policy on identical data.

What it is: ``RecordedEpisodes(path)`` reads what ``RunLog.record`` wrote (``RUN_DIR/record/
step_NNNNNN.jsonl``: every trajectory of every step whole, with its behaviour log-probabilities
and the policy version of every token; or what ``agentrl replay`` wrote, the same rows
re-scored) and hands step k's groups, in their recorded order, to a ``RolloutExecutor`` as
groups played elsewhere (``accept_group``), so the trainer's batch k is the recorded run's
batch k. Nothing is generated: the trajectories keep the tokens, logprobs and versions they
were sampled with, so the staleness filter and the decoupled-PPO importance weights see them
as the recorded run did, and two loss variants (``trainer.loss.*``) train on the same data.
A run's ``rollout.source`` set to such a path uses it (``agentrl.run.loop``).

``recorded_steps(path)`` and ``checked_rows(step_file)`` are the readers ``agentrl replay``
shares: every row is checked as a ``Trajectory`` (masks, finite log-probabilities, token ids
within the model's vocabulary when it is known) and a row recorded twice is refused — it would
train as a larger group — each refusal naming ``file:line``. What it is not: a replay of generation for ``--resume`` (``agentrl.rollout.journal``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl.api import Trajectory, TrajectoryStatus
from agentrl.errors import ConfigError
from agentrl.rollout.executor import Group, RolloutExecutor
from agentrl.rollout.record import RECORD_DIR, RECORD_STEP


def recorded_steps(path: str | Path) -> list[Path]:
    """The step files of a record, in step order: ``path`` is a run directory (its ``record/``)
    or a folder of ``step_NNNNNN.jsonl`` files (a run's ``record/``, or ``agentrl replay``'s)."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"{str(path)!r} is not a directory; give the run_dir of an `agentrl train` run "
                          "(or its record/ folder)")
    folder = path / RECORD_DIR if (path / RECORD_DIR).is_dir() else path
    steps = sorted(folder.glob(RECORD_STEP))
    if not steps:
        raise ConfigError(f"{str(path)!r} holds no recorded steps (no record/step_NNNNNN.jsonl): runs record them "
                          "with logging.record: true (the default)")
    return steps


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of one recorded step (a line that is not a JSON object is refused by ``file:line``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); a recorded step is JSON lines") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            raise ConfigError(f"{path}:{n}: not a JSON line ({getattr(e, 'msg', 'nested too deeply')})") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}:{n}: a recorded trajectory is a JSON object, got {type(row).__name__}")
        rows.append(row)
    return rows


def model_vocab_size(model_dir: str | Path | None) -> int | None:
    """``vocab_size`` of the model directory's ``config.json`` (None: none readable)."""
    try:
        return int(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"])  # type: ignore[arg-type]
    except (OSError, ValueError, TypeError, KeyError):
        return None


def checked_rows(path: Path, vocab_size: int | None = None) -> list[tuple[dict[str, Any], Trajectory]]:
    """The rows of one recorded step with their ``Trajectory``; a row that is not one, holds a
    token id outside ``vocab_size`` (when given) or repeats an earlier row is refused by ``file:line``."""
    out = []
    seen: dict[str, int] = {}
    for n, row in enumerate(read_rows(path), 1):
        try:
            t = Trajectory.from_dict(row)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{path}:{n}: not a recorded trajectory ({e})") from None
        if vocab_size is not None and t.input_ids and max(t.input_ids) >= vocab_size:
            raise ConfigError(f"{path}:{n}: token id {max(t.input_ids)} is outside the model's vocabulary "
                              f"({vocab_size} ids); these rows come from another model")
        key = json.dumps([t.group_id, t.episode_id, t.input_ids, t.loss_mask])
        if key in seen:
            raise ConfigError(f"{path}:{n}: repeats line {seen[key]} (the same trajectory twice would train as a "
                              "larger group); remove the copy")
        seen[key] = n
        out.append((row, t))
    return out


def recorded_groups(path: Path, vocab_size: int | None = None) -> list[Group]:
    """The groups of one recorded step, in the order their first trajectory was recorded."""
    groups: dict[str, Group] = {}
    episodes: dict[str, set[str]] = {}
    failed: dict[str, set[str]] = {}
    for n, (_, t) in enumerate(checked_rows(path, vocab_size), 1):
        group = groups.setdefault(t.group_id, Group(index=-1, row={}))
        group.trajectories.append(t)
        episodes.setdefault(t.group_id, set()).add(t.episode_id or f"#{n}")
        if t.status is not TrajectoryStatus.OK:
            failed.setdefault(t.group_id, set()).add(t.episode_id or f"#{n}")
    for key, group in groups.items():
        group.episodes, group.failed = len(episodes[key]), len(failed.get(key, ()))
    return list(groups.values())


class RecordedEpisodes:
    """Recorded steps fed to an executor, one step's groups per train step; see the module doc."""

    def __init__(self, path: str | Path, vocab_size: int | None = None) -> None:
        self.path = Path(path)
        self.steps = recorded_steps(path)
        self.vocab_size = vocab_size  # token ids are checked against it (None: not checked)

    def check(self, *, batch_size: int, steps: int) -> None:
        """Refuse a run whose batches would not be the recorded ones (naming the key)."""
        if steps > len(self.steps):
            raise ConfigError(f"config key 'steps': {steps} steps, but {str(self.path)!r} holds {len(self.steps)} "
                              "recorded steps; train at most that many")
        for path in self.steps[:steps]:
            n = len(recorded_groups(path, self.vocab_size))
            if n != batch_size:
                raise ConfigError(f"config key 'rollout.batch_size': {batch_size} groups a step, but {path} holds "
                                  f"{n}; set it to the recorded run's batch size")

    def feed(self, executor: RolloutExecutor, *, first_step: int = 0, steps: int | None = None) -> int:
        """Queue the groups of the recorded steps from ``first_step`` (0-based) up to ``steps``;
        returns the number of groups queued."""
        queued = 0
        for path in self.steps[first_step:steps]:
            for group in recorded_groups(path, self.vocab_size):
                executor.accept_group(group)
                queued += 1
        return queued
