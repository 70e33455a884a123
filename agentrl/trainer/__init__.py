"""The trainer: FSDP2 decoupled PPO over trajectories (with a critic, optionally), and publishing its weights.

    trainer_config.py  TrainerConfig (+ LossConfig, AdvantageConfig): every trainer setting
    actor.py           Actor: the policy on one rank (FSDP2, packing, the optimizer step)
    losses.py          decoupled PPO / PPO / REINFORCE / GSPO / CISPO token losses and their
                       aggregation (pure functions)
    objective.py       trainer.loss.kind: LossInputs, a built-in objective or the user's module:function
    mismatch.py        engine–trainer mismatch weights, truncated (TIS) or masked (MIS) (pure function)
    distill.py         DistillConfig (trainer.distill) and on-policy distillation's reverse KL to a
                       teacher, as a reward or a loss term (pure functions)
    advantages.py      group_norm / RLOO / REINFORCE++ advantages, the overlong penalty, batch
                       normalisation (pure functions)
    gae.py             GAE, the token rewards and the clipped value loss (pure functions)
    turns.py           the turn-level estimator: GiGPO's step groups of equal states (pure functions)
    critic.py          Critic: the value model of advantages.kind gae (FSDP2, its own optimizer)
    staleness.py       the staleness bound: rollout capacity and the stale filter
    batch.py           prepare_batch: trajectories -> a TrainBatch (filters, advantages, counts)
    packing.py         packing sequences into micro-batches; segment attention on CPU
    optim.py           Muon + AdamW, and the warmup + cosine LR schedule
    tinker_losses.py   the Tinker API's losses: cross_entropy, importance_sampling, ppo, cispo, gspo
    lora.py            peft LoRA adapters: wrap, export, merge
    checkpoint.py      resumable sharded checkpoints and the HF export
    publish.py         WeightPublisher: stage -> pause -> send -> continue (DESIGN.md §4), by disk or
                       by broadcast over torch.distributed
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {"Actor": "actor", "TrainBatch": "batch", "broadcast_trajectories": "batch", "prepare_batch": "batch",
          "DiskTransport": "publish", "DistributedTransport": "publish", "WeightPublisher": "publish",
          "AdvantageConfig": "trainer_config", "CriticConfig": "trainer_config", "LossConfig": "trainer_config", "TrainerConfig": "trainer_config",
          "LossInputs": "objective"}
"""Where each name lives: imported on first use, so a process that only reads the trainer's
config or its pure functions (``agentrl train`` before it launches, the staleness rule) does not
import torch."""

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'agentrl.trainer' has no attribute {name!r}")
    return getattr(importlib.import_module(f"agentrl.trainer.{_HOMES[name]}"), name)
