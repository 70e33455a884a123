"""LoRA: the trained policy as frozen base weights plus low-rank adapters, built on peft.

What it is: ``apply_lora`` wraps an HF causal LM in peft's ``PeftModel`` (before FSDP2 shards
it, so every rank wraps the same modules) and freezes all but the adapters' ``lora_A``/``lora_B``
— so only they get gradients and AdamW state; ``merge_adapter`` lays an adapter directory into its
base model with peft's ``merge_and_unload`` and writes a plain HF checkpoint (``agentrl model
merge``). The adapter's files themselves (peft's ``adapter_config.json`` +
``adapter_model.safetensors``) are written by ``agentrl.trainer.checkpoint.export_adapter``.

What it is not: the settings (``trainer_config.LoraConfig``), nor the server's side: ``agentrl
serve`` merges an adapter into its own fused weights without peft (``agentrl.inference.lora_adapter``).

Main hooks: ``apply_lora(model, LoraConfig(rank=16))``, ``merge_adapter(adapter_dir, out_dir)``.
peft comes with the ``lora`` extra.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from agentrl.api import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from agentrl.errors import ModelError
from agentrl.output_dir import claim_output_dir, replace_dir, staging_dir
from agentrl.plugins import import_optional
from agentrl.trainer.trainer_config import LoraConfig


def peft_module() -> Any:
    return import_optional("peft", extra="lora", purpose="trainer.lora")


def apply_lora(model: torch.nn.Module, config: LoraConfig, *, task_type: str | None = None) -> torch.nn.Module:
    """``model`` wrapped in a ``PeftModel`` with an adapter on each of ``config.target_modules``
    (B starts at zero: the wrapped model computes what ``model`` did); only adapters train.

    ``task_type``: peft's, for a model that is not a causal LM — ``"TOKEN_CLS"`` for the critic's
    value model, whose new head (``score``/``classifier``) peft then trains in full beside the
    adapters (its ``modules_to_save``)."""
    peft = peft_module()
    peft_config = peft.LoraConfig(r=config.rank, lora_alpha=config.alpha, lora_dropout=config.dropout,
                                  target_modules=list(config.target_modules), bias="none", task_type=task_type)
    try:
        wrapped = peft.get_peft_model(model, peft_config)
    except ValueError as e:  # no module of that name in this architecture
        raise ModelError(f"trainer.lora: peft cannot wrap this model: {e}") from e
    for name, p in wrapped.named_parameters():
        p.requires_grad_(".lora_A." in name or ".lora_B." in name or ".modules_to_save." in name)
    return wrapped


def is_lora(model: torch.nn.Module) -> bool:
    """Whether ``model`` is an ``apply_lora`` model (its publishes and exports are adapters)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def adapter_metadata(model: torch.nn.Module) -> dict[str, Any]:
    """What a server needs besides an ``apply_lora`` model's adapter tensors to apply them (the
    ``lora_config`` of ``DistributedTransport``'s broadcast): peft's ``r``, ``lora_alpha``,
    ``target_modules`` and ``use_rslora``."""
    config = model.peft_config["default"]
    return {"peft_type": "LORA", "r": int(config.r), "lora_alpha": float(config.lora_alpha),
            "target_modules": sorted(config.target_modules), "use_rslora": bool(config.use_rslora)}


def find_adapter(path: str | Path) -> Path:
    """The adapter directory ``path`` names: an adapter directory itself, a LoRA checkpoint
    (``<step>/trainer/adapter``, also given as ``<step>/trainer``) or a run directory (its latest
    checkpoint's adapter)."""
    p = Path(path)
    latest = p / "checkpoints" / "latest"
    step = p / "checkpoints" / latest.read_text().strip() if latest.is_file() else None
    for candidate in (p, p / "adapter", p / "trainer" / "adapter", *([step / "trainer" / "adapter"] if step else [])):
        if (candidate / ADAPTER_CONFIG).is_file():
            return candidate
    raise ModelError(f"{str(p)!r} holds no LoRA adapter: expected an adapter directory ({ADAPTER_CONFIG} + "
                     f"{ADAPTER_WEIGHTS}), a LoRA run's checkpoint (RUN_DIR/checkpoints/step_N) or its run directory")


def adapter_base(adapter_dir: str | Path) -> str:
    """The base model directory an adapter was trained on (its ``base_model_name_or_path``)."""
    path = Path(adapter_dir) / ADAPTER_CONFIG
    try:
        base = json.loads(path.read_text()).get("base_model_name_or_path")
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: not a readable peft adapter config ({type(e).__name__})") from None
    if not isinstance(base, str) or not base:
        raise ModelError(f"{path} names no base_model_name_or_path; pass the base model directory (--base)")
    return base


def merge_adapter(adapter_dir: str | Path, out_dir: str | Path, *, base_dir: str | Path | None = None,
                  dtype: torch.dtype = torch.float32, force: bool = False) -> Path:
    """Load ``base_dir`` (default: the adapter's ``base_model_name_or_path``), apply the adapter
    with peft, merge it (``merge_and_unload``) and write a plain HF checkpoint — weights,
    ``config.json`` and the base's tokenizer files — at ``out_dir``. ``out_dir`` may not be the
    adapter, the base or a parent of either, nor a non-empty directory unless ``force``
    (``agentrl.output_dir``); the checkpoint is built beside it and renamed into place."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    peft = peft_module()
    adapter = Path(adapter_dir)
    if not (adapter / ADAPTER_CONFIG).is_file():
        raise ModelError(f"{str(adapter)!r} has no {ADAPTER_CONFIG}; pass a LoRA adapter directory (a LoRA run's "
                         "checkpoint has one in trainer/adapter)")
    base = Path(base_dir) if base_dir is not None else Path(adapter_base(adapter))
    if not (base / "config.json").is_file():
        raise ModelError(f"the base model {str(base)!r} has no config.json; pass the model the adapter was "
                         "trained on (--base)")
    out = claim_output_dir(out_dir, inputs=(adapter, base), force=force)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=dtype)
    try:
        merged = peft.PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    except (ValueError, RuntimeError, KeyError) as e:  # shapes or names of another architecture
        raise ModelError(f"cannot apply the adapter {str(adapter)!r} to {str(base)!r}: {e}") from e
    broken = [name for name, t in merged.state_dict().items() if t.is_floating_point() and not t.isfinite().all()]
    if broken:  # agentrl serve refuses such an adapter too
        raise ModelError(f"merging {str(adapter)!r} into {str(base)!r} gives non-finite weights ({broken[0]}"
                         f"{f' and {len(broken) - 1} more' if len(broken) > 1 else ''}): the adapter or the base "
                         "holds NaN or inf; merge a checkpoint from before the run diverged")
    tmp = staging_dir(out)
    try:
        merged.save_pretrained(str(tmp))
        AutoTokenizer.from_pretrained(str(base)).save_pretrained(str(tmp))  # and its chat template
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # our own staging directory
        raise
    return replace_dir(tmp, out)
