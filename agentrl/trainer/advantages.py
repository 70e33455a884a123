"""Advantages: how much better one sampled answer was than its siblings.

What it is: pure functions from per-trajectory rewards to per-trajectory advantages —
reward shaping (scale, bias, clip, DAPO's overlong penalty), the estimators that
``trainer.advantages.kind`` names and an optional batch normalization weighted by loss
tokens — each returning detached diagnostics. What it is not: the loss
(``agentrl.trainer.losses``) or batch assembly (``agentrl.trainer.batch``).

Main hook: ``compute_advantages(rewards, group_ids, episode_ids, num_tokens, config=...)``.

The estimators, for a group of k episodes with rewards R_1..R_k:

    group_norm    A_i = (R_i - mean R) / (std R + eps)       GRPO (Shao et al. 2024, "DeepSeekMath",
                                                             arXiv:2402.03300); without the std
                                                             division: Dr. GRPO (Liu et al. 2025,
                                                             arXiv:2503.20783)
    rloo          A_i = R_i - mean_{j≠i} R_j                 RLOO (Kool et al. 2019; Ahmadian et al.
                        = k/(k-1) · (R_i - mean R)           2024, "Back to Basics", arXiv:2402.14740)
    reinforce_pp  A_i = (R_i - μ_B) / (σ_B + eps)            REINFORCE++ (Hu 2025, arXiv:2501.03262):
                                                             no group baseline; μ_B, σ_B over the
                                                             whole batch's loss tokens

So RLOO is group_norm without the std division times k/(k-1): twice it on groups of two, where
it is R_i - R_j. A group of one gets advantage 0 from group_norm and rloo.

DAPO's overlong penalty (Yu et al. 2025, "DAPO", arXiv:2503.14476, eq. 13) is a reward term of
the trajectory's sampled-token count |y|, with L_max = ``overlong_max_tokens`` and L_cache =
``overlong_buffer_tokens``: 0 while |y| <= L_max - L_cache, then falling linearly to -1 at
L_max, and -1 past it; scaled by ``overlong_penalty``, added before the reward shaping.

Groups and episodes. A group is every trajectory with the same ``group_id`` (the n samples of
one prompt). An episode that was split into several trajectories (a template that rewrites
history) must count once, so group statistics are taken over *episodes*: trajectories that
share a non-empty ``episode_id`` are averaged into one episode reward first, and every
trajectory of that episode then gets the episode's advantage. An empty ``episode_id`` makes a
trajectory its own episode.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentrl.trainer.trainer_config import ADVANTAGE_KINDS, AdvantageConfig


def shape_rewards(
    rewards: Sequence[float] | torch.Tensor,
    *,
    scale: float = 1.0,
    bias: float = 0.0,
    clip: float | None = None,
) -> torch.Tensor:
    """``clamp((r + bias) * scale, -clip, clip)``; shape [N] -> [N] (float32)."""
    r = torch.as_tensor(rewards, dtype=torch.float32)
    out = (r + bias) * scale
    if clip is not None:
        if clip <= 0:
            raise ValueError(f"reward clip must be > 0 or None, got {clip}")
        out = out.clamp(-clip, clip)
    return out


def overlong_penalty(num_tokens: Sequence[int] | torch.Tensor, *, max_tokens: int, buffer_tokens: int,
                     penalty: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment of the module docstring; shape [N] -> [N] (float32, <= 0)."""
    if not 0 <= buffer_tokens < max_tokens:
        raise ValueError(f"overlong penalty: need 0 <= buffer_tokens < max_tokens, got {buffer_tokens}, {max_tokens}")
    n = torch.as_tensor(num_tokens, dtype=torch.float64)
    start = max_tokens - buffer_tokens
    soft = (start - n) / buffer_tokens if buffer_tokens else torch.zeros_like(n)
    out = torch.where(n <= start, torch.zeros_like(n), torch.where(n <= max_tokens, soft, -torch.ones_like(n)))
    return (out * penalty).float()


