"""LoRA adapters for ``agentrl serve``: a peft adapter directory, validated, then either merged
into the served model's fused weights or served beside them, per request.

What it is: ``read_adapter`` (``adapter_config.json`` + ``adapter_model.safetensors``, as peft
writes them and a LoRA run publishes them; ``adapter_of`` takes the same tensors and config as a
broadcast brings them); ``runtime_adapter`` (the adapter laid out per fused
projection, ``LoraWeights``, which ``Decoder.forward`` adds to the rows of the requests that name
it: SGLang's ``/load_lora_adapter`` and a request's ``lora_path``); and ``merge_adapter`` (a new weights dict: each
targeted projection ``W + (B @ A) * scale``, computed as peft's ``merge_and_unload`` does, in
float32, over the *base* weights — the ones the server loaded from a full checkpoint — so
adapter after adapter never accumulates: each update is base + its own delta). The decoder
keeps the base beside what it serves (``Decoder.prepare_weights`` takes an adapter directory
wherever it takes a checkpoint: ``/update_weights_from_disk``).

Validation, before anything is served: the config is a plain LoRA (``peft_type`` LORA, a
positive ``r`` and ``lora_alpha``; no DoRA, biases, ``modules_to_save``, per-module rank or
alpha patterns, ``fan_in_fan_out``); every tensor is the ``lora_A``/``lora_B`` of one of the
served architecture's linear projections (q, k, v, o, gate, up, down), both present, of the
shapes ``[r, in]`` and ``[out, r]``, floating and finite. A refusal is a ``ModelError`` naming
the key or the tensor; the served weights are untouched.

What it is not: the trainer's side (``agentrl.trainer.lora``, built on peft), nor the names
adapters are registered under (``ServerState.loras``).
"""

from __future__ import annotations

import json
import math
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl.api import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from agentrl.errors import ModelError
from agentrl.inference.hf_weights import MERGED_ON, Slot, all_finite, canonical, fused_tensors, with_fused

PROJECTIONS = ("qkv", "o", "gate_up", "down")
"""The fused tensors an adapter may change (the linear projections; not norms, biases or embeddings)."""
TENSOR_NAME = re.compile(r"(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<which>[AB])\.weight")
UNSUPPORTED = {"use_dora": "DoRA", "fan_in_fan_out": "fan_in_fan_out", "modules_to_save": "modules_to_save",
               "rank_pattern": "per-module ranks (rank_pattern)", "alpha_pattern": "per-module alphas (alpha_pattern)",
               "lora_bias": "adapter biases (lora_bias)", "layer_replication": "layer_replication",
               "target_parameters": "target_parameters", "trainable_token_indices": "trainable_token_indices"}


@dataclass
class Adapter:
    """A validated adapter: for each target tensor name (``model.layers.0.self_attn.q_proj.weight``)
    its ``(A [r, in], B [out, r])``, and the scale ``alpha / r`` (``alpha / sqrt(r)`` with rsLoRA)."""

    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]
    scale: float


@dataclass(frozen=True, eq=False)
class LoraWeights:
    """An adapter as ``Decoder.forward`` applies it at run time: for each layer, for each fused
    projection it changes (``qkv``, ``o``, ``gate_up``, ``down``), ``(A [R, in], B [out, R])`` with
    the targets of that projection stacked (R = rank x targets; ``B`` is zero outside each
    target's rows and holds the scale), so that the projection's output gains ``(x @ A.T) @ B.T``.
    ``name`` and ``path`` are what it was loaded as; equality is identity (a request holds the
    adapter it was admitted with, even after the name is unloaded or loaded again)."""

    name: str
    path: str
    layers: tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], ...]


