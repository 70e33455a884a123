"""On-policy distillation: the student's own samples, scored token by token by a teacher.

What it is: ``DistillConfig`` (``trainer.distill``: the teacher server, the coefficient, the
mode) and the pure functions that turn the teacher's log-probabilities of the student's sampled
tokens into a per-token reward (``distill_advantages``) or a loss term (``distill_loss``), with
detached diagnostics. What it is not: the request to the teacher (``agentrl.rollout.teacher``
asks the server, through the engine backends of ``agentrl.client``) nor the objective the term
joins (``agentrl.trainer.objective``).

The quantity is the per-token reverse KL on the student's samples (Agarwal et al. 2024, "On-Policy
Distillation of Language Models", arXiv:2306.13649; Thinking Machines, "On-Policy Distillation",
2025; Tinker cookbook's ``distillation`` recipe)::

    y_t ~ π_student(· | x, y_<t)          sampled by the student (the rollout)
    k_t = log π_student(y_t) - log π_teacher(y_t)

whose expectation over y_t is KL(π_student || π_teacher) at position t (mode seeking: the
student is pushed off tokens the teacher finds unlikely). Two ways into the update:

    mode: reward   A_t = task_coef · A_task - coef · k_t,   k_t with π_student = π_behav
                   (the engine's log-probability of the sampled token, known at sampling time).
                   The per-token advantage then goes through the objective (its ratio and clip),
                   like Tinker's ``incorporate_kl_penalty`` with no discount on later tokens.
    mode: loss     L += coef · Σ_t a_t · ½ (log π_θ(y_t) - log π_teacher(y_t))²   (a_t: the
                   aggregation weights). On samples of π_θ, ∇ ½ k_t² = k_t ∇ log π_θ(y_t): the
                   score-function gradient of the per-token reverse KL, without the ratio and clip
                   (it is the k2 estimator; Schulman's "Approximating KL divergence").

Tokenizers must match: the teacher scores the student's token ids, so both must map text to the
same ids (``agentrl.rollout.teacher`` checks it before the first request).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrl.config import option
from agentrl.errors import ConfigError

DISTILL_MODES: tuple[str, ...] = ("reward", "loss")
"""How the teacher's signal enters the update (``trainer.distill.mode``)."""
TEACHER_ENGINES: tuple[str, ...] = ("auto", "agentrl", "sglang", "vllm")
"""The teacher server's API (``trainer.distill.teacher.engine``; ``agentrl.client.engines``)."""


@dataclass
class TeacherConfig:
    """The server that serves the teacher (``agentrl serve``, SGLang or vLLM)."""

    url: str = option("", help="the teacher server's address, e.g. http://127.0.0.1:30100 (empty: no distillation)")
    engine: str = option("auto", choices=TEACHER_ENGINES,
                         help="its API: agentrl or sglang (POST /generate with prompt logprobs), vllm "
                              "(POST /v1/completions with prompt_logprobs), auto: asked of GET /v1/models")
    api_key_env: str = option("AGENTRL_TEACHER_API_KEY",
                              help="the environment variable holding the teacher server's key (unset: no key)")
    timeout_s: float = option(120.0, gt=0, help="seconds one scoring request may take")
    max_retries: int = option(3, ge=0, help="retries of a failed request (transport errors, 5xx) before the "
                                            "step fails")
    max_concurrent: int = option(16, ge=1, help="scoring requests in flight at once")


@dataclass
class DistillConfig:
    """``trainer.distill``: per-token reverse KL to a teacher on the student's own samples (see
    the module docstring). Off while ``teacher.url`` is empty."""

    teacher: TeacherConfig = option(TeacherConfig, help="the teacher's server")
    coef: float = option(1.0, gt=0.0, help="the weight of the reverse KL term")
    mode: str = option("reward", choices=DISTILL_MODES,
                       help="reward: -coef · (log π_behav - log π_teacher) added to each sampled token's "
                            "advantage (it goes through the objective's ratio and clip); loss: coef · "
                            "½(log π_θ - log π_teacher)² added to the loss, weighted like the objective's tokens")
    task_coef: float = option(1.0, ge=0.0, help="the task reward's advantages are scaled by this (0: distillation "
                                                "alone; the task reward is then only logged)")

    def __post_init__(self) -> None:
        url = self.teacher.url
        if url and not url.startswith(("http://", "https://")):
            raise ConfigError(f"config key 'trainer.distill.teacher.url': got {url!r}, expected an http(s) URL "
                              "such as http://127.0.0.1:30100 (the teacher's `agentrl serve`, SGLang or vLLM)")

    @property
    def enabled(self) -> bool:
        return bool(self.teacher.url)


