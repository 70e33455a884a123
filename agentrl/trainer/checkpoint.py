"""Checkpoints: resumable sharded training state, and HF-format exports of the weights.

What it is: ``save_checkpoint``/``load_checkpoint`` write and restore everything a resumed run
needs to continue as if never stopped — model and optimizer shards (torch.distributed.checkpoint,
one file per rank, reshardable), the LR schedule, each rank's RNG state and the step counters;
and ``export_hf``, which gathers the full weights to rank 0 and writes a directory that
``transformers.AutoModelForCausalLM.from_pretrained``, ``agentrl serve`` and SGLang load
(``model.safetensors`` + ``config.json`` + the tokenizer files of the source model), or for a
LoRA model ``export_adapter``: the adapter alone in peft's format (``adapter_config.json`` +
``adapter_model.safetensors``, what ``peft.PeftModel.from_pretrained`` and vLLM's and SGLang's
LoRA loaders read).
What it is not: the schedule of when to save (the training loop's), or weight publishing
(``agentrl.trainer.publish``, which uses ``export_hf``).

Main hooks: ``save_checkpoint(actor, dir)``, ``load_checkpoint(actor, dir)``,
``export_hf(model, dir, source_dir=...)``, ``export_adapter(model, dir)``. All are collectives:
every rank calls them.

Layout of a checkpoint directory (written under ``<dir>.tmp`` and renamed when complete, so a
run killed mid-save leaves the previous checkpoint intact and no half-written one)::

    <dir>/dcp/            model + optimizer shards (torch.distributed.checkpoint)
    <dir>/rng_rank{r}.pt  RNG state of rank r
    <dir>/trainer.pt      scheduler state and counters (version, optimizer steps, ...)
    <dir>/adapter/        a LoRA run's adapter in peft's format (``agentrl.trainer.lora``)
    <dir>/meta.json       written last: step counters, world size and the LoRA settings, human-readable

A LoRA run's shards hold the adapters and their optimizer state only: the frozen base is the
run's model directory, which a resume loads again.
"""

from __future__ import annotations

import copy
import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from agentrl.errors import CheckpointError

