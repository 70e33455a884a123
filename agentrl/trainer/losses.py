"""Policy losses: decoupled PPO with plain PPO and REINFORCE as its special cases, GSPO and CISPO.

What it is: pure functions from token-level log-probabilities, advantages and masks to a
scalar loss plus detached diagnostics, and the aggregation that turns token losses into one
number. What it is not: the forward pass (``agentrl.trainer.actor``), the advantages
(``agentrl.trainer.advantages``), the choice by name and the user's own objectives
(``agentrl.trainer.objective``) or the mismatch correction (``agentrl.trainer.mismatch``).
Main hook: ``policy_loss(kind, ...)``.

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

Aggregation (``token_weights``, from ``aggregation_weights``): ``loss = Σ_t a_t·l_t`` where
``a_t`` is ``m_t/N_global`` (token-mean, the default and the formula above), ``m_t/(n_i·S_global)``
(seq-mean-token-mean: the token mean of sequence i, averaged over the S_global sequences of the
batch) or ``m_t/S_global`` (seq-mean-token-sum: Liu et al. 2025, "Understanding R1-Zero-Like
Training", arXiv:2503.20783 — Dr. GRPO's form, in which a long answer's tokens weigh as much as
a short one's). ``n_i`` is sequence i's loss tokens; a sequence is never split across
micro-batches, so the micro-batch knows it.

GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071) clips one ratio
per sequence, the geometric mean of its tokens' ratios, ``s_i = exp(Σ_t m_t·log r_t / n_i)``::

    l_t = -w_t · min(s_i·A_t, clip(s_i, 1-ε_low, 1+ε_high)·A_t)       for every token t of i

With seq-mean-token-mean aggregation (and A_t = A_i, w = 1) this is the paper's objective
``-1/G Σ_i min(s_i·A_i, clip(s_i)·A_i)``; its gradient is GSPO-token's. The paper's clip range
is ε_low = 3e-4, ε_high = 4e-4 (a sequence ratio moves far less than a token's).

CISPO (MiniMax 2025, "MiniMax-M1", arXiv:2506.13585) clips the importance weight instead of the
update: ``l_t = -w_t · sg(clip(r_t, 1-ε_low, 1+ε_high)) · A_t · log π_θ(t)``, so a token whose
ratio left the range still has a gradient (PPO's clip zeroes it). At r = 1 its gradient is
REINFORCE's and PPO's. The paper sets no lower bound (ε_low near 1).

Settings: ``ppo`` is the same with π_prox = π_behav (so w = 1); ``reinforce`` is
``-A_t · log π_θ`` (no ratio, no clipping; on-policy). The optional KL penalty against a
frozen reference model uses the k3 estimator ``exp(q) - q - 1`` with ``q = log π_ref - log π_θ``
(Schulman 2020, "Approximating KL divergence"), which is >= 0 and unbiased for KL(π_θ‖π_ref).

Shapes: every tensor argument has the same shape (any, typically [T] for a packed row).
``loss_mask`` is 1 on tokens the policy sampled and 0 elsewhere; masked positions may hold any
finite value. ``segment_ids`` (long) says which packed sequence of the row a token belongs to
(0 .. S-1); GSPO and the sequence aggregations need it. ``w_t``, the behaviour weight, is
π_prox/π_behav masked above ``behaviour_weight_cap`` unless the caller passes its own
``behaviour_weights`` (the mismatch correction's, 0 where it masks). Diagnostics are detached
float tensors; keys ending in ``_max`` reduce with max across micro-batches/ranks, every other
key is a sum already divided by ``N_global`` (so it reduces with a sum into the global token
mean; ``policy_loss`` is the loss's own share, whatever the aggregation).
"""

from __future__ import annotations

import torch

from agentrl.trainer.trainer_config import LOSS_KINDS, LossKind