def runtime_adapter(adapter: Adapter, slots: dict[str, Slot], num_layers: int, *, name: str, path: str,
                    device: torch.device, dtype: torch.dtype) -> LoraWeights:
    """``adapter`` as ``LoraWeights`` for the served architecture (``slots``)."""
    by_key: dict[tuple, list[str]] = {}
    for target in adapter.pairs:
        by_key.setdefault(slots[target].key, []).append(target)
    layers: list[dict[str, tuple[torch.Tensor, torch.Tensor]]] = [{} for _ in range(num_layers)]
    out_of: dict[tuple, int] = {}  # a fused tensor's rows: up to its last slot's
    for slot in slots.values():
        out_of[slot.key] = max(out_of.get(slot.key, 0), slot.stop)
    for key, targets in by_key.items():
        _, layer, fused = key
        a = torch.cat([adapter.pairs[t][0].to(torch.float32) for t in targets])
        b = torch.zeros(out_of[key], a.shape[0], dtype=torch.float32)
        col = 0
        for t in targets:
            ta, tb = adapter.pairs[t]
            b[slots[t].start : slots[t].stop, col : col + ta.shape[0]] = tb.to(torch.float32) * adapter.scale
            col += ta.shape[0]
        layers[layer][fused] = (a.to(device=device, dtype=dtype), b.to(device=device, dtype=dtype))
    return LoraWeights(name, path, tuple(layers))


def is_adapter_dir(path: str | Path) -> bool:
    """A peft adapter directory (rather than a full checkpoint)."""
    p = Path(path)
    return (p / ADAPTER_CONFIG).is_file() and not (p / "config.json").is_file()


def read_adapter(adapter_dir: str | Path, slots: dict[str, Slot]) -> Adapter:
    """The adapter at ``adapter_dir``, checked against the served architecture's ``slots``."""
    from safetensors.torch import load_file

    path = Path(adapter_dir)
    config = _read_config(path)
    weights = path / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise ModelError(f"{str(path)!r} has no {ADAPTER_WEIGHTS}; save the adapter with peft's save_pretrained")
    _regular_file(weights)
    try:
        tensors = load_file(str(weights))
    except Exception as e:  # the library's message may quote the file; ours names it
        raise ModelError(f"{weights}: not a readable safetensors file ({type(e).__name__}); re-save the adapter") from None
    return adapter_of(tensors, config, slots, where=str(path), config_at=f"{path}/{ADAPTER_CONFIG}")


def adapter_of(tensors: dict[str, torch.Tensor], config: dict[str, Any], slots: dict[str, Slot], *, where: str,
               config_at: str) -> Adapter:
    """An adapter from its tensors under peft's names and its config (``r``, ``lora_alpha``,
    ``use_rslora``; already through ``check_config``), checked against ``slots``: a directory's
    (``read_adapter``) or a broadcast's (``agentrl.inference.weight_sync``). Errors name
    ``where`` the tensors came from, and ``config_at`` for the config's keys."""
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise ModelError(f"{config_at}: r must be a positive integer, got {str(rank)[:40]}")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha) or alpha <= 0:
        raise ModelError(f"{config_at}: lora_alpha must be a positive number, got {str(alpha)[:40]}")
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        m = TENSOR_NAME.fullmatch(name)
        target = canonical(m.group("module") + ".weight") if m else None
        slot = slots.get(target) if target else None
        if slot is None or slot.key[-1] not in PROJECTIONS:
            raise ModelError(f"{where}: tensor {name[:200]!r} is not the lora_A or lora_B of a linear projection of "
                             "the served architecture")
        halves.setdefault(target, {})[m.group("which")] = t
    if not halves:
        raise ModelError(f"{where}: the adapter holds no lora_A/lora_B tensors")
    pairs = {}
    for target, ab in halves.items():
        if set(ab) != {"A", "B"}:
            raise ModelError(f"{where}: {target!r} has lora_{next(iter(ab))} but not lora_{'AB'.replace(next(iter(ab)), '')}")
        a, b = ab["A"], ab["B"]
        out, inp = slots[target].shape
        for which, t, shape in (("A", a, (rank, inp)), ("B", b, (out, rank))):
            if tuple(t.shape) != shape:
                raise ModelError(f"{where}: lora_{which} of {target!r} has shape {tuple(t.shape)}, expected {shape} "
                                 f"(r={rank})")
            if not t.is_floating_point():
                raise ModelError(f"{where}: lora_{which} of {target!r} has dtype {t.dtype}, expected a floating dtype")
            if not all_finite(t):
                raise ModelError(f"{where}: lora_{which} of {target!r} holds NaN or infinite values")
        pairs[target] = (a, b)
    return Adapter(pairs, scale)


