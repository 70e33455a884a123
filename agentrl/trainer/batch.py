"""TrainBatch: one train step's trajectories, filtered and turned into token tensors.

What it is: ``prepare_batch`` — the trainer-side gate between the trajectory queue and the
actor. It counts and drops what must not enter the loss (failed episodes, stale trajectories,
trajectories without a sampled token), shapes rewards, computes group-relative advantages
and lays every kept trajectory out as token-aligned tensors. Nothing is dropped silently:
each reason is a counter in ``TrainBatch.stats`` and a warning when it empties the batch or
leaves no learning signal. What it is not: packing or the forward pass (``agentrl.trainer.actor``).

Main hook: ``prepare_batch(trajectories, version=v, config=trainer_config)``; under torchrun,
``broadcast_trajectories`` first gives every rank rank 0's list (every rank holds the same
global batch; the actor picks each rank's share).

Per kept trajectory, ``TrainBatch.sequences[i]`` holds 1-D tensors of its length:
``input_ids`` (long), ``loss_mask`` (float 0/1), ``behaviour_logprobs`` and ``advantages``
(float32; the trajectory's advantage on loss tokens — per turn for ``advantages.kind: turn``, per
token once the critic has filled them for ``gae``, which adds ``token_rewards`` — 0 elsewhere), ``staleness`` (float32: how
many versions behind the trainer the weights that sampled each loss token are, 0 elsewhere); with
``trainer.distill``, ``teacher_logprobs`` (float32, 0 off the loss tokens; ``agentrl.trainer.distill``). The first token of a
sequence cannot be predicted, so it never is a loss token (counted in
``first_token_unmasked`` if a trajectory claimed it).
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from agentrl.api import Trajectory, TrajectoryStatus
from agentrl.trainer.advantages import compute_advantages, shaped_rewards
from agentrl.trainer.distill import distill_sequence
from agentrl.trainer.gae import token_rewards
from agentrl.trainer.staleness import split_stale
from agentrl.trainer.trainer_config import TrainerConfig
from agentrl.trainer.turns import turn_advantages


@dataclass
class TrainBatch:
    """The global batch of one train step; every rank holds the same one."""

    sequences: list[dict[str, torch.Tensor]]
    version: int
    stats: dict[str, float] = field(default_factory=dict)
    trajectories: list[Trajectory] = field(default_factory=list)  # the kept ones, sequences[i]'s source

    def __len__(self) -> int:
        return len(self.sequences)

    @property
    def groups(self) -> list[str] | None:
        """Each sequence's group (its trajectory's ``group_id``: one prompt), or None when the
        batch was built without its trajectories."""
        if len(self.trajectories) != len(self.sequences):
            return None
        return [t.group_id for t in self.trajectories]

    @property
    def lengths(self) -> list[int]:
        return [int(s["input_ids"].numel()) for s in self.sequences]

    @property
    def num_loss_tokens(self) -> int:
        return int(sum(float(s["loss_mask"].sum()) for s in self.sequences))

    def loss_tokens(self, indices: Sequence[int]) -> int:
        return int(sum(float(self.sequences[i]["loss_mask"].sum()) for i in indices))

    def loss_sequences(self, indices: Sequence[int]) -> int:
        """How many of ``indices`` have a loss token (the S of the sequence-mean aggregations)."""
        return sum(1 for i in indices if bool((self.sequences[i]["loss_mask"] > 0).any()))


def broadcast_trajectories(trajectories: Sequence[Trajectory] | None, src: int = 0) -> list[Trajectory]:
    """Rank ``src``'s trajectories on every rank (a collective; other ranks may pass None)."""
    import torch.distributed as dist

    is_src = dist.get_rank() == src
    if is_src and trajectories is None:
        raise ValueError(f"rank {src} must pass the trajectories to broadcast")
    if dist.get_world_size() == 1:  # nobody to send to: no round trip through dicts and pickle
        return list(trajectories)
    box = [[t.to_dict() for t in trajectories] if is_src else None]
    dist.broadcast_object_list(box, src=src)
    return [Trajectory.from_dict(d) for d in box[0]]


def _token_advantages(kept: Sequence[Trajectory], adv: torch.Tensor, config: TrainerConfig,
                      ) -> tuple[list[torch.Tensor] | None, dict[str, float]]:
    """``turn``: each trajectory's per-token advantages (``agentrl.trainer.turns``); else None (one
    advantage per trajectory, or the critic's for ``gae``)."""
    if config.advantages.kind != "turn":
        return None, {}
    shaped, _ = shaped_rewards([t.reward for t in kept], [t.num_sampled for t in kept], config=config.advantages)
    return turn_advantages(kept, adv.tolist(), shaped.tolist(), config.advantages)