def reverse_kl(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
               loss_mask: torch.Tensor) -> torch.Tensor:
    """``k_t = (log π_student - log π_teacher) · mask``; shapes [T] (or [N, T]) -> the same, 0 off the mask."""
    mask = loss_mask.to(student_logprobs.dtype)
    return (student_logprobs - teacher_logprobs.to(student_logprobs.dtype)) * mask


def distill_advantages(advantages: torch.Tensor, behaviour_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
                       loss_mask: torch.Tensor, *, coef: float, task_coef: float = 1.0,
                       ) -> tuple[torch.Tensor, dict[str, float]]:
    """``mode: reward``: ``A_t = task_coef · A_t - coef · k_t`` on loss tokens (0 elsewhere).

    Args:
        advantages: [T] the task advantage of each token (the trajectory's, on its loss tokens).
        behaviour_logprobs, teacher_logprobs, loss_mask: [T], token-aligned.
    Returns:
        the advantages [T] and diagnostics: ``reverse_kl_sum`` (Σ_t k_t) and ``loss_tokens``
        (the caller divides one by the other over the batch).
    """
    mask = loss_mask.to(advantages.dtype)
    k = reverse_kl(behaviour_logprobs.to(advantages.dtype), teacher_logprobs, mask)
    out = (task_coef * advantages - coef * k) * mask
    return out, {"reverse_kl_sum": float(k.sum()), "loss_tokens": float(mask.sum())}


def distill_loss(logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, loss_mask: torch.Tensor,
                 token_weights: torch.Tensor, *, coef: float, total_loss_tokens: float,
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``mode: loss``: ``coef · Σ_t a_t · ½ k_t²`` with ``k_t = log π_θ - log π_teacher``; shapes [T].

    ``token_weights`` are the objective's aggregation weights ``a_t`` (0 off the mask), so the
    term is summed over micro-batches like the objective. The gradient of one token's term is
    ``coef · a_t · k_t · ∇ log π_θ(y_t)``. Diagnostics: ``distill/reverse_kl`` (the token mean of
    ``k_t`` over the mini-batch, detached)."""
    k = reverse_kl(logprobs, teacher_logprobs.detach(), loss_mask)
    loss = coef * (0.5 * k * k * token_weights.to(k.dtype)).sum()
    return loss, {"distill/reverse_kl": (k.detach().sum() / total_loss_tokens).float()}


def distill_sequence(sequence: dict[str, torch.Tensor], teacher_logprobs: list[float] | None,
                     config: DistillConfig) -> float:
    """Lay the teacher's row into one ``TrainBatch`` sequence (``agentrl.trainer.batch``), in place:
    ``teacher_logprobs`` beside its tokens, and the advantages of ``config.mode`` (reward: the
    distillation term added, ``distill_advantages``; loss: the task advantages times
    ``task_coef``, the term comes in the loss). Returns Σ_t k_t over its loss tokens (π_behav)."""
    if teacher_logprobs is None:
        raise ConfigError("trainer.distill is on but a trajectory reached the trainer unscored by the teacher "
                          "(Trajectory.teacher_logprobs is None); the rollout side scores every batch it hands out")
    mask = sequence["loss_mask"]
    teacher = torch.tensor(teacher_logprobs, dtype=torch.float32) * mask
    sequence["teacher_logprobs"] = teacher
    if config.mode == "reward":
        sequence["advantages"], d = distill_advantages(sequence["advantages"], sequence["behaviour_logprobs"], teacher,
                                                       mask, coef=config.coef, task_coef=config.task_coef)
        return d["reverse_kl_sum"]
    sequence["advantages"] = sequence["advantages"] * config.task_coef
    return float(reverse_kl(sequence["behaviour_logprobs"], teacher, mask).sum())