def merge_adapter(adapter: Adapter, base: dict, slots: dict[str, Slot], *,
                  alloc: Callable[[tuple[int, ...]], torch.Tensor]) -> dict:
    """A new weights dict: ``base`` with every targeted projection ``W + (B @ A) * scale`` (in
    float32, then the served dtype), in new fused tensors from ``alloc``; the rest shared with
    ``base``. Raises ``ModelError`` if a merged tensor is not finite."""
    by_key: dict[tuple, list[str]] = {}
    for target in adapter.pairs:
        by_key.setdefault(slots[target].key, []).append(target)
    served = fused_tensors(base, slots)
    fresh: dict[tuple, torch.Tensor] = {}
    for key, targets in by_key.items():
        old = served[key]
        new = alloc(tuple(old.shape))
        new.copy_(old)
        for target in targets:
            slot = slots[target]
            a, b = adapter.pairs[target]
            rows = new[slot.start : slot.stop]
            delta = (b.to(device=rows.device, dtype=torch.float32) @ a.to(device=rows.device, dtype=torch.float32))
            merged = rows.float() + delta * adapter.scale
            if not all_finite(merged):
                raise ModelError(f"the adapter makes {target!r} NaN or infinite once merged")
            rows.copy_(merged)
        fresh[key] = new
    weights = with_fused(base, fresh)
    weights[MERGED_ON] = base
    return weights


MAX_CONFIG_BYTES = 1 << 20
"""The largest ``adapter_config.json`` read (peft's are a few hundred bytes)."""


def _regular_file(file: Path, limit: int | None = None) -> None:
    """Refuse what is not a plain file (a FIFO or a device would hold the reading thread forever)
    or, with ``limit``, one larger than it."""
    try:
        info = file.stat()
    except OSError as e:
        raise ModelError(f"{file}: cannot be read ({type(e).__name__})") from None
    if not stat.S_ISREG(info.st_mode):
        raise ModelError(f"{file} is not a regular file; an adapter directory holds plain files")
    if limit is not None and info.st_size > limit:
        raise ModelError(f"{file} holds {info.st_size:,} bytes, more than an adapter config's {limit:,}")


def _read_config(path: Path) -> dict[str, Any]:
    file = path / ADAPTER_CONFIG
    _regular_file(file, MAX_CONFIG_BYTES)
    try:
        config = json.loads(file.read_bytes())
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ModelError(f"{file}: not a readable JSON adapter config ({type(e).__name__})") from None
    check_config(config, str(file))
    return config


def check_config(config: Any, where: str) -> None:
    """A plain LoRA's config (peft's ``adapter_config.json``, or a broadcast's ``lora_config``):
    ``peft_type`` LORA, none of ``UNSUPPORTED``, bias none. ``ModelError`` naming ``where``."""
    if not isinstance(config, dict):
        raise ModelError(f"{where} must hold a JSON object")
    if config.get("peft_type") != "LORA":
        raise ModelError(f"{where}: peft_type is {str(config.get('peft_type'))[:40]!r}; only LoRA adapters (LORA) "
                         "can be merged by agentrl serve")
    for key, what in UNSUPPORTED.items():
        if config.get(key):
            raise ModelError(f"{where}: {what} ({key}) is not supported by agentrl serve's merge; train a plain LoRA")
    if config.get("bias", "none") != "none":
        raise ModelError(f"{where}: bias {str(config.get('bias'))[:40]!r} is not supported by agentrl serve's merge; "
                         "train with bias 'none'")
