"""SftConfig: every key of ``agentrl sft CONFIG``, as a typed, documented dataclass.

What it is: the model, the data (conversations or recorded trajectories, ``agentrl.run.sft_data``),
the held-out split, how long to train and in what batches, where the run goes, and the
``trainer:`` section of ``agentrl train`` (``agentrl.trainer.TrainerConfig``) for the optimizer,
the lr schedule, packing and dtypes. What it is not: the loop (``agentrl.run.sft``).

SFT's loss is the token mean of ``-log π(token)`` over every loss token of a batch, which is the
trainer's ``reinforce`` loss with advantage 1: the run sets ``trainer.loss.kind`` to it, and the
RL-only keys (``trainer.loss`` clipping, ``trainer.advantages``, ``trainer.max_staleness``,
``trainer.weight_sync``) have no effect. ``trainer.loss.kl_coef`` > 0 still adds the KL penalty
against the initial model. The cosine of the lr schedule spans ``trainer.total_steps``
optimizer steps after ``trainer.warmup_steps`` (set it to ``steps`` to decay over the run).
``checkpoint`` is the section of ``agentrl train`` (``RunConfig``'s), with SFT's own defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.config import option
from agentrl.errors import ConfigError
from agentrl.run.run_config import CheckpointConfig
from agentrl.trainer.trainer_config import TrainerConfig


@dataclass
class SftConfig:
    """The config of ``agentrl sft``."""

    model: str = option(help="HF model directory to fine-tune (its tokenizer's chat template renders the data)")
    data: list[str] = option(help="training data: JSONL files (OpenAI conversations, trajectories, agentrl eval "
                                  "records), directories of them, or module:function(seed) returning the same objects")
    heldout: list[str] = option([], help="held-out data, as data; empty: heldout_fraction of data's records")
    heldout_fraction: float = option(0.1, ge=0.0, lt=1.0,
                                     help="share of data's records held out when heldout is empty; 0: no held-out loss")
    min_reward: float | None = option(None, help="trajectories rewarded less are dropped (counted); null keeps all. "
                                                 "Conversations carry no reward")
    max_tokens: int | None = option(None, ge=2, help="examples longer than this are dropped (counted); null: the "
                                    "model's context (max_position_embeddings)")
    steps: int | None = option(None, ge=1, help="train steps (batches); null: epochs x ceil(examples / batch_size)")
    epochs: float = option(1.0, gt=0.0, help="passes over the training examples when steps is null")
    batch_size: int = option(16, ge=1, help="sequences per train step (packed into micro-batches of "
                                            "trainer.micro_batch_tokens)")
    log_every_steps: int = option(10, ge=1, help="a progress line every this many steps "
                                                 "(metrics.jsonl gets every step)")
    eval_every_steps: int = option(0, ge=0, help="held-out loss every this many steps; 0: before and after only")
    run_dir: str = option("runs/sft", help="where the run goes: config.yaml, metrics.jsonl, summary.json, model/ "
                                           "(the fine-tuned HF checkpoint)")
    seed: int = option(0, help="seed of the held-out split, the data order and module:function data")
    world_size: int = option(1, ge=1, help="trainer ranks; more than 1 runs them under torchrun")
    threads: int = option(2, ge=1, help="torch threads of each trainer rank")
    tensorboard: bool = option(False, help="also write RUN_DIR/tensorboard")
    checkpoint: CheckpointConfig = option(CheckpointConfig(every_steps=100, keep_last=1),
                                          help="resumable checkpoints in RUN_DIR/checkpoints "
                                               "(`agentrl sft --resume RUN_DIR`); one is always saved at the end")
    trainer: TrainerConfig = option(TrainerConfig, help="the trainer of agentrl train (optimizer, lr schedule, "
                                                        "packing); its loss is set to SFT's (module docstring)")

    def __post_init__(self) -> None:
        if not self.data:
            raise ConfigError("config key 'data': expected at least one file, directory or module:function, got []")