def _check(total_loss_tokens: float, *tensors: torch.Tensor | None) -> None:
    if not total_loss_tokens > 0:
        raise ValueError(
            f"total_loss_tokens must be > 0 (the loss tokens of the global batch), got {total_loss_tokens}"
        )
    shape = tensors[0].shape
    for t in tensors[1:]:
        if t is not None and t.shape != shape:
            raise ValueError(f"loss inputs must share one shape, got {tuple(shape)} and {tuple(t.shape)}")


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per token, the k3 estimate ``exp(q) - q - 1`` of KL(π_θ‖π_ref), ``q = log π_ref - log π_θ``."""
    q = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return torch.exp(q) - q - 1.0


def segment_sum(values: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
    """Per-segment sums of a [T] tensor: [S] with S = max id + 1 (differentiable)."""
    n = int(segment_ids.max()) + 1 if segment_ids.numel() else 0
    return torch.zeros(n, dtype=values.dtype, device=values.device).index_add(0, segment_ids, values)


def aggregation_weights(
    loss_mask: torch.Tensor,
    segment_ids: torch.Tensor | None,
    *,
    aggregation: str,
    total_loss_tokens: float,
    total_sequences: float | None = None,
) -> torch.Tensor:
    """The per-token weights ``a_t`` of the module docstring's aggregation; shape [T] -> [T].

    ``total_loss_tokens`` and ``total_sequences`` are the mini-batch's (all micro-batches, all
    ranks), so the sum over micro-batches of ``Σ_t a_t·l_t`` is one global mean."""
    mask = loss_mask.to(torch.float64)
    if aggregation == "token-mean":
        return (mask / total_loss_tokens).to(loss_mask.dtype)
    if aggregation not in ("seq-mean-token-mean", "seq-mean-token-sum"):
        raise ValueError(f"aggregation must be token-mean, seq-mean-token-mean or seq-mean-token-sum, got {aggregation!r}")
    if segment_ids is None or not total_sequences or total_sequences <= 0:
        raise ValueError(f"aggregation {aggregation} needs segment_ids and total_sequences > 0")
    if aggregation == "seq-mean-token-sum":
        return (mask / total_sequences).to(loss_mask.dtype)
    per_seq = segment_sum(mask, segment_ids).clamp(min=1.0)
    return (mask / (per_seq[segment_ids] * total_sequences)).to(loss_mask.dtype)


def _behaviour(prox: torch.Tensor, behav: torch.Tensor, mask: torch.Tensor, cap: float | None,
               given: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(w, keep, dropped): the behaviour weight, the tokens that stay in the loss, the loss tokens
    masked out — by the cap rule, or ``given`` weights (0 = masked) when the caller has them."""
    if given is not None:
        w = given.detach().to(mask.dtype) * mask
        dropped = (w == 0) & (mask > 0)
        return w, mask * (~dropped).to(mask.dtype), dropped
    w = torch.exp(((prox - behav) * mask).clamp(max=30.0))
    if cap is None:
        return w, mask, torch.zeros_like(mask, dtype=torch.bool)
    dropped = (w > cap) & (mask > 0)
    return w, mask * (~dropped).to(mask.dtype), dropped


def _weights(token_weights: torch.Tensor | None, mask: torch.Tensor, total_loss_tokens: float) -> torch.Tensor:
    return mask / total_loss_tokens if token_weights is None else token_weights.detach().to(mask.dtype)


def _ratio_stats(stats: dict[str, torch.Tensor], *, logprobs, prox, w, mask, keep, dropped, ratio,
                 clipped: torch.Tensor, n: float) -> None:
    with torch.no_grad():
        stats.update(
            clip_frac=(clipped.to(mask.dtype) * keep).sum() / n,
            capped_frac=dropped.to(mask.dtype).sum() / n,
            behaviour_weight_mean=(w * mask).sum() / n,
            behaviour_weight_max=(w * mask).max() if mask.numel() else torch.zeros(()),
            # k3 estimate of KL(π_prox ‖ π_θ) ≈ how far this update moved the policy
            approx_kl=(kl_k3(logprobs.detach(), prox) * mask).sum() / n,
            ratio_mean=(ratio.detach() * mask).sum() / n,
        )


