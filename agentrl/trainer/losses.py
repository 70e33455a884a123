"""Policy losses: decoupled PPO, and plain PPO and REINFORCE as its special cases.

What it is: pure functions from token-level log-probabilities, advantages and masks to a
scalar loss plus detached diagnostics. What it is not: the forward pass (``agentrl.trainer.actor``)
or the advantages (``agentrl.trainer.advantages``). Main hook: ``policy_loss(kind, ...)``.

The decoupled PPO objective (Hilton, Cobbe & Schulman 2022, "Batch size-invariance for
policy optimization", arXiv:2110.00641; used for asynchronous RL by Fu et al. 2025, "AReaL",
arXiv:2505.24298) separates the policy that *sampled* a token (behaviour, π_behav: whatever
weights the inference server held, possibly several versions old) from the anchor of the
trust region (proximal, π_prox: the trainer's weights just before this update). Per loss
token t, with advantage A_t::

    w_t = π_prox / π_behav                       importance weight, detached; tokens with
                                                 w_t > cap are masked out of the loss
    r_t = π_θ / π_prox                           the ratio the trust region clips
    l_t = -w_t · min(r_t·A_t, clip(r_t, 1-ε_low, 1+ε_high)·A_t)
    loss = Σ_t m_t·l_t / N_global                (+ β · Σ_t m_t·KL_t / N_global)

``N_global`` is the number of loss tokens of the whole *global* batch (all micro-batches, all
ranks), passed in by the caller: every micro-batch's loss is then a share of one token-mean,
and the sum over micro-batches and ranks does not depend on how the batch was split.

Settings: ``ppo`` is the same with π_prox = π_behav (so w = 1); ``reinforce`` is
``-A_t · log π_θ`` (no ratio, no clipping; on-policy). The optional KL penalty against a
frozen reference model uses the k3 estimator ``exp(q) - q - 1`` with ``q = log π_ref - log π_θ``
(Schulman 2020, "Approximating KL divergence"), which is >= 0 and unbiased for KL(π_θ‖π_ref).

Shapes: every tensor argument has the same shape (any, typically [T] for a packed row).
``loss_mask`` is 1 on tokens the policy sampled and 0 elsewhere; masked positions may hold any
finite value. Diagnostics are detached float tensors; keys ending in ``_max`` reduce with max
across micro-batches/ranks, every other key is a sum already divided by ``N_global`` (so it
reduces with a sum into the global token mean).
"""

from __future__ import annotations

import torch

from agentrl.trainer.trainer_config import LOSS_KINDS, LossKind


def _check(total_loss_tokens: float, *tensors: torch.Tensor) -> None:
    if not total_loss_tokens > 0:
        raise ValueError(
            f"total_loss_tokens must be > 0 (the loss tokens of the global batch), got {total_loss_tokens}"
        )
    shape = tensors[0].shape
    for t in tensors[1:]:
        if t.shape != shape:
            raise ValueError(f"loss inputs must share one shape, got {tuple(shape)} and {tuple(t.shape)}")


def _kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    q = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return torch.exp(q) - q - 1.0


