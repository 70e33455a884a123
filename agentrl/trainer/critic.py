"""Critic: the value model of ``trainer.advantages.kind: gae``, trained beside the actor.

What it is: a causal LM's body with a scalar head (``AutoModelForTokenClassification``, one
label; the LM head dropped, the score head new), sharded with FSDP2 over the actor's ranks and
loaded the actor's way (rank 0 reads, the others receive their shards), with an AdamW of its own
at ``trainer.critic.lr``. Two collectives a step, every rank with the same ``TrainBatch``:

    assign_advantages(batch)  no grad: V at every loss token (the output at the position that
                              predicts it, as the policy's log-probability), then GAE
                              (``agentrl.trainer.gae``) into ``batch.sequences[i]["advantages"]``
                              of the sequences this rank trains (the actor deals them the same
                              way), normalized over the batch's loss tokens with
                              ``advantages.batch_normalize``
    train_step(batch)         after the actor's: PPO's clipped value loss toward the returns,
                              one optimizer step per mini-batch, packed like the actor's

With ``trainer.lora`` the value model is a LoRA model too: the actor's adapters' rank and
target modules on the frozen body, and its new head trained in full (peft's ``TOKEN_CLS`` task,
which keeps ``score``/``classifier`` as a module to save) — so a LoRA run holds no second full
copy of trainable weights and AdamW state. Its checkpoint then holds the adapters and the head.

What it is not: the arithmetic (``agentrl.trainer.gae``: pure functions) or the policy.

Checkpoints: the critic has the actor's checkpoint surface (``model``, ``optimizer``,
``scheduler``, the step counters, ``config``), so ``save_checkpoint``/``load_checkpoint``
(``agentrl.trainer.checkpoint``) write and restore it as they do the actor, in a directory of its
own beside the actor's (``checkpoints/step_N/critic``; ``agentrl.run.loop``).

Main hook: ``Critic(actor, config)``, then ``assign_advantages(batch)`` before
``actor.train_step(batch)`` and ``train_step(batch)`` after it.
"""

from __future__ import annotations

import functools
import math
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from agentrl.trainer.actor import Actor
from agentrl.trainer.batch import TrainBatch
from agentrl.trainer.gae import gae, value_loss
from agentrl.trainer.losses import aggregation_weights
from agentrl.trainer.optim import warmup_cosine
from agentrl.trainer.packing import Unit, pack
from agentrl.trainer.trainer_config import TrainerConfig


class _ValueModel:
    """``AutoModelForTokenClassification`` with one label and no dropout before its head (0.1 by
    default there: the update's forward would then not see the values GAE used): the loader the
    actor's ``_load`` calls."""

    @staticmethod
    def from_pretrained(path: str, **kwargs: Any) -> torch.nn.Module:
        from transformers import AutoConfig, AutoModelForTokenClassification

        config = AutoConfig.from_pretrained(path, num_labels=1)
        config.classifier_dropout = 0.0
        return AutoModelForTokenClassification.from_pretrained(path, config=config, **kwargs)

    @staticmethod
    def from_config(config: Any, **kwargs: Any) -> torch.nn.Module:
        from transformers import AutoModelForTokenClassification

        config.num_labels, config.classifier_dropout = 1, 0.0
        return AutoModelForTokenClassification.from_config(config, **kwargs)