if TYPE_CHECKING:
    from agentrl.trainer.actor import Actor

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save_checkpoint(actor: Actor, path: str | Path) -> Path:
    """Write ``actor``'s full training state to ``path`` (replacing an older one there)."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    rank = dist.get_rank()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    lora = actor.config.lora.enabled
    try:
        model_sd, optim_sd = _state_dicts(actor)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / "dcp"))
        torch.save(_rng_state(), tmp / f"rng_rank{rank}.pt")
    except (OSError, RuntimeError) as e:
        raise CheckpointError(f"cannot write checkpoint {str(path)!r}: {e}") from e
    if lora:
        export_adapter(actor.model, tmp / "adapter")
    dist.barrier()
    if rank == 0:
        counters = {"version": actor.version, "optimizer_steps": actor.optimizer_steps,
                    "skipped_steps": actor.skipped_steps}
        torch.save({"scheduler": actor.scheduler.state_dict(), **counters}, tmp / "trainer.pt")
        (tmp / "meta.json").write_text(json.dumps({**counters, "world_size": dist.get_world_size(),
                                                   "lora": _lora_meta(actor)}))
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
    dist.barrier()
    return path


def load_checkpoint(actor: Actor, path: str | Path) -> dict:
    """Restore ``actor`` from ``path``; returns the checkpoint's meta (version, steps ...).

    The world size may differ from the saving run's (the shards are resharded); each rank then
    restores the RNG state of the rank with its number if there was one."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    path = Path(path)
    if not (path / "meta.json").is_file():
        hint = " (only a partial <dir>.tmp exists: the save was interrupted)" if path.with_name(
            path.name + ".tmp").exists() else ""
        raise CheckpointError(f"{str(path)!r} is not a complete checkpoint: no meta.json{hint}; "
                              "pass a directory written by save_checkpoint")
    meta = json.loads((path / "meta.json").read_text())
    saved, ours = meta.get("lora"), _lora_meta(actor)
    if saved != ours:
        raise CheckpointError(f"{str(path)!r} was saved with trainer.lora {saved} and this trainer has {ours}; "
                              "resume with the settings the run was saved with")
    try:
        model_sd, optim_sd = _state_dicts(actor)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(path / "dcp"))
        set_state_dict(actor.model, actor.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"], options=_options(actor))
        trainer = torch.load(path / "trainer.pt", weights_only=False)
    except (OSError, RuntimeError, KeyError) as e:
        raise CheckpointError(f"cannot restore checkpoint {str(path)!r}: {e}") from e
    actor.scheduler.load_state_dict(trainer["scheduler"])
    actor.version = trainer["version"]
    actor.optimizer_steps = trainer["optimizer_steps"]
    actor.skipped_steps = trainer["skipped_steps"]
    rng = path / f"rng_rank{dist.get_rank()}.pt"
    if rng.is_file():
        _set_rng_state(torch.load(rng, weights_only=False))
    dist.barrier()
    return meta


def _state_dicts(actor: Actor) -> tuple[dict, dict]:
    """The model's and the optimizer's state dicts as the shards hold them (``_options``)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(actor.model, actor.optimizer, options=_options(actor))
    if actor.config.lora.enabled:  # a tied output layer is the frozen embedding under a second name
        trained = {n for n, p in actor.model.named_parameters(remove_duplicate=False) if p.requires_grad}
        model_sd = {k: v for k, v in model_sd.items() if k in trained}
    return model_sd, optim_sd


def _options(actor: Actor):
    """What the shards hold: everything, or with LoRA the adapters alone (the base is frozen; not
    strict when loading, as the base is not in the shards — ``dcp.load`` still refuses a missing adapter)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    lora = actor.config.lora.enabled
    return StateDictOptions(ignore_frozen_params=lora, strict=not lora)


def _lora_meta(actor: Actor) -> dict | None:
    """The LoRA settings that shape the shards (None without LoRA), as meta.json records them."""
    lora = actor.config.lora
    return {"rank": lora.rank, "target_modules": sorted(lora.target_modules)} if lora.enabled else None


def export_hf(model: torch.nn.Module, out_dir: str | Path, *, source_dir: str | Path,
              dtype: torch.dtype | None = None) -> Path:
    """Gather the full weights and write an HF model directory at ``out_dir`` (rank 0).

    ``source_dir`` is the model directory training started from; its tokenizer and other
    non-weight files (chat template, generation config) are copied. ``dtype`` casts floating
    weights (default: as trained). Tied input/output embeddings are written once. Not for a LoRA
    model: its export is the adapter (``agentrl.trainer.lora``), merged by ``merge_adapter``."""
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if hasattr(model, "peft_config"):
        raise CheckpointError("export_hf writes full models; a LoRA model's export is its adapter "
                              "(agentrl.trainer.lora.export_adapter; merged into an HF model by merge_adapter)")
    out = Path(out_dir)
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        cfg = copy.deepcopy(model.config)
        cfg.use_cache = True
        if getattr(cfg, "tie_word_embeddings", False):
            sd.pop("lm_head.weight", None)
        tensors = {}
        for k, v in sd.items():
            v = v.detach()
            if dtype is not None and v.is_floating_point():
                v = v.to(dtype)
            tensors[k] = v.contiguous().clone()
        if dtype is not None:
            cfg.dtype = dtype

        def write(tmp: Path) -> None:
            save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            cfg.save_pretrained(str(tmp))
            for f in Path(source_dir).iterdir():
                if f.is_file() and f.name != "config.json" and not f.name.endswith(WEIGHT_SUFFIXES):
                    shutil.copy2(f, tmp / f.name)

        _write_dir(out, write, "export HF weights")
    dist.barrier()
    return out


def export_adapter(model: torch.nn.Module, out_dir: str | Path) -> Path:
    """Gather the adapter's full tensors (every rank calls this) and write it on rank 0 in peft's
    format at ``out_dir`` (under ``<out_dir>.tmp``, renamed when complete). Nothing of the
    frozen base is gathered or written."""
    from safetensors.torch import save_file

    from agentrl.api import ADAPTER_WEIGHTS

    out = Path(out_dir)
    tensors = adapter_state(model)
    if tensors is not None:
        def write(tmp: Path) -> None:
            save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
            model.peft_config["default"].save_pretrained(str(tmp))

        _write_dir(out, write, "write the LoRA adapter")
    dist.barrier()
    return out


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """The adapter's full tensors under peft's names (``...q_proj.lora_A.weight``, as
    ``export_adapter`` writes them), on rank 0's CPU; None on the other ranks. Every rank calls
    this (a gather); nothing of the frozen base is gathered."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from agentrl.trainer.lora import peft_module

    peft = peft_module()
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                                              ignore_frozen_params=True))
    if dist.get_rank() != 0:
        return None
    tensors = peft.get_peft_model_state_dict(model, state_dict=sd)
    return {k: v.detach().contiguous().clone() for k, v in tensors.items()}


def _write_dir(out: Path, write: Callable[[Path], None], what: str) -> None:
    """``write`` a directory's files into ``<out>.tmp``, then put it in ``out``'s place: a
    reader (a server loading a published version) never sees half of one."""
    tmp = out.with_name(out.name + ".tmp")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except OSError as e:
        raise CheckpointError(f"cannot {what} to {str(out)!r}: {e}") from e