def _with_kl(loss, stats, logprobs, ref_logprobs, kl_coef, mask, a, n):
    """Add ``β·Σ a_t·KL_t`` (k3) to the loss; ``kl_ref`` is the KL's token mean over ``n``."""
    if ref_logprobs is not None and kl_coef != 0.0:
        kl = kl_k3(logprobs, ref_logprobs.detach().to(logprobs.dtype))
        loss = loss + kl_coef * (kl * a).sum()
        stats["kl_ref"] = (kl * mask).sum() / n
    return loss, {k: v.detach().float() for k, v in stats.items()}


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
    token_weights: torch.Tensor | None = None,
    behaviour_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The decoupled PPO loss of the module docstring; returns ``(loss, diagnostics)``.

    ``logprobs`` carries the gradient; the proximal and behaviour log-probabilities are
    treated as constants. ``behaviour_weight_cap=None`` keeps every token. ``token_weights``
    (the aggregation, default ``m_t/N_global``) and ``behaviour_weights`` (default: the cap
    rule) as in the module docstring.
    """
    _check(total_loss_tokens, logprobs, proximal_logprobs, behaviour_logprobs, advantages, loss_mask,
           token_weights, behaviour_weights)
    mask = loss_mask.to(logprobs.dtype)
    prox = proximal_logprobs.detach().to(logprobs.dtype)
    adv = advantages.detach().to(logprobs.dtype)
    w, keep, dropped = _behaviour(prox, behaviour_logprobs.detach().to(logprobs.dtype), mask,
                                  behaviour_weight_cap, behaviour_weights)
    a = _weights(token_weights, mask, total_loss_tokens)

    ratio = torch.exp((logprobs - prox) * mask)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    per_token = -w * torch.minimum(unclipped, clipped)
    loss = (per_token * keep * a).sum()
    stats: dict[str, torch.Tensor] = {"policy_loss": loss.detach()}
    _ratio_stats(stats, logprobs=logprobs, prox=prox, w=w, mask=mask, keep=keep, dropped=dropped, ratio=ratio,
                 clipped=(unclipped != clipped) & (mask > 0), n=total_loss_tokens)
    return _with_kl(loss, stats, logprobs, ref_logprobs, kl_coef, mask, a, total_loss_tokens)


def gspo_loss(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    segment_ids: torch.Tensor,
    *,
    total_loss_tokens: float,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    behaviour_weight_cap: float | None = 5.0,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    token_weights: torch.Tensor | None = None,
    behaviour_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO's sequence-level clipped objective (module docstring); ``segment_ids`` [T] long.

    ``clip_frac`` counts the loss tokens of clipped sequences; ``ratio_mean`` is the token mean
    of their sequence's ratio s_i."""
    _check(total_loss_tokens, logprobs, proximal_logprobs, behaviour_logprobs, advantages, loss_mask, segment_ids,
           token_weights, behaviour_weights)
    mask = loss_mask.to(logprobs.dtype)
    prox = proximal_logprobs.detach().to(logprobs.dtype)
    adv = advantages.detach().to(logprobs.dtype)
    w, keep, dropped = _behaviour(prox, behaviour_logprobs.detach().to(logprobs.dtype), mask,
                                  behaviour_weight_cap, behaviour_weights)
    a = _weights(token_weights, mask, total_loss_tokens)

    n_i = segment_sum(mask, segment_ids).clamp(min=1.0)
    log_s = segment_sum((logprobs - prox) * mask, segment_ids) / n_i
    s = torch.exp(log_s.clamp(max=30.0))[segment_ids]
    unclipped = s * adv
    clipped = s.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    per_token = -w * torch.minimum(unclipped, clipped)
    loss = (per_token * keep * a).sum()
    stats: dict[str, torch.Tensor] = {"policy_loss": loss.detach()}
    _ratio_stats(stats, logprobs=logprobs, prox=prox, w=w, mask=mask, keep=keep, dropped=dropped, ratio=s,
                 clipped=(unclipped != clipped) & (mask > 0), n=total_loss_tokens)
    return _with_kl(loss, stats, logprobs, ref_logprobs, kl_coef, mask, a, total_loss_tokens)