class Critic:
    """The value model on this rank. Construct it on every rank, after the ``Actor``."""

    def __init__(self, actor: Actor, config: TrainerConfig):
        self.actor, self.config = actor, config
        # what the actor's loader reads: this rank, its mesh and device, the attention and dtype
        self.model_dir = Path(config.critic.model or actor.model_dir)
        self.rank, self.world_size, self.device, self.mesh = actor.rank, actor.world_size, actor.device, actor.mesh
        self.attn_implementation, self.compute_dtype = actor.attn_implementation, actor.compute_dtype
        self.model = Actor._load(self, _ValueModel, trainable=True, lora_task="TOKEN_CLS")  # type: ignore[arg-type]
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.critic.lr, betas=tuple(config.betas),
                                           eps=config.adam_eps, weight_decay=config.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, functools.partial(
            warmup_cosine, warmup_steps=config.warmup_steps, total_steps=config.warmup_steps + 1, min_ratio=1.0))
        self.values: dict[int, torch.Tensor] = {}  # this step's V_old per sequence index (the rank's)
        self.returns: dict[int, torch.Tensor] = {}
        self.version = 0
        self.optimizer_steps = 0
        self.skipped_steps = 0

    def _values(self, batch: TrainBatch, mb: list[Unit]):
        """Packed forward of micro-batch ``mb``: (packed, V [T] float32), V of the state before each
        token (the output at the position whose logits predict it; 0 where none does)."""
        packed = pack(batch.sequences, mb)
        mask = packed.attention_mask(self.attn_implementation, self.compute_dtype)
        out = self.model(input_ids=packed.input_ids.to(self.device), position_ids=packed.position_ids.to(self.device),
                         attention_mask=None if mask is None else mask.to(self.device), use_cache=False).logits
        src = packed.sources[0].to(self.device)
        return packed, out[0, src.clamp(min=0), 0].float().masked_fill(src < 0, 0.0)

    @torch.no_grad()
    def assign_advantages(self, batch: TrainBatch) -> dict[str, float]:
        """V_old, GAE and the returns for this rank's sequences (a collective); the advantages go
        into ``batch.sequences``. Returns reduced diagnostics (``critic/adv_mean`` ...)."""
        adv_cfg = self.config.advantages
        self.values, self.returns = {}, {}
        if len(batch) == 0:  # every rank holds the same batch: all of them return here
            return {}
        self.model.eval()
        for mb in self.actor._iter_rank_micro_batches(batch):
            if not mb:
                self.actor._dummy_forward(self.model)
                continue
            packed, v = self._values(batch, mb)
            for i, vi in zip(packed.indices, packed.split(v.cpu()), strict=True):
                seq = batch.sequences[i]
                a, r = gae(seq["token_rewards"], vi, seq["loss_mask"], gamma=adv_cfg.gamma, lam=adv_cfg.lam)
                seq["advantages"], self.values[i], self.returns[i] = a, vi * seq["loss_mask"], r
        # the batch's token statistics of the advantages: sum, sum of squares, count over every rank
        mine = [batch.sequences[i] for i in self.values]
        t = torch.tensor([sum(float(s["advantages"].sum()) for s in mine),
                          sum(float((s["advantages"] ** 2).sum()) for s in mine),
                          sum(float(s["loss_mask"].sum()) for s in mine),
                          sum(float(v.sum()) for v in self.values.values())], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        total, sq, n, vsum = t.cpu().tolist()
        mean = total / max(n, 1.0)
        std = math.sqrt(max(0.0, sq / max(n, 1.0) - mean * mean))
        if adv_cfg.batch_normalize:
            for s in mine:
                s["advantages"] = (s["advantages"] - mean) / (std + 1e-6) * s["loss_mask"]
        return {"critic/adv_mean": mean, "critic/adv_std": std, "critic/value_before_mean": vsum / max(n, 1.0)}

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One value-model update over ``batch`` after ``assign_advantages`` (a collective)."""
        cfg = self.config
        if len(batch) == 0 or batch.num_loss_tokens == 0:
            self.version += 1
            return {}
        self.model.train()
        sums: dict[str, float] = {}
        for indices in self.actor._mini_batches(batch):
            n_tokens = batch.loss_tokens(indices)
            if n_tokens == 0:
                continue
            for mb in self.actor._micro_batches(batch, indices):
                if not mb:
                    self.actor._dummy_forward(self.model).backward()
                    continue
                packed, v = self._values(batch, mb)
                mask = packed.fields["loss_mask"].to(self.device)
                weights = aggregation_weights(mask, packed.segment_ids().to(self.device), aggregation="token-mean",
                                              total_loss_tokens=n_tokens, total_sequences=len(indices))
                loss, st = value_loss(v, packed.join([self.values[i] for i in packed.indices]).to(self.device),
                                      packed.join([self.returns[i] for i in packed.indices]).to(self.device), mask,
                                      weights, clip=cfg.critic.value_clip)
                (loss * cfg.critic.value_coef * self.world_size).backward()
                for k, x in st.items():
                    sums[k] = sums.get(k, 0.0) + float(x)
            self._step()
        self.version += 1
        keys = sorted(sums)
        t = torch.tensor([sums[k] for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        minis = len(self.actor._mini_batches(batch))
        out = {f"critic/{k}": float(x) / minis for k, x in zip(keys, t.cpu().tolist(), strict=True)}
        return out | {"critic/optimizer_steps": float(self.optimizer_steps), "critic/lr": self.scheduler.get_last_lr()[0]}

    def _step(self) -> None:
        norm = Actor._clip_grad_norm(self)  # type: ignore[arg-type]  # the actor's rule, on this model
        if math.isfinite(norm):
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer_steps += 1
        else:
            self.skipped_steps += 1
            warnings.warn(f"the critic's gradient norm is {norm}; its optimizer step is skipped",
                          RuntimeWarning, stacklevel=2)
        self.optimizer.zero_grad(set_to_none=True)
