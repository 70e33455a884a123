"""The objective of a train step, chosen by ``trainer.loss.kind``: a built-in one, or your own.

What it is: ``LossInputs`` (one packed micro-batch's token tensors, the same for every
objective), ``resolve_objective(kind)`` (a built-in name, or ``"module:function"`` loaded
through ``agentrl.plugins``) and ``objective_loss(inputs, config)``, which applies the
engine–trainer mismatch correction (``agentrl.trainer.mismatch``) and the KL penalty around the
objective. What it is not: the math of the built-in losses (``agentrl.trainer.losses``) or the
forward pass (``agentrl.trainer.actor``, which builds the inputs).

Your own objective is one function in one file, named in the config as
``trainer.loss.kind: my_module:my_loss`` (``my_module.py`` in the directory you run from, or
anywhere on the import path)::

    def my_loss(inputs: LossInputs, config: LossConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ...  # a scalar that carries the gradient of inputs.logprobs, and detached float diagnostics

It is called once per micro-batch, and the micro-batches' losses are summed into one gradient:
return ``Σ_t inputs.token_weights[t] · l_t`` (the configured aggregation; already 0 off the
loss mask) for the sum to be one mean over the mini-batch. A diagnostic is summed over
micro-batches and ranks (divide a token sum by ``inputs.total_loss_tokens``), or maxed if its
key ends in ``_max``. ``inputs.behaviour_weights`` holds the mismatch correction's weights when
``trainer.loss.mismatch.mode`` is on (multiply by them), None when it is off. The KL penalty
(``trainer.loss.kl_coef``) is added after your function returns.

Main hook: ``objective_loss(LossInputs(...), trainer_config.loss)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from agentrl.errors import ConfigError
from agentrl.trainer.distill import DistillConfig, distill_loss
from agentrl.trainer.losses import kl_k3, policy_loss
from agentrl.trainer.mismatch import mismatch_gap, mismatch_weights
from agentrl.trainer.trainer_config import LOSS_KINDS, LossConfig

Objective = Callable[["LossInputs", LossConfig], tuple[torch.Tensor, dict[str, torch.Tensor]]]
"""What ``trainer.loss.kind`` names: ``(inputs, config) -> (loss, diagnostics)``."""


@dataclass
class LossInputs:
    """One micro-batch's tensors, each [T] (one packed row), on the trainer's device.

    Attributes:
        logprobs: log π_θ of each token; carries the gradient.
        proximal_logprobs: log π_prox, the trainer's no-grad recomputation before the update
            (``logprobs`` detached when the step is one mini-batch: the same number).
        behaviour_logprobs: log π_behav, what the inference engine reported while sampling.
        advantages: the trajectory's advantage on its loss tokens, 0 elsewhere.
        loss_mask: 1.0 on tokens the policy sampled (the loss tokens), 0.0 elsewhere.
        segment_ids: long, which sequence of the row each token belongs to (0 .. S-1).
        token_weights: the aggregation ``a_t`` (``agentrl.trainer.losses.aggregation_weights``).
        total_loss_tokens: N_global, the mini-batch's loss tokens (all micro-batches and ranks).
        behaviour_weights: the mismatch correction's per-token weights (0: masked), or None.
        token_staleness: versions behind of the weights that sampled each token (0: the weights
            ``proximal_logprobs`` came from), or None when π_prox is not a recomputation before
            the update (then no gap is measured).
        teacher_logprobs: a distillation teacher's log-probability of each token (``trainer.distill``),
            or None.
    """

    logprobs: torch.Tensor
    proximal_logprobs: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    segment_ids: torch.Tensor
    token_weights: torch.Tensor
    total_loss_tokens: float
    behaviour_weights: torch.Tensor | None = None
    token_staleness: torch.Tensor | None = None
    teacher_logprobs: torch.Tensor | None = None


def builtin_objective(inputs: LossInputs, config: LossConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``config.kind`` (a built-in) on ``inputs``, without the KL penalty."""
    return policy_loss(
        config.kind, inputs.logprobs, inputs.behaviour_logprobs, inputs.advantages, inputs.loss_mask,  # type: ignore[arg-type]
        total_loss_tokens=inputs.total_loss_tokens, proximal_logprobs=inputs.proximal_logprobs,
        segment_ids=inputs.segment_ids, eps_low=config.eps_low, eps_high=config.eps_high,
        behaviour_weight_cap=config.behaviour_weight_cap, token_weights=inputs.token_weights,
        behaviour_weights=inputs.behaviour_weights,
    )


