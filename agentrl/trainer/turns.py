"""Turn-level advantages for multi-turn episodes: GiGPO's step groups (pure functions).

What it is: ``trainer.advantages.kind: turn`` — each turn of a trajectory (a run of sampled
tokens, ``agentrl.api.sampled_spans``) gets an advantage of its own: the episode's group-relative
advantage plus ω = ``turn_weight`` times a step advantage that compares the turn with the turns of
the same group that acted in an equal state. What it is not: the token-level critic
(``agentrl.trainer.gae``, ``agentrl.trainer.critic``) or the episode estimators
(``agentrl.trainer.advantages``, whose ``group_norm`` gives the episode part).

Main hook: ``turn_advantages(trajectories, episode_advantages, shaped_rewards, config)``.

GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training",
arXiv:2505.10978), for the K turns of one trajectory with per-turn rewards r_1..r_K (the
trajectory's ``turn_rewards`` scaled by ``reward_scale``, what is left of the shaped episode
reward R added to r_K, so Σ r_k = R; without ``turn_rewards``: r_K = R and the others 0)::

    G_k      = Σ_{j>=k} γ^{j-k} r_j                 the discounted return from turn k
    A^S_k    = (G_k - mean G) / (std G + eps)        over the step group of turn k
    A_k      = A^E + ω · A^S_k                       A^E: the episode's group_norm advantage

A step group is every turn of the same prompt group (``group_id``) whose ``turn_states`` key is
equal: GiGPO's anchor states (the same observation reached by several samples of one task). A
turn without a key, or alone with its key, is its own step group and gets A^S = 0 — so with no
state keys the estimator is ``group_norm``; with ω = 0 too. Every token of turn k gets A_k.

What it needs from an env: nothing, to run (it then equals group_norm); per-turn rewards for
credit within an episode (``Trajectory.turn_rewards``: the built-in multi-turn workflows set them
to each step's env reward, ``agentrl.rollout.conversation``); a state key per turn
(``Trajectory.turn_states``: e.g. a hash of the observation the turn answered) for step groups.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from agentrl.api import Trajectory, sampled_spans
from agentrl.trainer.gae import token_rewards
from agentrl.trainer.trainer_config import AdvantageConfig


def per_turn_rewards(loss_mask: Sequence[int], reward: float, turn_rewards: Sequence[float] | None,
                     *, scale: float = 1.0) -> list[float]:
    """r_1..r_K of the module docstring: the token rewards (``token_rewards``) of each turn's last token."""
    tok = token_rewards(torch.as_tensor(loss_mask), reward, turn_rewards, scale=scale)
    return [float(tok[end - 1]) for _, end in sampled_spans(loss_mask)]


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """G_k = Σ_{j>=k} γ^{j-k} r_j; [K] -> [K]."""
    out, carry = [0.0] * len(rewards), 0.0
    for k in range(len(rewards) - 1, -1, -1):
        carry = rewards[k] + gamma * carry
        out[k] = carry
    return out


def step_advantages(returns: Sequence[Sequence[float]], states: Sequence[Sequence[str] | None],
                    group_ids: Sequence[str], *, eps: float = 1e-6) -> tuple[list[list[float]], dict[str, float]]:
    """A^S of every turn: its return normalised within its step group (module docstring).

    Args:
        returns: per trajectory, [K_i] the turns' returns G.
        states: per trajectory, [K_i] the turns' state keys, or None (no turn shares a state).
        group_ids: [N] each trajectory's prompt group.
    Returns:
        per trajectory [K_i] step advantages, and diagnostics: ``step_groups`` (groups of two
        turns or more), ``turns_grouped_frac`` (the share of turns in one), ``step_adv_abs_mean``.
    """
    if not len(returns) == len(states) == len(group_ids):
        raise ValueError(f"step_advantages: {len(returns)} returns, {len(states)} states, {len(group_ids)} groups")
    members: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for i, (keys, g) in enumerate(zip(states, group_ids, strict=True)):
        if keys is None:
            continue
        if len(keys) != len(returns[i]):
            raise ValueError(f"step_advantages: trajectory {i} has {len(returns[i])} turns and {len(keys)} states")
        for k, key in enumerate(keys):
            members.setdefault((g, key), []).append((i, k))
    out = [[0.0] * len(r) for r in returns]
    grouped = 0
    for cell in members.values():
        if len(cell) < 2:
            continue
        grouped += len(cell)
        g = [returns[i][k] for i, k in cell]
        mean = sum(g) / len(g)
        std = math.sqrt(sum((x - mean) ** 2 for x in g) / len(g))
        for (i, k), x in zip(cell, g, strict=True):
            out[i][k] = (x - mean) / (std + eps)
    n_turns = sum(len(r) for r in returns)
    flat = [abs(a) for row in out for a in row]
    return out, {"step_groups": float(sum(len(c) > 1 for c in members.values())),
                 "turns_grouped_frac": grouped / n_turns if n_turns else 0.0,
                 "step_adv_abs_mean": sum(flat) / len(flat) if flat else 0.0}


def turn_advantages(trajectories: Sequence[Trajectory], episode_advantages: Sequence[float],
                    shaped_rewards: Sequence[float], config: AdvantageConfig,
                    ) -> tuple[list[torch.Tensor], dict[str, float]]:
    """A_k = A^E + ω · A^S_k spread over each turn's tokens; per trajectory a [T] float32 tensor
    (0 outside the loss mask), and the diagnostics of ``step_advantages``."""
    returns, states = [], []
    for t, r in zip(trajectories, shaped_rewards, strict=True):
        rewards = per_turn_rewards(t.loss_mask, r, t.turn_rewards, scale=config.reward_scale)
        returns.append(discounted_returns(rewards, config.gamma))
        states.append(t.turn_states)
    step, diag = step_advantages(returns, states, [t.group_id for t in trajectories])
    out = []
    for t, a_ep, a_step in zip(trajectories, episode_advantages, step, strict=True):
        adv = torch.zeros(len(t), dtype=torch.float32)
        for (start, end), a in zip(sampled_spans(t.loss_mask), a_step, strict=True):
            adv[start:end] = a_ep + config.turn_weight * a
        out.append(adv)
    return out, diag
