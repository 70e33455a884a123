"""Engine–trainer mismatch: importance weights between the engine's and the trainer's log-probabilities.

What it is: ``mismatch_weights`` — a pure function from the behaviour log-probabilities the
inference engine reported (π_behav) and the trainer's no-grad recomputation of the same tokens
before the update (π_prox) to a detached weight per token, with its diagnostics. The two differ
even at the same weights (other kernels, other precision, batch-variant reductions: Yao et al.
2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"), and more
when the sample is stale. What it is not: the objective (``agentrl.trainer.losses``, which
multiplies its token losses by these weights) or the staleness bound (``agentrl.trainer.staleness``).

With ``ρ_t = π_prox(t) / π_behav(t)`` on loss tokens (``level: sequence``: ``ρ_i = Π_t ρ_t`` over
sequence i's loss tokens, the same for each of them)::

    tis   w = min(ρ, C)                                 truncated IS (Yao et al. 2025)
    mis   w = ρ where L <= ρ <= C, else 0 (masked out)  masked IS (AReaL's / verl's rollout correction)

Shapes: [T] tensors (a packed row); ``segment_ids`` [T] long (0 .. S-1), needed for the sequence
level. Diagnostics, normalised like the losses' (a sum over the mini-batch's ``N_global`` loss
tokens; ``_max`` keys reduce with max): ``mismatch/masked_frac`` (the share of loss tokens with
weight 0), ``mismatch/truncated_frac`` (tis: the share whose ρ was above C),
``mismatch/weight_mean`` and ``mismatch/weight_sq_mean`` (the actor turns them into
``mismatch/weight_std``, the weights' spread), ``mismatch/weight_max``.

The gap apart from staleness: ``mismatch_gap`` measures mean |log ρ_t| over all loss tokens
(``mismatch/log_ratio_abs_mean``) and over the *fresh* ones, sampled by the very weights π_prox
was computed with (staleness 0), where ρ is the engine–trainer mismatch alone:
``mismatch/fresh_frac`` (their share) and ``mismatch/fresh_log_ratio_abs_sum`` (their Σ|log ρ|
over N_global; the actor divides the two into ``mismatch/fresh_log_ratio_abs_mean``). The actor
logs them on every run whose π_prox is a recomputation before the update, correction on or off.

Main hooks: ``mismatch_weights(prox, behav, mask, segment_ids, config=MismatchConfig(mode="tis"),
total_loss_tokens=N)``, ``mismatch_gap(prox, behav, mask, staleness, total_loss_tokens=N)``.
"""

from __future__ import annotations

import torch

from agentrl.trainer.losses import segment_sum
from agentrl.trainer.trainer_config import MismatchConfig


def mismatch_weights(
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    segment_ids: torch.Tensor | None,
    *,
    config: MismatchConfig,
    total_loss_tokens: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The weights ``w`` [T] (detached, 0 off the loss mask and where ``mis`` masks) and the
    diagnostics of the module docstring. ``config.mode`` must be ``tis`` or ``mis``."""
    if config.mode not in ("tis", "mis"):
        raise ValueError(f"mismatch mode must be tis or mis to compute weights, got {config.mode!r}")
    if proximal_logprobs.shape != behaviour_logprobs.shape or loss_mask.shape != behaviour_logprobs.shape:
        raise ValueError("mismatch_weights: the log-probabilities and the mask must share one shape")
    mask = loss_mask.detach().to(torch.float64)
    log_rho = (proximal_logprobs.detach().to(torch.float64) - behaviour_logprobs.detach().to(torch.float64)) * mask
    if config.level == "sequence":
        if segment_ids is None:
            raise ValueError("mismatch level sequence needs segment_ids")
        log_rho = segment_sum(log_rho, segment_ids)[segment_ids] * mask
    rho = torch.exp(log_rho.clamp(-30.0, 30.0))
    if config.mode == "tis":
        w = rho.clamp(max=config.upper) * mask
        truncated = (rho > config.upper) & (mask > 0)
    else:
        keep = (rho >= config.lower) & (rho <= config.upper)
        w = rho * keep.to(mask.dtype) * mask
        truncated = torch.zeros_like(keep)
    on = mask > 0
    n = total_loss_tokens
    stats = {
        "mismatch/masked_frac": ((w == 0) & on).to(mask.dtype).sum() / n,
        "mismatch/truncated_frac": truncated.to(mask.dtype).sum() / n,
        "mismatch/weight_mean": w.sum() / n,
        "mismatch/weight_sq_mean": (w * w).sum() / n,
        "mismatch/weight_max": w.max() if w.numel() else torch.zeros((), dtype=w.dtype),
    }
    return w.to(proximal_logprobs.dtype), {k: v.float() for k, v in stats.items()}


def mismatch_gap(
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    staleness: torch.Tensor,
    *,
    total_loss_tokens: float,
) -> dict[str, torch.Tensor]:
    """The behaviour–trainer gap of the module docstring, over all loss tokens and over the
    fresh ones (``staleness`` [T]: versions behind, 0 = sampled by π_prox's weights)."""
    mask = loss_mask.detach().to(torch.float64)
    gap = ((proximal_logprobs.detach().to(torch.float64) - behaviour_logprobs.detach().to(torch.float64)) * mask).abs()
    fresh = mask * (staleness.detach() == 0).to(mask.dtype)
    n = total_loss_tokens
    stats = {
        "mismatch/log_ratio_abs_mean": gap.sum() / n,
        "mismatch/fresh_frac": fresh.sum() / n,
        "mismatch/fresh_log_ratio_abs_sum": (gap * fresh).sum() / n,
    }
    return {k: v.float() for k, v in stats.items()}