def cispo_loss(
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
    token_weights: torch.Tensor | None = None,
    behaviour_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (module docstring): ``-w_t·sg(clip(r_t))·A_t·log π_θ(t)``; ``clip_frac`` is the share
    of loss tokens whose weight was truncated (they keep their gradient)."""
    _check(total_loss_tokens, logprobs, proximal_logprobs, behaviour_logprobs, advantages, loss_mask,
           token_weights, behaviour_weights)
    mask = loss_mask.to(logprobs.dtype)
    prox = proximal_logprobs.detach().to(logprobs.dtype)
    adv = advantages.detach().to(logprobs.dtype)
    w, keep, dropped = _behaviour(prox, behaviour_logprobs.detach().to(logprobs.dtype), mask,
                                  behaviour_weight_cap, behaviour_weights)
    a = _weights(token_weights, mask, total_loss_tokens)

    ratio = torch.exp((logprobs.detach() - prox) * mask)
    is_weight = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token = -w * is_weight * adv * logprobs
    loss = (per_token * keep * a).sum()
    stats: dict[str, torch.Tensor] = {"policy_loss": loss.detach()}
    _ratio_stats(stats, logprobs=logprobs, prox=prox, w=w, mask=mask, keep=keep, dropped=dropped, ratio=ratio,
                 clipped=(is_weight != ratio) & (mask > 0), n=total_loss_tokens)
    return _with_kl(loss, stats, logprobs, ref_logprobs, kl_coef, mask, a, total_loss_tokens)


def reinforce_loss(
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    total_loss_tokens: float,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    token_weights: torch.Tensor | None = None,
    behaviour_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``Σ a_t · w_t · (-A_t · log π_θ(t))`` (+ the KL penalty); on-policy REINFORCE, with
    ``a_t = m_t/N_global`` by default and ``w_t`` 1 unless the mismatch correction gives it
    (Yao et al. 2025's truncated importance sampling: REINFORCE weighted by min(ρ, C))."""
    _check(total_loss_tokens, logprobs, advantages, loss_mask, token_weights, behaviour_weights)
    mask = loss_mask.to(logprobs.dtype)
    adv = advantages.detach().to(logprobs.dtype)
    a = _weights(token_weights, mask, total_loss_tokens)
    w = mask if behaviour_weights is None else behaviour_weights.detach().to(mask.dtype) * mask
    pg = (-adv * logprobs * w * a).sum()
    return _with_kl(pg, {"policy_loss": pg.detach()}, logprobs, ref_logprobs, kl_coef, mask, a, total_loss_tokens)


def policy_loss(
    kind: LossKind,
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    total_loss_tokens: float,
    proximal_logprobs: torch.Tensor | None = None,
    segment_ids: torch.Tensor | None = None,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    behaviour_weight_cap: float | None = 5.0,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    token_weights: torch.Tensor | None = None,
    behaviour_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Dispatch on a built-in ``kind``: ``decoupled_ppo``, ``gspo`` and ``cispo`` need
    ``proximal_logprobs`` (gspo also ``segment_ids``); ``ppo`` uses the behaviour
    log-probabilities as the proximal ones (w = 1: it takes no ``behaviour_weights``);
    ``reinforce`` ignores both."""
    common = dict(total_loss_tokens=total_loss_tokens, ref_logprobs=ref_logprobs, kl_coef=kl_coef,
                  token_weights=token_weights)
    if kind == "reinforce":
        return reinforce_loss(logprobs, advantages, loss_mask, behaviour_weights=behaviour_weights, **common)
    if kind not in LOSS_KINDS:
        raise ValueError(f"loss kind must be one of {list(LOSS_KINDS)}, got {kind!r}")
    clip = dict(eps_low=eps_low, eps_high=eps_high)
    if kind == "ppo":
        if behaviour_weights is not None:
            raise ValueError("ppo anchors its ratio on π_behav: it takes no behaviour_weights")
        return decoupled_ppo_loss(logprobs, behaviour_logprobs, behaviour_logprobs, advantages, loss_mask,
                                  behaviour_weight_cap=None, **clip, **common)
    if proximal_logprobs is None:
        raise ValueError(f"{kind} needs proximal_logprobs (a no-grad forward pass before the update)")
    args = (logprobs, proximal_logprobs, behaviour_logprobs, advantages, loss_mask)
    weights = dict(behaviour_weight_cap=behaviour_weight_cap, behaviour_weights=behaviour_weights)
    if kind == "gspo":
        if segment_ids is None:
            raise ValueError("gspo needs segment_ids (which sequence of the row each token belongs to)")
        return gspo_loss(*args, segment_ids, **clip, **weights, **common)
    if kind == "cispo":
        return cispo_loss(*args, **clip, **weights, **common)
    return decoupled_ppo_loss(*args, **clip, **weights, **common)