def decoupled_ppo_loss(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    total_loss_tokens: float,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    behaviour_weight_cap: float | None = 5.0,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The decoupled PPO loss of the module docstring; returns ``(loss, diagnostics)``.

    ``logprobs`` carries the gradient; the proximal and behaviour log-probabilities are
    treated as constants. ``behaviour_weight_cap=None`` keeps every token.
    """
    _check(total_loss_tokens, logprobs, proximal_logprobs, behaviour_logprobs, advantages, loss_mask)
    mask = loss_mask.to(logprobs.dtype)
    prox = proximal_logprobs.detach().to(logprobs.dtype)
    behav = behaviour_logprobs.detach().to(logprobs.dtype)
    adv = advantages.detach().to(logprobs.dtype)

    log_w = (prox - behav) * mask
    w = torch.exp(log_w.clamp(max=30.0))
    if behaviour_weight_cap is not None:
        capped = (w > behaviour_weight_cap) & (mask > 0)
        keep = mask * (~capped).to(mask.dtype)
    else:
        capped = torch.zeros_like(mask, dtype=torch.bool)
        keep = mask

    log_r = (logprobs - prox) * mask
    ratio = torch.exp(log_r)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    per_token = -w * torch.minimum(unclipped, clipped)
    loss = (per_token * keep).sum() / total_loss_tokens

    stats: dict[str, torch.Tensor] = {}
    if ref_logprobs is not None and kl_coef != 0.0:
        kl = _kl_k3(logprobs, ref_logprobs.detach().to(logprobs.dtype))
        kl_term = (kl * mask).sum() / total_loss_tokens
        loss = loss + kl_coef * kl_term
        stats["kl_ref"] = kl_term.detach()

    with torch.no_grad():
        n = total_loss_tokens
        is_clipped = (unclipped != clipped) & (mask > 0)
        stats.update(
            policy_loss=(per_token * keep).sum() / n,
            clip_frac=(is_clipped.to(mask.dtype) * keep).sum() / n,
            capped_frac=capped.to(mask.dtype).sum() / n,
            behaviour_weight_mean=(w * mask).sum() / n,
            behaviour_weight_max=(w * mask).max() if mask.numel() else torch.zeros(()),
            # k3 estimate of KL(π_prox ‖ π_θ) ≈ how far this update moved the policy
            approx_kl=(_kl_k3(logprobs.detach(), prox) * mask).sum() / n,
            ratio_mean=(ratio * mask).sum() / n,
        )
    return loss, {k: v.detach().float() for k, v in stats.items()}


def reinforce_loss(
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    total_loss_tokens: float,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``Σ m_t · (-A_t · log π_θ(t)) / N_global`` (+ the KL penalty); on-policy REINFORCE."""
    _check(total_loss_tokens, logprobs, advantages, loss_mask)
    mask = loss_mask.to(logprobs.dtype)
    adv = advantages.detach().to(logprobs.dtype)
    pg = (-adv * logprobs * mask).sum() / total_loss_tokens
    loss = pg
    stats = {"policy_loss": pg.detach()}
    if ref_logprobs is not None and kl_coef != 0.0:
        kl_term = (_kl_k3(logprobs, ref_logprobs.detach().to(logprobs.dtype)) * mask).sum() / total_loss_tokens
        loss = loss + kl_coef * kl_term
        stats["kl_ref"] = kl_term.detach()
    return loss, {k: v.detach().float() for k, v in stats.items()}


def policy_loss(
    kind: LossKind,
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    total_loss_tokens: float,
    proximal_logprobs: torch.Tensor | None = None,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    behaviour_weight_cap: float | None = 5.0,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Dispatch on ``kind``: ``decoupled_ppo`` needs ``proximal_logprobs``; ``ppo`` uses the
    behaviour log-probabilities as the proximal ones; ``reinforce`` ignores both."""
    if kind == "decoupled_ppo":
        if proximal_logprobs is None:
            raise ValueError("decoupled_ppo needs proximal_logprobs (a no-grad forward pass before the update)")
        prox = proximal_logprobs
    elif kind == "ppo":
        prox = behaviour_logprobs
    elif kind == "reinforce":
        return reinforce_loss(logprobs, advantages, loss_mask, total_loss_tokens=total_loss_tokens,
                              ref_logprobs=ref_logprobs, kl_coef=kl_coef)
    else:
        raise ValueError(f"loss kind must be one of {list(LOSS_KINDS)}, got {kind!r}")
    return decoupled_ppo_loss(
        logprobs, prox, behaviour_logprobs, advantages, loss_mask,
        total_loss_tokens=total_loss_tokens, eps_low=eps_low, eps_high=eps_high,
        behaviour_weight_cap=behaviour_weight_cap if kind == "decoupled_ppo" else None,
        ref_logprobs=ref_logprobs, kl_coef=kl_coef,
    )
