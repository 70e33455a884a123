"""Advantages: how much better one sampled answer was than its siblings.

What it is: pure functions from per-trajectory rewards to per-trajectory advantages —
reward shaping (scale, bias, clip), group-relative advantages (GRPO: reward minus the mean of
the n samples of the same prompt, optionally divided by their std) and an optional batch
normalization weighted by loss tokens — each returning detached diagnostics. What it is not:
the loss (``agentrl.trainer.losses``) or batch assembly (``agentrl.trainer.batch``).

Main hook: ``grpo_advantages(rewards, group_ids, episode_ids)``.

References: Shao et al. 2024, "DeepSeekMath" (GRPO, arXiv:2402.03300); Liu et al. 2025,
"Understanding R1-Zero-Like Training" (Dr. GRPO: dropping the std division).

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
    n = r.numel()
    if len(group_ids) != n or (episode_ids is not None and len(episode_ids) != n):
        raise ValueError(
            f"grpo_advantages: rewards, group_ids and episode_ids must have equal length, got "
            f"{n}, {len(group_ids)}, {None if episode_ids is None else len(episode_ids)}"
        )
    if n == 0:
        return torch.zeros(0), {"num_groups": 0.0, "num_episodes": 0.0, "frac_groups_zero_std": 0.0,
                                "reward_mean": 0.0, "reward_std": 0.0, "adv_abs_mean": 0.0}
    # episode key per trajectory: (group, episode id) or a unique key when the id is empty
    ep_key = [
        (g, e) if e else (g, f"#{i}")
        for i, (g, e) in enumerate(zip(group_ids, episode_ids or [""] * n, strict=True))
    ]
    episodes: dict[tuple[str, str], list[int]] = {}
    for i, k in enumerate(ep_key):
        episodes.setdefault(k, []).append(i)
    ep_reward = {k: float(r[idx].mean()) for k, idx in episodes.items()}
    groups: dict[str, list[float]] = {}
    for (g, _), rew in ep_reward.items():
        groups.setdefault(g, []).append(rew)
    stats = {}
    zero_std = 0
    for g, vals in groups.items():
        t = torch.tensor(vals, dtype=torch.float64)
        mean, std = t.mean(), t.std(unbiased=False)
        stats[g] = (float(mean), float(std))
        zero_std += int(float(t.max() - t.min()) == 0.0)
    adv = torch.empty(n, dtype=torch.float64)
    for i, k in enumerate(ep_key):
        mean, std = stats[k[0]]
        a = ep_reward[k] - mean
        adv[i] = a / (std + eps) if std_normalize else a
    all_ep = torch.tensor(list(ep_reward.values()), dtype=torch.float64)
    diag = {
        "num_groups": float(len(groups)),
        "num_episodes": float(len(ep_reward)),
        "frac_groups_zero_std": zero_std / len(groups),
        "reward_mean": float(all_ep.mean()),
        "reward_std": float(all_ep.std(unbiased=False)),
        "adv_abs_mean": float(adv.abs().mean()),
    }
    return adv.float(), diag


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
