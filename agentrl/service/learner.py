"""Learner: one base model, many LoRA adapters, each with its own AdamW — the Tinker service's trainer.

What it is: the base model loaded once (frozen, float32) and wrapped by peft with one named
adapter per training client (``create``); a client's calls activate its adapter and touch only
its tensors: ``forward_backward`` (a padded batch of its datums, the loss of
``agentrl.trainer.tinker_losses`` summed over datums, gradients accumulated in its adapter until
its next ``optim_step``), ``optim_step`` (its own AdamW with the SDK's ``AdamParams``: learning
rate, β1, β2, ε, decoupled weight decay and an optional global-norm clip), ``export`` (peft's
adapter files, which ``agentrl serve`` loads per request), ``save_state`` / ``load_state``
(adapter, optimizer state and settings) and ``drop`` (frees it).

Calls run one at a time on one worker thread (``agentrl.service.futures``), so an adapter is never
activated under another call. A bad datum is refused (``Refused``, 400) before the forward pass:
no gradient of a refused call is left behind, and the other clients' adapters are never touched.

What it is not: FSDP. The service trains in one process on one device (``device``: cpu, cuda,
or auto; the base model is shared by every client, so its memory is paid once); ``agentrl
train`` is the sharded trainer. On a GPU it still trains in float32 (written for it, not yet
run there). LoRA goes on the attention and MLP projections; ``train_unembed`` (the SDK's default
is true) is not served — agentrl serve's adapters cover q/k/v/o/gate/up/down only — and a client
that asks for it gets the others, with a warning in the service's log.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl.api import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from agentrl.errors import ModelError, Refused
from agentrl.service.proto import ForwardBackward
from agentrl.trainer.lora import peft_module
from agentrl.trainer.tinker_losses import NOT_SERVED, REQUIRED, REQUIRED_CONFIG, TINKER_LOSSES, tinker_loss

log = logging.getLogger(__name__)

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
OPTIMIZER_FILE = "optimizer.pt"
SETTINGS_FILE = "lora_settings.json"


@dataclass
class LoraSettings:
    """What a client asked for at ``create_model`` (the SDK's ``LoraConfig``)."""

    rank: int
    seed: int | None = None
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True

    def targets(self) -> list[str]:
        return [*(ATTN if self.train_attn else ()), *(MLP if self.train_mlp else ())]


class Learner:
    """The shared base model and every client's adapter and optimizer (see the module)."""

    def __init__(self, model_dir: str | Path, *, max_rank: int = 128, device: str = "cpu") -> None:
        from transformers import AutoModelForCausalLM

        self.model_dir = Path(model_dir)
        if not (self.model_dir / "config.json").is_file():
            raise ModelError(f"{str(self.model_dir)!r} has no config.json; pass an HF model directory (--model)")
        self.device = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                                   "cpu" if device == "auto" else device)
        base = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=torch.float32).to(self.device)
        base.requires_grad_(False)
        self.vocab_size = int(base.config.vocab_size)
        self.pad_id = int(base.config.pad_token_id or 0)
        self.max_rank = max_rank
        self.base = base
        self.model: Any = None  # the PeftModel, made with the first adapter
        self.settings: dict[str, LoraSettings] = {}
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.names: dict[str, str] = {}  # model_id -> peft adapter name
        self._count = 0

    # ----------------------------------------------------------------------- adapters
    def create(self, model_id: str, settings: LoraSettings) -> None:
        """A new adapter for ``model_id`` (B = 0: it starts as the base model) and its AdamW."""
        if not 1 <= settings.rank <= self.max_rank:
            raise Refused(f"lora rank must be between 1 and {self.max_rank}, got {settings.rank}")
        if not settings.targets():
            raise Refused("train_attn and train_mlp are both false: LoRA here goes on attention or MLP "
                          "projections; set at least one")
        peft = peft_module()
        config = peft.LoraConfig(r=settings.rank, lora_alpha=settings.rank, lora_dropout=0.0,
                                 target_modules=settings.targets(), bias="none")
        self._count += 1
        name = f"client{self._count}"
        torch.manual_seed(settings.seed if settings.seed is not None else self._count)
        if self.model is None:
            self.model = peft.get_peft_model(self.base, config, adapter_name=name)
        else:
            self.model.add_adapter(name, config)
        self.names[model_id], self.settings[model_id] = name, settings
        if settings.train_unembed:
            log.warning("training client %s asked for train_unembed: not served here (no LoRA on the unembedding); "
                        "its adapter covers %s", model_id, settings.targets())
        self._activate(model_id)
        self.optimizers[model_id] = torch.optim.AdamW(self._params(model_id), lr=1e-4)

    def drop(self, model_id: str) -> None:
        """Free ``model_id``'s adapter and optimizer."""
        name = self.names.pop(model_id, None)
        self.settings.pop(model_id, None)
        self.optimizers.pop(model_id, None)
        if name is not None and self.names:
            self.model.delete_adapter(name)

    def _activate(self, model_id: str) -> None:
        if model_id not in self.names:
            raise Refused(f"no training client {model_id!r} on this service (it was never created, or its "
                          "TTL passed); create one with create_lora_training_client", 404)
        self.model.set_adapter(self.names[model_id])

    def _params(self, model_id: str) -> list[torch.nn.Parameter]:
        tag = f".{self.names[model_id]}."
        return [p for n, p in self.model.named_parameters() if tag in n and (".lora_A" in n or ".lora_B" in n)]

    # ----------------------------------------------------------------------- training
    def forward_backward(self, fb: ForwardBackward) -> tuple[list[dict[str, Any]], dict[str, float]]:
        """The loss's gradient added to the client's adapter (none with ``forward_only``);
        returns each datum's ``logprobs`` and the metric ``loss:sum``."""
        inputs = self._check(fb)
        self._activate(fb.model_id)
        longest = max(len(d.tokens) for d in fb.data)
        ids = torch.full((len(fb.data), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, d in enumerate(fb.data):
            ids[i, :len(d.tokens)] = torch.tensor(d.tokens)
            mask[i, :len(d.tokens)] = 1
        self.model.train(not fb.forward_only)
        with torch.set_grad_enabled(not fb.forward_only):
            logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits.float()
            logp = torch.log_softmax(logits, dim=-1)
            total = torch.zeros((), device=self.device)
            outputs = []
            for i, (d, named) in enumerate(zip(fb.data, inputs, strict=True)):
                n = len(d.tokens)
                named = {k: v.to(self.device) for k, v in named.items()}
                target = logp[i, :n].gather(-1, named.pop("target_tokens").long().unsqueeze(-1)).squeeze(-1)
                total = total + tinker_loss(fb.loss_fn, target, named, fb.loss_fn_config)
                outputs.append({"logprobs": target.detach().cpu().numpy().astype("float32")})
        if not fb.forward_only:
            total.backward()
        return outputs, {"loss:sum": float(total.detach())}

    def _check(self, fb: ForwardBackward) -> list[dict[str, torch.Tensor]]:
        """Each datum's loss inputs as tensors, or a ``Refused`` naming the first wrong one."""
        if fb.loss_fn in NOT_SERVED:
            raise Refused(f"loss_fn {fb.loss_fn!r} is not served here: {NOT_SERVED[fb.loss_fn]}")
        if fb.loss_fn not in TINKER_LOSSES:
            raise Refused(f"loss_fn {fb.loss_fn!r} is not served here; use one of {list(TINKER_LOSSES)} "
                          "(or forward_backward_custom, which runs on the client)")
        for key in REQUIRED_CONFIG.get(fb.loss_fn, ()):
            if not isinstance(fb.loss_fn_config.get(key), float):
                raise Refused(f"loss {fb.loss_fn} needs a number in loss_fn_config[{key!r}] (e.g. "
                              f"loss_fn_config={{{key!r}: 0.05}}), got {fb.loss_fn_config.get(key)!r}")
        if not fb.data:
            raise Refused("forward_backward got no data; send at least one Datum")
        out = []
        for i, d in enumerate(fb.data):
            n = len(d.tokens)
            if n == 0 or min(d.tokens) < 0 or max(d.tokens) >= self.vocab_size:
                raise Refused(f"datum {i}: model_input must hold 1 or more token ids in [0, {self.vocab_size})")
            named = {}
            for key in REQUIRED[fb.loss_fn]:
                value = d.inputs.get(key)
                if value is None or value.shape != (n,):
                    got = "nothing" if value is None else f"shape {tuple(value.shape)}"
                    raise Refused(f"datum {i}: loss {fb.loss_fn} needs loss_fn_inputs[{key!r}] of shape ({n},) "
                                  f"(one per input token), got {got}")
                named[key] = torch.from_numpy(value.copy()).float() if key != "target_tokens" else torch.from_numpy(value.astype("int64"))
            if named["target_tokens"].min() < 0 or named["target_tokens"].max() >= self.vocab_size:
                raise Refused(f"datum {i}: target_tokens must be token ids in [0, {self.vocab_size})")
            if any(not torch.isfinite(v).all() for k, v in named.items() if k != "target_tokens"):
                raise Refused(f"datum {i}: loss_fn_inputs hold a NaN or an infinity")
            out.append(named)
        return out

    def optim_step(self, model_id: str, adam: dict[str, float]) -> dict[str, float]:
        """One AdamW step of the client's adapter with the SDK's ``AdamParams``; clears its gradient."""
        self._activate(model_id)
        params, optimizer = self._params(model_id), self.optimizers[model_id]
        for group in optimizer.param_groups:
            group.update(lr=adam["learning_rate"], betas=(adam["beta1"], adam["beta2"]), eps=adam["eps"],
                         weight_decay=adam["weight_decay"])
        grads = [p.grad for p in params if p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) if grads else 0.0
        if adam["grad_clip_norm"] > 0 and grads:
            torch.nn.utils.clip_grad_norm_(params, adam["grad_clip_norm"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": norm, "learning_rate": adam["learning_rate"]}

    # ----------------------------------------------------------------------- files
    def export(self, model_id: str, out_dir: Path) -> Path:
        """The adapter in peft's format (``adapter_config.json`` + ``adapter_model.safetensors``)."""
        from safetensors.torch import save_file

        peft = peft_module()
        name = self.names[model_id]
        tensors = peft.get_peft_model_state_dict(self.model, adapter_name=name)
        tmp = out_dir.with_name(out_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_file({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}, str(tmp / ADAPTER_WEIGHTS),
                  metadata={"format": "pt"})
        config = self.model.peft_config[name].to_dict()
        config.update(base_model_name_or_path=str(self.model_dir.resolve()), target_modules=sorted(config["target_modules"]))
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, default=str))
        (tmp / SETTINGS_FILE).write_text(json.dumps(asdict(self.settings[model_id])))
        tmp.rename(out_dir)
        return out_dir

    def save_state(self, model_id: str, out_dir: Path) -> Path:
        """``export`` plus the optimizer's state: what ``load_state`` resumes from."""
        self._activate(model_id)
        tmp = out_dir.with_name(out_dir.name + ".state")
        shutil.rmtree(tmp, ignore_errors=True)
        self.export(model_id, tmp)
        torch.save(self.optimizers[model_id].state_dict(), tmp / OPTIMIZER_FILE)
        tmp.rename(out_dir)
        return out_dir

    def load_state(self, model_id: str, state_dir: Path, *, optimizer: bool) -> None:
        """Lay a saved state's adapter into ``model_id`` (created first when it does not exist);
        with ``optimizer`` its AdamW state too, else a fresh AdamW."""
        from safetensors.torch import load_file

        peft = peft_module()
        if not (state_dir / ADAPTER_WEIGHTS).is_file() or not (state_dir / SETTINGS_FILE).is_file():
            raise Refused(f"{state_dir.name!r} holds no saved state of this service; pass a path that "
                          "save_state returned", 404)
        saved = LoraSettings(**json.loads((state_dir / SETTINGS_FILE).read_text()))
        if model_id not in self.names:
            self.create(model_id, saved)
        elif saved.rank != self.settings[model_id].rank or saved.targets() != self.settings[model_id].targets():
            raise Refused(f"the saved state has LoRA rank {saved.rank} on {saved.targets()}, this client "
                          f"rank {self.settings[model_id].rank} on {self.settings[model_id].targets()}; "
                          "load it into a new training client (create_training_client_from_state)")
        self._activate(model_id)
        result = peft.set_peft_model_state_dict(self.model, load_file(str(state_dir / ADAPTER_WEIGHTS),
                                                                      device=str(self.device)),
                                                adapter_name=self.names[model_id])
        if getattr(result, "unexpected_keys", None):
            raise Refused(f"the saved state holds tensors this model has no place for: {result.unexpected_keys[:3]}")
        if optimizer:
            if not (state_dir / OPTIMIZER_FILE).is_file():
                raise Refused(f"{state_dir.name!r} was saved for sampling and holds no optimizer state; load "
                              "it with optimizer=False, or pass a save_state path", 400)
            self.optimizers[model_id].load_state_dict(torch.load(state_dir / OPTIMIZER_FILE, weights_only=True,
                                                                 map_location=self.device))
        else:  # weights only: Adam starts afresh, as the SDK's load_state says
            self.optimizers[model_id] = torch.optim.AdamW(self._params(model_id), lr=1e-4)
