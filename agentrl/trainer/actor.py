"""Actor: the policy being trained — an HF causal LM sharded with FSDP2, one process per rank.

What it is: model + AdamW + warmup/cosine schedule behind two calls, ``compute_logprobs(batch)``
(no grad: the proximal policy π_prox, or the reference policy) and ``train_step(batch)``
(the update of the objective ``trainer.loss.kind`` names, ``agentrl.trainer.objective``, over
mini-batches of packed micro-batches).
It runs under ``torchrun``: gloo on CPU, NCCL on GPUs; ``init_distributed`` sets that up.
What it is not: batch preparation (``agentrl.trainer.batch``), checkpoints (``agentrl.trainer.checkpoint``) or
weight publishing (``agentrl.trainer.publish``), though it exposes what they need. Loading: rank 0
reads the checkpoint, the other ranks build the model on the meta device and receive their
shards by broadcast (so a host holds the full model once, not once per rank; rank 0 still moves
it to its device whole before sharding). Not there yet: a chunked log-softmax for very large
vocabularies (the float32 [T, V] log-probabilities of one micro-batch are materialized).

Main hook: ``Actor(model_dir, TrainerConfig(...)).train_step(prepare_batch(...))``. With
``trainer.lora`` the model is a peft ``PeftModel`` (``agentrl.trainer.lora``): the base frozen,
only the adapters in the optimizer; everything else here is the same.

How a step runs. Every rank holds the same global ``TrainBatch``. It is split in order into
``num_mini_batches`` mini-batches; each is one optimizer step. A mini-batch's sequences are
dealt to ranks by token count and packed into micro-batches of ``micro_batch_tokens``
(``agentrl.trainer.packing``); each micro-batch's loss is its share of the mini-batch's global token
mean, and the gradient is accumulated. FSDP averages gradients over ranks, so each rank scales
its loss by the world size: the result is the same as one rank running the whole batch.
π_prox is a no-grad forward pass before the first update when there are several mini-batches,
and π_θ detached when there is one (it is then the same number). A step whose gradient norm is
not finite is skipped (no optimizer or schedule step) and counted in ``skipped_steps``.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from agentrl.errors import ModelError, TrainerError
from agentrl.trainer.batch import TrainBatch
from agentrl.trainer.losses import aggregation_weights
from agentrl.trainer.objective import LossInputs, objective_loss, resolve_objective
from agentrl.trainer.optim import warmup_cosine
from agentrl.trainer.packing import (
    SEGMENT_ATTENTION,
    VARLEN_ATTENTION,
    Unit,
    pack,
    plan_units,
    register_segment_attention,
    shared_prefix_units,
    token_logprobs,
)
from agentrl.trainer.trainer_config import TrainerConfig


def init_distributed(timeout_s: float = 600.0) -> tuple[int, int, torch.device]:
    """Join the process group torchrun describes (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...)
    with NCCL when GPUs are visible and gloo otherwise; returns (rank, world_size, device)."""
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            raise TrainerError(
                "the actor runs under torchrun (RANK/WORLD_SIZE/MASTER_ADDR not set); launch with "
                "`python -m torch.distributed.run --nproc_per_node=N your_script.py`"
            )
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


class Actor:
    """The trained policy on this rank. Construct it on every rank, after ``init_distributed``."""

    def __init__(self, model_dir: str | Path, config: TrainerConfig):
        from torch.distributed.device_mesh import init_device_mesh
        from transformers import AutoModelForCausalLM

        self.config = config
        self.model_dir = Path(model_dir)
        if not (self.model_dir / "config.json").is_file():
            raise ModelError(f"{str(self.model_dir)!r} has no config.json; expected an HF model directory")
        self.rank, self.world_size, self.device = init_distributed()
        torch.manual_seed(config.seed)
        on_gpu = self.device.type == "cuda"
        if config.dtype == "auto":
            self.compute_dtype = torch.bfloat16 if on_gpu and torch.cuda.is_bf16_supported() else torch.float32
        else:
            self.compute_dtype = getattr(torch, config.dtype)
        attn = config.attn_implementation
        if attn == "auto":
            from transformers.utils import is_flash_attn_2_available

            # varlen kernels need a 16-bit compute dtype; otherwise the packed row gets a mask
            half = self.compute_dtype in (torch.bfloat16, torch.float16)
            attn = "flash_attention_2" if on_gpu and half and is_flash_attn_2_available() else SEGMENT_ATTENTION
        if attn == SEGMENT_ATTENTION:
            register_segment_attention()
        self.attn_implementation = attn
        # a shared prefix is written in the position ids, which only our segment attention and
        # an explicit mask read (varlen kernels take every restart at 0 for a new sequence)
        self.share_prefix = config.share_prefix and (attn == SEGMENT_ATTENTION or attn not in VARLEN_ATTENTION)
        self.mesh = init_device_mesh(self.device.type, (self.world_size,))

        self.model = self._load(AutoModelForCausalLM, trainable=True)
        self.pad_id = self.model.config.pad_token_id or 0
        # with LoRA only the adapters require grad: nothing else gets a gradient or AdamW state
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=config.lr, betas=tuple(config.betas), eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
        warm = config.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, functools.partial(
            warmup_cosine, warmup_steps=warm, total_steps=warm + config.total_steps, min_ratio=config.min_lr_ratio))
        self.ref_model = self._load(AutoModelForCausalLM, trainable=False) if config.loss.kl_coef > 0 else None
        self.objective = resolve_objective(config.loss.kind)
        self.version = 0  # train steps done: the policy version of the current weights
        self.optimizer_steps = 0
        self.skipped_steps = 0

    # ------------------------------------------------------------------ setup

    def _load(self, auto_cls, *, trainable: bool, lora_task: str | None = None) -> torch.nn.Module:
        """Rank 0 reads the checkpoint; the other ranks build the model on the meta device (no
        memory) and receive their shards and the buffers from rank 0 after sharding. The trained
        model gets its LoRA adapters (``trainer.lora``; ``lora_task``: peft's task type for a
        model that is not a causal LM) here, before sharding, on every rank; rank 0's initial
        adapter weights are the ones every rank receives."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from transformers import AutoConfig

        full_state: dict[str, torch.Tensor] = {}
        try:
            if self.rank == 0:
                model = auto_cls.from_pretrained(str(self.model_dir), dtype=torch.float32,
                                                 attn_implementation=self.attn_implementation)
                full_state = dict(model.state_dict())
            else:
                config = AutoConfig.from_pretrained(str(self.model_dir))
                with torch.device("meta"):
                    model = auto_cls.from_config(config, dtype=torch.float32,
                                                 attn_implementation=self.attn_implementation)
        except (OSError, ValueError) as e:
            raise ModelError(f"cannot load a causal LM from {str(self.model_dir)!r}: {e}") from e
        model.config.use_cache = False
        if trainable and self.config.lora.enabled:
            from agentrl.trainer.lora import apply_lora

            model = apply_lora(model, self.config.lora, task_type=lora_task)
            if self.rank == 0:
                full_state = dict(model.state_dict())
        if trainable and self.config.gradient_checkpointing:
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
                model.activation_checkpointing_enable({"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if not trainable:
            model.eval().requires_grad_(False)
        if self.rank == 0:
            model.to(self.device)
        mp = MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
        blocks = set(getattr(model, "_no_split_modules", None) or [])
        for module in model.modules():
            if type(module).__name__ in blocks:
                fully_shard(module, mesh=self.mesh, mp_policy=mp)
        fully_shard(model, mesh=self.mesh, mp_policy=mp)
        if self.world_size > 1:
            if self.rank != 0:
                model.to_empty(device=self.device)
            set_model_state_dict(model, full_state, options=StateDictOptions(
                full_state_dict=True, broadcast_from_rank0=True))
            for buf in model.buffers():  # rotary frequencies etc.: not in the state dict
                dist.broadcast(buf, src=0)
        return model

    # ------------------------------------------------------------------ forward

    def _mini_batches(self, batch: TrainBatch) -> list[list[int]]:
        n = len(batch)
        k = min(self.config.num_mini_batches, n)
        bounds = [round(i * n / k) for i in range(k + 1)]
        return [list(range(bounds[i], bounds[i + 1])) for i in range(k)]

    def _micro_batches(self, batch: TrainBatch, indices: list[int]) -> list[list[Unit]]:
        """This rank's micro-batches of the mini-batch ``indices`` (global indices), as units:
        a sequence, or a group's sequences behind their shared prefix (``trainer.share_prefix``)."""
        groups = batch.groups if self.share_prefix else None
        units = shared_prefix_units(batch.sequences, indices, groups, self.config.micro_batch_tokens)
        return plan_units(units, self.world_size, self.config.micro_batch_tokens)[self.rank]

    def _forward(self, model, batch: TrainBatch, mb: list[Unit], *, with_entropy: bool = False):
        """Packed forward of micro-batch ``mb``; returns (packed, token logprobs [T], entropy)."""
        packed = pack(batch.sequences, mb)
        ids = packed.input_ids.to(self.device)
        pos = packed.position_ids.to(self.device)
        mask = packed.attention_mask(self.attn_implementation, self.compute_dtype)
        logits = model(input_ids=ids, position_ids=pos,
                       attention_mask=None if mask is None else mask.to(self.device),
                       use_cache=False).logits
        logp, ent = token_logprobs(logits, ids, packed.sources.to(self.device), with_entropy=with_entropy)
        return packed, logp[0], None if ent is None else ent[0]

    def _dummy_forward(self, model) -> torch.Tensor:
        """A one-token forward for a rank with no work left, keeping FSDP's collectives in step."""
        ids = torch.full((1, 1), self.pad_id, dtype=torch.long, device=self.device)
        return model(input_ids=ids, use_cache=False).logits.sum() * 0.0

    def _iter_rank_micro_batches(self, batch: TrainBatch) -> Iterator[list[Unit]]:
        for indices in self._mini_batches(batch):
            yield from self._micro_batches(batch, indices)

    def compute_logprobs(self, batch: TrainBatch, *, reference: bool = False) -> dict[int, torch.Tensor]:
        """Token-aligned log-probabilities (float32, CPU) under the current weights — or the
        frozen reference model — for the sequences this rank trains on; {batch index: [len]}.
        A collective: every rank calls it with the same batch."""
        return {i: lp for i, (lp, _) in self._token_pass(batch, reference=reference).items()}

    def compute_token_stats(self, batch: TrainBatch) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Like ``compute_logprobs`` (current weights), with each token's entropy beside its
        log-probability (of the distribution that predicted it; 0 on the first token)."""
        return self._token_pass(batch, with_entropy=True)

    @torch.no_grad()
    def _token_pass(self, batch: TrainBatch, *, reference: bool = False,
                    with_entropy: bool = False) -> dict[int, tuple[torch.Tensor, torch.Tensor | None]]:
        model = self.ref_model if reference else self.model
        if model is None:
            raise TrainerError("compute_logprobs(reference=True) needs trainer.loss.kl_coef > 0")
        model.eval()  # π_prox without dropout; train_step switches back
        out: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
        for mb in self._iter_rank_micro_batches(batch):
            if not mb:
                self._dummy_forward(model)
                continue
            packed, logp, ent = self._forward(model, batch, mb, with_entropy=with_entropy)
            ents = packed.split(ent.float().cpu()) if ent is not None else [None] * len(packed.indices)
            for i, lp, e in zip(packed.indices, packed.split(logp.float().cpu()), ents, strict=True):
                out[i] = (lp, e)
        return out

    # ------------------------------------------------------------------ update

    def train_step(self, batch: TrainBatch, *, token_stats: int = 0) -> dict[str, float]:
        """One policy update over ``batch`` (a collective); returns reduced statistics.

        ``token_stats=n``: also keep, in ``last_token_stats``, what ``compute_token_stats`` gives
        for the first ``n`` sequences under the weights before the update (the run's logged
        samples). A batch of one mini-batch takes them from the update's own forward pass
        (those of the sequences this rank trains on); otherwise a pass of its own runs first."""
        cfg = self.config
        self.last_token_stats: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        stats: dict[str, float] = {f"batch/{k}": v for k, v in batch.stats.items()}
        if len(batch) == 0 or batch.num_loss_tokens == 0:
            # No weight changes, but the step counts: the version is the number of steps taken,
            # which the rollout side's staleness accounting (accepted batches) relies on.
            warnings.warn("train_step got a batch without loss tokens; no update this step "
                          "(see the batch/* counters for why)", RuntimeWarning, stacklevel=2)
            self.version += 1
            stats.update(empty_batch=1.0, version=float(self.version))
            return stats
        minis = self._mini_batches(batch)
        keep = token_stats if len(minis) == 1 else 0  # the forward of a lone mini-batch is pre-update
        if token_stats and not keep:
            self.last_token_stats = self.compute_token_stats(TrainBatch(batch.sequences[:token_stats], batch.version))
        # ppo anchors on π_behav and reinforce has no ratio: neither needs π_prox unless the mismatch
        # correction compares the engine with it
        needs_prox = cfg.loss.kind not in ("ppo", "reinforce") or cfg.loss.mismatch.mode != "off"
        prox = None
        if needs_prox and len(minis) > 1:
            prox = self.compute_logprobs(batch)
        ref = self.compute_logprobs(batch, reference=True) if self.ref_model is not None else None

        self.model.train()
        sums: dict[str, float] = {}
        maxes: dict[str, float] = {}
        grad_norms, skipped = [], 0
        for indices in minis:
            n_tokens = batch.loss_tokens(indices)
            if n_tokens == 0:
                continue
            n_seqs = batch.loss_sequences(indices)
            for mb in self._micro_batches(batch, indices):
                if not mb:
                    (self._dummy_forward(self.model)).backward()
                    continue
                packed, logp, ent = self._forward(self.model, batch, mb, with_entropy=True)
                if keep and min(packed.indices) < keep:
                    lps, ents = packed.split(logp.detach().float().cpu()), packed.split(ent.detach().float().cpu())
                    self.last_token_stats.update((i, (lp, e)) for i, lp, e in zip(packed.indices, lps, ents, strict=True)
                                                 if i < keep)
                f = packed.fields
                mask = f["loss_mask"].to(self.device)
                prox_t = (packed.join([prox[i] for i in packed.indices]).to(self.device)
                          if prox is not None else logp.detach())
                ref_t = packed.join([ref[i] for i in packed.indices]).to(self.device) if ref is not None else None
                segments = packed.segment_ids().to(self.device)
                inputs = LossInputs(
                    logp, prox_t, f["behaviour_logprobs"].to(self.device), f["advantages"].to(self.device), mask,
                    segments, aggregation_weights(mask, segments, aggregation=cfg.loss.aggregation,
                                                  total_loss_tokens=n_tokens, total_sequences=n_seqs),
                    total_loss_tokens=n_tokens,
                    # π_prox is a recomputation before the update: a forward pass of its own, or this one
                    token_staleness=(f["staleness"].to(self.device)
                                     if "staleness" in f and (prox is not None or len(minis) == 1) else None),
                    teacher_logprobs=f["teacher_logprobs"].to(self.device) if "teacher_logprobs" in f else None)
                loss, st = objective_loss(inputs, cfg.loss, ref_logprobs=ref_t, objective=self.objective,
                                          distill=cfg.distill)
                (loss * self.world_size).backward()
                st["loss"] = loss.detach()
                st["entropy"] = (ent * mask).sum() / n_tokens
                for k, v in st.items():
                    if k.endswith("_max"):
                        maxes[k] = max(maxes.get(k, -math.inf), float(v))
                    else:
                        sums[k] = sums.get(k, 0.0) + float(v)
            norm = self._clip_grad_norm()
            grad_norms.append(norm)
            if math.isfinite(norm):
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer_steps += 1
            else:
                skipped += 1
                warnings.warn(f"gradient norm is {norm}; the optimizer step is skipped",
                              RuntimeWarning, stacklevel=2)
            self.optimizer.zero_grad(set_to_none=True)
        self.skipped_steps += skipped
        self.version += 1
        stats.update(self._reduce(sums, maxes, len(minis)))
        stats.update(
            grad_norm=sum(grad_norms) / max(1, len(grad_norms)),
            lr=self.scheduler.get_last_lr()[0],
            skipped_steps=float(skipped),
            optimizer_steps=float(self.optimizer_steps),
            version=float(self.version),
        )
        return stats

    def _clip_grad_norm(self) -> float:
        max_norm = self.config.grad_clip if self.config.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm, foreach=True)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        return float(norm)

    def _reduce(self, sums: dict[str, float], maxes: dict[str, float], num_minis: int) -> dict[str, float]:
        """Sum the token-normalized statistics over ranks (and average over mini-batches); keys
        ending in ``_max`` take the max. Every rank reduces the union of the keys, also a rank
        that only ran empty micro-batches (a user's objective may return any keys)."""
        names: list = [None] * self.world_size
        dist.all_gather_object(names, (sorted(sums), sorted(maxes)))
        keys = sorted({k for s, _ in names for k in s})
        mkeys = sorted({k for _, m in names for k in m})
        # NCCL reduces device tensors only (float64 is fine on both backends)
        t = torch.tensor([sums.get(k, 0.0) for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        out = {k: float(v) / num_minis for k, v in zip(keys, t.cpu().tolist(), strict=True)}
        if mkeys:
            m = torch.tensor([maxes.get(k, -math.inf) for k in mkeys], dtype=torch.float64, device=self.device)
            dist.all_reduce(m, op=dist.ReduceOp.MAX)
            out.update(zip(mkeys, m.cpu().tolist(), strict=True))
        if "mismatch/weight_sq_mean" in out:  # the weights' spread, from their first two moments
            mean = out["mismatch/weight_mean"]
            out["mismatch/weight_std"] = math.sqrt(max(0.0, out.pop("mismatch/weight_sq_mean") - mean * mean))
        if "mismatch/fresh_log_ratio_abs_sum" in out:  # the gap on fresh tokens: the engine-trainer mismatch alone
            fresh = out["mismatch/fresh_frac"]
            gap = out.pop("mismatch/fresh_log_ratio_abs_sum")
            if fresh > 0:
                out["mismatch/fresh_log_ratio_abs_mean"] = gap / fresh
        return out
