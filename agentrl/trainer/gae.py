"""GAE: token advantages from a value model, and the value model's clipped loss (pure functions).

What it is: the arithmetic of ``trainer.advantages.kind: gae`` — where a trajectory's rewards sit
among its tokens (``token_rewards``), generalized advantage estimation over its loss tokens
(``gae``) and PPO's clipped value loss (``value_loss``). What it is not: the value model itself or
its training loop (``agentrl.trainer.critic``), nor the group estimators (``agentrl.trainer.advantages``).

Main hook: ``gae(rewards, values, mask, gamma=γ, lam=λ) -> (advantages, returns)``.

GAE (Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
Estimation", arXiv:1506.02438), over the loss tokens t = 1..L of one sequence in order, the state
before token t being the prefix that predicts it, V_{L+1} = 0 (the episode ends after its last
sampled token)::

    δ_t = r_t + γ V_{t+1} - V_t
    A_t = δ_t + γλ A_{t+1}           (A_{L+1} = 0)
    R_t = A_t + V_t                   the value target (the λ-return)

λ = 1, γ = 1: A_t = Σ_{k>=t} r_k - V_t, the return minus the value; λ = 0: A_t = δ_t, TD(0).
Tokens outside the loss mask (the prompt, the environment's replies between turns) are neither
steps nor rewards: the turns of a multi-turn episode are chained as one sequence of actions.

The value loss (PPO, Schulman et al. 2017, arXiv:1707.06347; the clip as in OpenAI's baselines),
with V_old the values GAE used and ε = ``clip``::

    L_V = ½ · max((V - R)², (clip(V, V_old - ε, V_old + ε) - R)²)

weighted per token like the policy loss (``token_weights``: 1 / the mini-batch's loss tokens for
a token mean), so its sum over the micro-batches is the mini-batch's mean.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentrl.api import sampled_spans


def token_rewards(loss_mask: torch.Tensor, reward: float, turn_rewards: Sequence[float] | None = None,
                  *, scale: float = 1.0) -> torch.Tensor:
    """Where a trajectory's reward sits among its tokens; [T] -> [T] (float32).

    Without ``turn_rewards``: ``reward`` on the last loss token. With them (one per turn, a run of
    loss tokens): ``scale · turn_rewards[k]`` on turn k's last token, and what is left of
    ``reward`` (``reward - scale · Σ turn_rewards``) on the last one, so the token rewards always
    sum to ``reward`` (the shaped episode reward) and the turn rewards say how it splits."""
    out = torch.zeros(loss_mask.shape[-1], dtype=torch.float32)
    spans = sampled_spans([int(m) for m in loss_mask.tolist()])
    if not spans:
        return out
    rest = float(reward)
    if turn_rewards is not None:
        if len(turn_rewards) != len(spans):
            raise ValueError(f"token_rewards: {len(turn_rewards)} turn rewards for {len(spans)} turns")
        for (_, end), r in zip(spans, turn_rewards, strict=True):
            out[end - 1] += scale * r
            rest -= scale * r
    out[spans[-1][1] - 1] += rest
    return out


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float = 1.0,
        lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over one sequence's loss tokens (the module docstring).

    Args:
        rewards: [T] the reward after each token (``token_rewards``); read on loss tokens only.
        values: [T] V of the state before each token (the value model at the predicting position).
        mask: [T] 1 on loss tokens (the steps), 0 elsewhere.
        gamma, lam: γ and λ in [0, 1].
    Returns:
        (advantages [T], returns [T]) float32, 0 outside the mask.
    """
    if not (rewards.shape == values.shape == mask.shape and rewards.dim() == 1):
        raise ValueError(f"gae: rewards, values and mask must be equal 1-D shapes, got "
                         f"{tuple(rewards.shape)}, {tuple(values.shape)}, {tuple(mask.shape)}")
    steps = (mask > 0).nonzero()[:, 0]
    r = rewards[steps].double().tolist()
    v = values[steps].detach().double().tolist()
    adv = [0.0] * len(steps)
    carry, next_v = 0.0, 0.0
    for t in range(len(steps) - 1, -1, -1):
        delta = r[t] + gamma * next_v - v[t]
        carry = delta + gamma * lam * carry
        adv[t], next_v = carry, v[t]
    a = torch.zeros(mask.shape, dtype=torch.float64)
    a[steps] = torch.tensor(adv, dtype=torch.float64)
    ret = torch.zeros(mask.shape, dtype=torch.float64)
    ret[steps] = a[steps] + torch.tensor(v, dtype=torch.float64)
    return a.float(), ret.float()


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               token_weights: torch.Tensor, *, clip: float | None = 0.2) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped value loss (the module docstring), summed with ``token_weights``.

    Args:
        values: [T] the value model's outputs (with grad).
        old_values: [T] the values GAE used (no grad).
        returns: [T] the targets R_t.
        mask: [T] 1 on loss tokens.
        token_weights: [T] each token's share of the mini-batch (1 / its loss tokens for a token mean).
        clip: ε, or None for the plain squared error.
    Returns:
        the loss (a scalar) and detached diagnostics summed with the same weights: ``value_loss``,
        ``value_clip_frac`` (the tokens whose clipped error was the larger), ``value_mean``,
        ``return_mean``, ``value_error_abs`` (|V - R|).
    """
    w = token_weights * mask
    err = (values - returns) ** 2
    clipped_frac = torch.zeros_like(err)
    if clip is not None:
        v_clip = old_values + (values - old_values).clamp(-clip, clip)
        err_clip = (v_clip - returns) ** 2
        clipped_frac = (err_clip > err).float()
        err = torch.maximum(err, err_clip)
    loss = 0.5 * (err * w).sum()
    with torch.no_grad():
        stats = {"value_loss": loss.detach(), "value_clip_frac": (clipped_frac * w).sum(),
                 "value_mean": (values.detach() * w).sum(), "return_mean": (returns * w).sum(),
                 "value_error_abs": ((values.detach() - returns).abs() * w).sum()}
    return loss, stats
