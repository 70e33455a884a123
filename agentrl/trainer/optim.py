"""Muon for hidden weight matrices, AdamW for the rest; and the one warmup + cosine LR schedule.

What it is: ``Muon``, momentum SGD that replaces each 2-D weight's update by its nearest
semi-orthogonal matrix (a quintic Newton–Schulz iteration, Jordan et al. 2024), scaled so its
RMS matches a typical AdamW step (``0.2 * sqrt(max(rows, cols))``, Liu et al. 2025) so one
learning rate and schedule serve both optimizers; and ``MuonAdamW``, which gives Muon the
model's 2-D hidden weights and AdamW the embeddings (tied or not), norms and biases.

Why our own: ``torch.optim.Muon`` runs the iteration in bfloat16, which is slow on a CPU
without bfloat16 units (several times the tiny model's forward and backward; figures in
docs/tiny_model.md); here it runs in float32. What it is not: the RL trainer's
optimizer (``agentrl.trainer.actor`` uses AdamW, as the systems we follow do).

``warmup_cosine`` is the learning-rate schedule of both the tiny model's build and the RL
trainer: linear warmup, then cosine decay to a floor.

Main hooks::

    opt = MuonAdamW(model, lr=4e-3, betas=(0.9, 0.99))
    for group in opt.param_groups:   # one schedule drives both halves
        group["lr"] = lr_now
    opt.zero_grad(); loss.backward(); opt.step()
"""

from __future__ import annotations

import math

import torch


def warmup_cosine(step: int, *, warmup_steps: int, total_steps: int, min_ratio: float, peak: float = 1.0) -> float:
    """The learning rate at (0-based) optimizer step ``step``.

    Linear warmup to ``peak`` over ``warmup_steps`` steps (``peak * (step + 1) / warmup_steps``,
    so the last warmup step is at the peak), then cosine decay to ``peak * min_ratio`` at step
    ``total_steps`` (warmup included), flat after. With ``peak=1`` it is a multiplier for
    ``torch.optim.lr_scheduler.LambdaLR``.
    """
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    t = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
"""The quintic's coefficients from Jordan et al.: chosen for a steep slope at zero, so a few
steps push every singular value into roughly [0.7, 1.2] rather than exactly to 1."""


def orthogonalize(matrix: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """Approximately ``U @ V.T`` of ``matrix = U S V.T``, in float32 (a new tensor)."""
    if matrix.ndim != 2:
        raise ValueError(f"orthogonalize needs a 2-D matrix, got shape {tuple(matrix.shape)}")
    a, b, c = NS_COEFFICIENTS
    x = matrix.float()
    wide = x.size(0) <= x.size(1)
    if not wide:
        x = x.T  # iterate on the smaller Gram matrix
    x = x / x.norm().clamp(min=eps)  # Frobenius norm >= spectral norm: singular values <= 1
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x if wide else x.T


class Muon(torch.optim.Optimizer):
    """Momentum (Nesterov by default), orthogonalized, AdamW-RMS-matched updates of 2-D weights."""

    def __init__(self, params, lr: float = 2e-3, momentum: float = 0.95, nesterov: bool = True,
                 weight_decay: float = 0.0, ns_steps: int = 5) -> None:
        if lr <= 0 or not 0 <= momentum < 1 or weight_decay < 0 or ns_steps < 1:
            raise ValueError(f"Muon needs lr > 0, 0 <= momentum < 1, weight_decay >= 0 and ns_steps >= 1; got "
                             f"lr={lr}, momentum={momentum}, weight_decay={weight_decay}, ns_steps={ns_steps}")
        super().__init__(params, {"lr": lr, "momentum": momentum, "nesterov": nesterov,
                                  "weight_decay": weight_decay, "ns_steps": ns_steps})
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"Muon takes only 2-D weights, got one of shape {tuple(p.shape)}; "
                                     "give embeddings, norms and biases to AdamW (see MuonAdamW)")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            mu = group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - mu)  # an average of gradients: orthogonalizing ignores scale anyway
                update = p.grad.lerp(buf, mu) if group["nesterov"] else buf
                if group["weight_decay"]:
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                scale = 0.2 * math.sqrt(max(p.shape))
                p.add_(orthogonalize(update, group["ns_steps"]).to(p.dtype), alpha=-group["lr"] * scale)
        return loss


class MuonAdamW:
    """Muon on a model's 2-D hidden weights, AdamW on the rest; ``param_groups`` spans both.

    Embedding matrices (including an output head tied to them) go to AdamW: Muon's
    orthogonal updates suit weights that map hidden states to hidden states, not lookup tables.
    """

    def __init__(self, model: torch.nn.Module, lr: float, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0) -> None:
        embedding_ids = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding)
                         for p in m.parameters(recurse=False)}
        params = list(model.parameters())  # tied weights appear once
        hidden = [p for p in params if p.ndim == 2 and id(p) not in embedding_ids]
        rest = [p for p in params if not (p.ndim == 2 and id(p) not in embedding_ids)]
        if not hidden:
            raise ValueError("MuonAdamW found no 2-D hidden weights in the model; use AdamW")
        self.muon = Muon(hidden, lr=lr, weight_decay=weight_decay)
        self.adamw = torch.optim.AdamW(rest, lr=lr, betas=betas, weight_decay=weight_decay)
        self.param_groups = self.muon.param_groups + self.adamw.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none)
        self.adamw.zero_grad(set_to_none)

    def step(self) -> None:
        self.muon.step()
        self.adamw.step()