def _episodes(rewards: torch.Tensor, group_ids: Sequence[str], episode_ids: Sequence[str] | None,
              ) -> tuple[list[tuple[str, str]], dict[tuple[str, str], float], dict[str, list[float]]]:
    """(each trajectory's episode key, each episode's mean reward, each group's episode rewards)."""
    n = rewards.numel()
    if len(group_ids) != n or (episode_ids is not None and len(episode_ids) != n):
        raise ValueError(
            f"advantages: rewards, group_ids and episode_ids must have equal length, got "
            f"{n}, {len(group_ids)}, {None if episode_ids is None else len(episode_ids)}"
        )
    # episode key per trajectory: (group, episode id) or a unique key when the id is empty
    ep_key = [
        (g, e) if e else (g, f"#{i}")
        for i, (g, e) in enumerate(zip(group_ids, episode_ids or [""] * n, strict=True))
    ]
    members: dict[tuple[str, str], list[int]] = {}
    for i, k in enumerate(ep_key):
        members.setdefault(k, []).append(i)
    ep_reward = {k: float(rewards[idx].mean()) for k, idx in members.items()}
    groups: dict[str, list[float]] = {}
    for (g, _), rew in ep_reward.items():
        groups.setdefault(g, []).append(rew)
    return ep_key, ep_reward, groups


def _diagnostics(adv: torch.Tensor, ep_reward: dict, groups: dict[str, list[float]]) -> dict[str, float]:
    all_ep = torch.tensor(list(ep_reward.values()), dtype=torch.float64)
    return {
        "num_groups": float(len(groups)),
        "num_episodes": float(len(ep_reward)),
        "frac_groups_zero_std": sum(max(v) == min(v) for v in groups.values()) / len(groups),
        "reward_mean": float(all_ep.mean()),
        "reward_std": float(all_ep.std(unbiased=False)),
        "adv_abs_mean": float(adv.abs().mean()),
    }


_EMPTY = {"num_groups": 0.0, "num_episodes": 0.0, "frac_groups_zero_std": 0.0, "reward_mean": 0.0,
          "reward_std": 0.0, "adv_abs_mean": 0.0}