def prepare_batch(trajectories: Sequence[Trajectory], *, version: int, config: TrainerConfig) -> TrainBatch:
    """Filter, score and lay out ``trajectories`` for a trainer at ``version``."""
    stats: dict[str, float] = {"num_trajectories": float(len(trajectories))}
    status = Counter(t.status for t in trajectories)
    for s in TrajectoryStatus:
        if s is not TrajectoryStatus.OK:
            stats[f"num_{s.value}"] = float(status.get(s, 0))
    ok = [t for t in trajectories if t.status is TrajectoryStatus.OK]
    fresh, stale = split_stale(ok, version, config.max_staleness)
    stats["num_stale"] = float(len(stale))
    if ok and not fresh:
        warnings.warn(
            f"every one of {len(ok)} trajectories is older than max_staleness={config.max_staleness} "
            f"versions behind the trainer (version {version}); the step has no data. Raise "
            "trainer.max_staleness or let fewer episodes run ahead of the trainer",
            RuntimeWarning, stacklevel=2,
        )
    kept = [t for t in fresh if t.num_sampled > 0 and len(t) > 1]
    stats["num_no_loss_tokens"] = float(len(fresh) - len(kept))
    stats["num_kept"] = float(len(kept))
    if not kept:
        if not ok:
            warnings.warn(f"no trajectory of {len(trajectories)} finished OK ({dict(status)}); "
                          "the step has no data", RuntimeWarning, stacklevel=2)
        return TrainBatch([], version, stats)

    adv, diag = compute_advantages([t.reward for t in kept], [t.group_id for t in kept], [t.episode_id for t in kept],
                                   [t.num_sampled for t in kept], config=config.advantages)
    stats.update({f"adv/{k}": v for k, v in diag.items()})
    if (diag["frac_groups_zero_std"] == 1.0 and config.advantages.kind not in ("reinforce_pp", "gae")
            and not config.distill.enabled):
        warnings.warn(
            f"all {int(diag['num_groups'])} groups got identical rewards within the group: every "
            "advantage is 0 and this step learns nothing. Check the reward function, or sample "
            "more answers per prompt", RuntimeWarning, stacklevel=2,
        )

    per_token = _token_advantages(kept, adv, config)
    stats.update({f"adv/{k}": v for k, v in per_token[1].items()})
    sequences = []
    first_unmasked = 0
    staleness = []
    reverse_kl_sum = 0.0
    for i, (t, a) in enumerate(zip(kept, adv.tolist(), strict=True)):
        mask = torch.tensor(t.loss_mask, dtype=torch.float32)
        if mask[0] > 0:
            first_unmasked += 1
            mask[0] = 0.0
        seq = {
            "input_ids": torch.tensor(t.input_ids, dtype=torch.long),
            "loss_mask": mask,
            "behaviour_logprobs": torch.tensor(t.logprobs, dtype=torch.float32) * mask,
            "advantages": mask * (a if per_token[0] is None else per_token[0][i]),
            "staleness": (version - torch.tensor(t.versions, dtype=torch.float32)) * mask,
        }
        if config.advantages.kind == "gae":  # the critic fills the advantages (agentrl.trainer.critic)
            seq["token_rewards"] = token_rewards(mask, a, t.turn_rewards, scale=config.advantages.reward_scale)
            seq["advantages"] = torch.zeros_like(mask)
        if config.distill.enabled:  # the teacher's log-probabilities, and the advantages of distill.mode
            reverse_kl_sum += distill_sequence(seq, t.teacher_logprobs, config.distill)
        sequences.append(seq)
        staleness.append(version - t.oldest_version)
    stats["first_token_unmasked"] = float(first_unmasked)
    stats["staleness_mean"] = sum(staleness) / len(staleness)
    stats["staleness_max"] = float(max(staleness))
    stats["reward_raw_mean"] = sum(t.reward for t in kept) / len(kept)
    stats["seq_len_mean"] = sum(len(t) for t in kept) / len(kept)
    batch = TrainBatch(sequences, version, stats, list(kept))
    stats["num_loss_tokens"] = float(batch.num_loss_tokens)
    if config.distill.enabled and stats["num_loss_tokens"]:  # k_t = log π_behav - log π_teacher, token mean
        stats["distill_reverse_kl"] = reverse_kl_sum / stats["num_loss_tokens"]
    if stats["num_loss_tokens"] == 0:  # every sampled token was a first token
        return TrainBatch([], version, stats)
    return batch
