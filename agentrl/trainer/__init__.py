"""The trainer: FSDP2 decoupled PPO over trajectories, and publishing its weights.

    config.py      TrainerConfig (+ LossConfig, AdvantageConfig): every trainer setting
    actor.py       Actor: the policy on one rank (FSDP2, packing, the optimizer step)
    losses.py      decoupled PPO / PPO / REINFORCE token losses (pure functions)
    advantages.py  group-relative advantages and batch normalisation (pure functions)
    staleness.py   the staleness bound: rollout capacity and the stale filter
    batch.py       prepare_batch: trajectories -> a TrainBatch (filters, advantages, counts)
    packing.py     packing sequences into micro-batches; segment attention on CPU
    checkpoint.py  resumable sharded checkpoints and the HF export
    publish.py     WeightPublisher: stage -> pause -> send -> continue (DESIGN.md §4), by disk or
                   by broadcast over torch.distributed
"""

from agentrl.trainer.actor import Actor
from agentrl.trainer.batch import TrainBatch, broadcast_trajectories, prepare_batch
from agentrl.trainer.publish import DiskTransport, DistributedTransport, WeightPublisher
from agentrl.trainer.trainer_config import AdvantageConfig, LossConfig, TrainerConfig

__all__ = ["Actor", "AdvantageConfig", "DiskTransport", "DistributedTransport", "LossConfig", "TrainBatch", "TrainerConfig",
           "WeightPublisher", "broadcast_trajectories", "prepare_batch"]