def resolve_objective(kind: str) -> Objective:
    """The function ``kind`` names: a built-in, or ``module:function`` (imported, checked callable)."""
    if kind in LOSS_KINDS:
        return builtin_objective
    from agentrl.plugins import load_object

    if ":" not in kind:
        raise ConfigError(f"config key 'trainer.loss.kind': got {kind!r}, expected one of {list(LOSS_KINDS)} "
                          "or 'module:function'")
    try:
        fn = load_object(kind)
    except ConfigError as e:
        raise ConfigError(f"config key 'trainer.loss.kind': {e}") from None
    if not callable(fn):
        raise ConfigError(f"config key 'trainer.loss.kind': {kind!r} is a {type(fn).__name__}, expected a function "
                          "(inputs: LossInputs, config: LossConfig) -> (loss, diagnostics)")
    return fn


def objective_loss(inputs: LossInputs, config: LossConfig, *, ref_logprobs: torch.Tensor | None = None,
                   objective: Objective | None = None,
                   distill: DistillConfig | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The behaviour–trainer gap (when ``inputs.token_staleness`` is given), the mismatch weights (when on), the objective (``objective`` or ``config.kind``'s), then
    ``kl_coef · Σ_t a_t·KL_t`` against ``ref_logprobs``, then the distillation loss term (``distill.mode:
    loss`` and ``inputs.teacher_logprobs``: ``agentrl.trainer.distill.distill_loss``); returns ``(loss, diagnostics)``."""
    stats: dict[str, torch.Tensor] = {}
    if inputs.token_staleness is not None:
        stats.update(mismatch_gap(inputs.proximal_logprobs, inputs.behaviour_logprobs, inputs.loss_mask,
                                  inputs.token_staleness, total_loss_tokens=inputs.total_loss_tokens))
    if config.mismatch.mode != "off":
        w, mstats = mismatch_weights(inputs.proximal_logprobs, inputs.behaviour_logprobs, inputs.loss_mask,
                                     inputs.segment_ids, config=config.mismatch,
                                     total_loss_tokens=inputs.total_loss_tokens)
        inputs = replace(inputs, behaviour_weights=w)
        stats.update(mstats)
    loss, st = (objective or resolve_objective(config.kind))(inputs, config)
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise TypeError(f"the objective {config.kind!r} must return (a scalar tensor, a dict of tensors), "
                        f"got a {type(loss).__name__} first")
    stats.update({k: torch.as_tensor(v).detach().float() for k, v in st.items()})
    if ref_logprobs is not None and config.kl_coef != 0.0:
        mask = inputs.loss_mask.to(inputs.logprobs.dtype)
        kl = kl_k3(inputs.logprobs, ref_logprobs.detach().to(inputs.logprobs.dtype))
        loss = loss + config.kl_coef * (kl * inputs.token_weights.to(kl.dtype)).sum()
        stats["kl_ref"] = ((kl * mask).sum() / inputs.total_loss_tokens).detach().float()
    if distill is not None and distill.mode == "loss" and inputs.teacher_logprobs is not None:
        term, dstats = distill_loss(inputs.logprobs, inputs.teacher_logprobs, inputs.loss_mask, inputs.token_weights,
                                    coef=distill.coef, total_loss_tokens=inputs.total_loss_tokens)
        loss = loss + term
        stats.update(dstats)
    return loss, stats
