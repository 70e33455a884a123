"""The Tinker API's built-in losses, as the Tinker docs define them (the "Loss Functions" pages).

What it is: pure functions from one datum's target log-probabilities ``log p_θ(x_t)`` (shape
``[N]``, carrying the gradient) and its ``loss_fn_inputs`` to a scalar loss — a *sum* over the
datum's tokens, not a mean (Tinker's convention: the caller scales by what it likes, e.g. the
cookbook's weights hold ``1/num_tokens``). ``tinker_loss(name, ...)`` dispatches on the name the
SDK sends. With ``q`` the sampler's log-probabilities (``logprobs``), ``A`` the ``advantages``
and ``r_t = exp(log p_θ - q)``:

    cross_entropy         -Σ w_t · log p_θ(x_t)                  (w: ``weights``)
    importance_sampling   -Σ r_t · A_t
    ppo                   -Σ min(r_t · A_t, clip(r_t, lo, hi) · A_t)
    cispo                 -Σ sg(clip(r_t, lo, hi)) · log p_θ(x_t) · A_t     (Chen et al. 2025,
                          "MiniMax-M1", arXiv:2506.13585; sg: stop-gradient)
    gspo                  -Σ min(s_t · A_t, clip(s_t, lo, hi) · A_t), the token-level variant of
                          GSPO (Zheng et al. 2025, arXiv:2507.18071): s_t = sg(s) · p_θ(x_t) /
                          sg(p_θ(x_t)), s = exp(mean over the ``sequence_ratio_mask`` tokens of
                          log p_θ - q): every token carries the sequence's ratio, with its own gradient
    dro                   -Σ (log p_θ(x_t) · A_t - β/2 · (log p_θ(x_t) - q_t)²)   (Richemond et al.
                          2024, arXiv:2405.19107: a quadratic penalty in place of a clip; β is
                          ``loss_fn_config['beta']``, which has no default: Tinker's docs state none)

``lo``/``hi`` are ``loss_fn_config``'s ``clip_low_threshold`` and ``clip_high_threshold``
(defaults 0.8 and 1.2: Tinker's ε = 0.2, documented for ppo; gspo takes the same defaults here,
its own in Tinker were not found stated). Every loss returns its ``loss:sum`` (the SDK's metric
name) through the caller, and the target log-probabilities are each datum's output.

What it is not: ``stable_reinforce`` and ``custom``, refused by name with what to use instead.
StableReinforce's objective is not published: Tinker's docs (its "StableReinforce" page, alpha)
say only that it uses "minimal additional information captured at sampling time" and that datums
name their sampled sequences through provenance spans, so a loss written here under that name
would be a guess. ``custom`` is server-side code, which the SDK's ``forward_backward_custom``
does not need (it runs the loss on the client over ``forward``). Nor the forward pass (``agentrl.service.learner``) or agentrl's own PPO
losses (``agentrl.trainer.losses``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

TINKER_LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo", "gspo", "dro")
"""The loss names this service computes."""
CLIP_DEFAULTS = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
REQUIRED = {"cross_entropy": ("target_tokens", "weights"),
            "importance_sampling": ("target_tokens", "logprobs", "advantages"),
            "ppo": ("target_tokens", "logprobs", "advantages"),
            "cispo": ("target_tokens", "logprobs", "advantages"),
            "gspo": ("target_tokens", "logprobs", "advantages", "sequence_ratio_mask"),
            "dro": ("target_tokens", "logprobs", "advantages")}
"""Each loss's ``loss_fn_inputs`` (all of shape ``[N]``, N the datum's input length)."""
REQUIRED_CONFIG = {"dro": ("beta",)}
"""Each loss's ``loss_fn_config`` keys that have no default."""
NOT_SERVED = {
    "stable_reinforce": "its objective is not published (Tinker's docs describe only its inputs); train with "
                        "loss_fn='ppo' or 'importance_sampling' (the cookbook's recipes take loss_fn=...)",
    "custom": "server-side custom losses are not served; use forward_backward_custom, which computes the loss "
              "on the client",
}
"""Loss names the SDK knows that this service refuses, with what to use instead."""