def grpo_advantages(
    rewards: Sequence[float] | torch.Tensor,
    group_ids: Sequence[str],
    episode_ids: Sequence[str] | None = None,
    *,
    std_normalize: bool = True,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Group-relative advantages.

    For each group g with episode rewards R_1..R_k (k episodes):
    ``A_i = R_i - mean(R)`` and, with ``std_normalize``, ``A_i / (std(R) + eps)`` where std is
    the population std (so a group of one gets advantage 0, not NaN).

    Args:
        rewards: [N] one reward per trajectory.
        group_ids: [N] the prompt group of each trajectory.
        episode_ids: [N] or None; trajectories sharing a non-empty id are one episode.
    Returns:
        advantages [N] (float32) and diagnostics: ``num_groups``, ``num_episodes``,
        ``frac_groups_zero_std`` (groups whose episodes all got the same reward: no signal),
        ``reward_mean``, ``reward_std`` (over episodes), ``adv_abs_mean`` (over trajectories).
    """
    r = torch.as_tensor(rewards, dtype=torch.float64)
    if r.numel() == 0:
        _episodes(r, group_ids, episode_ids)
        return torch.zeros(0), dict(_EMPTY)
    ep_key, ep_reward, groups = _episodes(r, group_ids, episode_ids)
    stats = {}
    for g, vals in groups.items():
        t = torch.tensor(vals, dtype=torch.float64)
        stats[g] = (float(t.mean()), float(t.std(unbiased=False)))
    adv = torch.empty(r.numel(), dtype=torch.float64)
    for i, k in enumerate(ep_key):
        mean, std = stats[k[0]]
        a = ep_reward[k] - mean
        adv[i] = a / (std + eps) if std_normalize else a
    return adv.float(), _diagnostics(adv, ep_reward, groups)


def rloo_advantages(
    rewards: Sequence[float] | torch.Tensor,
    group_ids: Sequence[str],
    episode_ids: Sequence[str] | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Leave-one-out: each episode's reward minus the mean of the *other* episodes of its group
    (0 for a group of one); episodes and diagnostics as in ``grpo_advantages``. Shapes [N] -> [N]."""
    r = torch.as_tensor(rewards, dtype=torch.float64)
    if r.numel() == 0:
        _episodes(r, group_ids, episode_ids)
        return torch.zeros(0), dict(_EMPTY)
    ep_key, ep_reward, groups = _episodes(r, group_ids, episode_ids)
    sums = {g: (sum(v), len(v)) for g, v in groups.items()}
    adv = torch.empty(r.numel(), dtype=torch.float64)
    for i, k in enumerate(ep_key):
        total, count = sums[k[0]]
        adv[i] = ep_reward[k] - (total - ep_reward[k]) / (count - 1) if count > 1 else 0.0
    return adv.float(), _diagnostics(adv, ep_reward, groups)


def reinforce_pp_advantages(
    rewards: Sequence[float] | torch.Tensor,
    group_ids: Sequence[str],
    episode_ids: Sequence[str] | None,
    num_tokens: Sequence[int] | torch.Tensor,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE++: the episode reward, normalised over the batch's loss tokens
    (``normalize_advantages``); no group baseline. Shapes [N], [N] -> [N]."""
    r = torch.as_tensor(rewards, dtype=torch.float64)
    if r.numel() == 0:
        _episodes(r, group_ids, episode_ids)
        return torch.zeros(0), dict(_EMPTY)
    ep_key, ep_reward, groups = _episodes(r, group_ids, episode_ids)
    per_traj = torch.tensor([ep_reward[k] for k in ep_key], dtype=torch.float64)
    adv = normalize_advantages(per_traj, num_tokens, eps=eps)
    return adv.float(), _diagnostics(adv, ep_reward, groups)


def normalize_advantages(
    advantages: torch.Tensor, num_tokens: Sequence[int] | torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """Batch normalization of per-trajectory advantages, weighted by loss tokens.

    The loss is a token mean, so the mean and std are taken over loss tokens: trajectory i
    counts ``num_tokens[i]`` times. Shapes [N], [N] -> [N]. Trajectories with no loss tokens
    do not influence the statistics.
    """
    a = advantages.to(torch.float64)
    w = torch.as_tensor(num_tokens, dtype=torch.float64)
    total = float(w.sum())
    if total == 0:
        return advantages.clone()
    mean = (a * w).sum() / total
    var = ((a - mean) ** 2 * w).sum() / total
    return ((a - mean) / (var.sqrt() + eps)).to(advantages.dtype)


def shaped_rewards(rewards: Sequence[float] | torch.Tensor, num_tokens: Sequence[int], *,
                   config: AdvantageConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """The rewards the estimators see: the overlong penalty added, then ``shape_rewards``; [N] -> [N]
    and the penalty's diagnostics (``overlong_frac``, ``overlong_penalty_mean``) when it is on."""
    raw = torch.as_tensor(rewards, dtype=torch.float32)
    diag: dict[str, float] = {}
    if config.overlong_max_tokens is not None:
        pen = overlong_penalty(num_tokens, max_tokens=config.overlong_max_tokens,
                               buffer_tokens=config.overlong_buffer_tokens, penalty=config.overlong_penalty)
        raw = raw + pen
        diag["overlong_frac"] = float((pen < 0).float().mean()) if pen.numel() else 0.0
        diag["overlong_penalty_mean"] = float(pen.mean()) if pen.numel() else 0.0
    return shape_rewards(raw, scale=config.reward_scale, bias=config.reward_bias, clip=config.reward_clip), diag


def compute_advantages(
    rewards: Sequence[float] | torch.Tensor,
    group_ids: Sequence[str],
    episode_ids: Sequence[str] | None,
    num_tokens: Sequence[int],
    *,
    config: AdvantageConfig,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``trainer.advantages`` end to end: the overlong penalty, the shaping, the estimator
    ``config.kind``, then the batch normalization; shapes [N] -> [N]. ``num_tokens`` are the
    trajectories' sampled tokens (the overlong penalty's length, the normalizations' weights).
    ``turn``: the episode part, group_norm's (``agentrl.trainer.turns`` adds the turns'); ``gae``:
    the shaped rewards themselves, which the critic turns into token advantages
    (``agentrl.trainer.critic``, which also normalizes them), with group_norm's diagnostics."""
    r, diag = shaped_rewards(rewards, num_tokens, config=config)
    if config.kind == "rloo":
        adv, d = rloo_advantages(r, group_ids, episode_ids)
    elif config.kind == "reinforce_pp":
        adv, d = reinforce_pp_advantages(r, group_ids, episode_ids, num_tokens)
    elif config.kind in ("group_norm", "turn", "gae"):
        adv, d = grpo_advantages(r, group_ids, episode_ids, std_normalize=config.std_normalize)
        if config.kind == "gae":
            return r, {**d, **diag}
    else:
        raise ValueError(f"advantage kind must be one of {list(ADVANTAGE_KINDS)}, got {config.kind!r}")
    if config.batch_normalize:
        adv = normalize_advantages(adv, num_tokens)
    return adv, {**d, **diag}