def cross_entropy(target_logprobs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``-Σ w_t · log p_θ(x_t)``."""
    return -(weights * target_logprobs).sum()


def importance_sampling(target_logprobs: torch.Tensor, sampling_logprobs: torch.Tensor,
                        advantages: torch.Tensor) -> torch.Tensor:
    """``-Σ exp(log p_θ - q) · A``: REINFORCE corrected for the sampler being another policy."""
    ratio = torch.exp(target_logprobs - sampling_logprobs)
    return -(ratio * advantages).sum()


def ppo(target_logprobs: torch.Tensor, sampling_logprobs: torch.Tensor, advantages: torch.Tensor, *,
        clip_low_threshold: float = 0.8, clip_high_threshold: float = 1.2) -> torch.Tensor:
    """``-Σ min(r · A, clip(r, lo, hi) · A)``, token by token."""
    ratio = torch.exp(target_logprobs - sampling_logprobs)
    clipped = torch.clamp(ratio, clip_low_threshold, clip_high_threshold)
    return -torch.minimum(ratio * advantages, clipped * advantages).sum()


def cispo(target_logprobs: torch.Tensor, sampling_logprobs: torch.Tensor, advantages: torch.Tensor, *,
          clip_low_threshold: float = 0.8, clip_high_threshold: float = 1.2) -> torch.Tensor:
    """``-Σ sg(clip(r, lo, hi)) · log p_θ · A``: the clipped ratio weighs the gradient of every
    token, none is dropped."""
    ratio = torch.exp(target_logprobs - sampling_logprobs)
    clipped = torch.clamp(ratio, clip_low_threshold, clip_high_threshold).detach()
    return -(clipped * target_logprobs * advantages).sum()


def gspo(target_logprobs: torch.Tensor, sampling_logprobs: torch.Tensor, advantages: torch.Tensor,
         sequence_ratio_mask: torch.Tensor, *, clip_low_threshold: float = 0.8,
         clip_high_threshold: float = 1.2) -> torch.Tensor:
    """GSPO-token: PPO's clipped objective with the sequence's ratio in every token's place (the
    mean log-ratio over the masked tokens; 0, a ratio of 1, when none is masked)."""
    in_ratio = sequence_ratio_mask != 0
    log_ratio = (target_logprobs.detach() - sampling_logprobs)[in_ratio]
    seq = log_ratio.mean() if log_ratio.numel() else torch.zeros((), dtype=target_logprobs.dtype)
    ratio = torch.exp(seq + target_logprobs - target_logprobs.detach())
    clipped = torch.clamp(ratio, clip_low_threshold, clip_high_threshold)
    return -torch.minimum(ratio * advantages, clipped * advantages).sum()


def dro(target_logprobs: torch.Tensor, sampling_logprobs: torch.Tensor, advantages: torch.Tensor, *,
        beta: float) -> torch.Tensor:
    """``-Σ (log p_θ · A - β/2 · (log p_θ - q)²)``: REINFORCE held near the sampler by a squared
    log-ratio penalty (no ratio, no clip)."""
    penalty = (target_logprobs - sampling_logprobs) ** 2
    return -(target_logprobs * advantages - 0.5 * beta * penalty).sum()


def tinker_loss(name: str, target_logprobs: torch.Tensor, inputs: Mapping[str, torch.Tensor],
                config: Mapping[str, float | str]) -> torch.Tensor:
    """The loss ``name`` of one datum; ``inputs`` are its ``loss_fn_inputs`` as float tensors of
    ``target_logprobs``' shape (checked by the caller), ``config`` its ``loss_fn_config``."""
    if name == "cross_entropy":
        return cross_entropy(target_logprobs, inputs["weights"])
    if name == "importance_sampling":
        return importance_sampling(target_logprobs, inputs["logprobs"], inputs["advantages"])
    clip = {k: float(config.get(k, v)) for k, v in CLIP_DEFAULTS.items()}
    if name in ("ppo", "cispo"):
        fn = ppo if name == "ppo" else cispo
        return fn(target_logprobs, inputs["logprobs"], inputs["advantages"], **clip)
    if name == "gspo":
        return gspo(target_logprobs, inputs["logprobs"], inputs["advantages"], inputs["sequence_ratio_mask"], **clip)
    if name == "dro":
        return dro(target_logprobs, inputs["logprobs"], inputs["advantages"], beta=float(config["beta"]))
    raise ValueError(f"loss_fn must be one of {list(TINKER_LOSSES)}, got {name!r}")
