"""Checkpoints for ``agentrl serve``: read, validate, and lay out the weights the decoder runs on.

What it is: ``read_config`` (a checkpoint's ``config.json``, its architecture checked),
``DecoderSpec`` (the shapes that must match for a weight swap), ``layout`` (where each Hugging
Face tensor goes in the decoder's fused layout — q/k/v stacked in one matrix, gate/up in
another), ``check_tensor`` (one tensor's name, shape, dtype and values) and ``load_weights`` /
``assemble`` (a whole checkpoint, or some of its tensors on top of the served weights, into a
*new* weights dict: the served one is never written, so a refused update leaves it serving).

Validation (at start-up and on every update, from disk or over torch.distributed): the
architecture (model type, layers, widths, heads, vocabulary) equals the served one; every
tensor of that architecture is present (``lm_head.weight`` only when untied), no unknown one
is (rotary ``inv_freq`` buffers are ignored), each has its exact shape, a floating dtype and
only finite values. Every refusal is a ``ModelError`` naming the tensor or the file and what
was expected — never quoting a file's contents.

What it is not: the forward pass (``decoder``) or the routes that call this (``native_routes``,
``weight_sync``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl.errors import ModelError

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass(frozen=True)
class DecoderSpec:
    """Shapes and constants of one checkpoint (what must match for a weight swap)."""

    model_type: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_eps: float
    max_positions: int
    qk_norm: bool
    attention_bias: bool


@dataclass(frozen=True)
class Slot:
    """Where one checkpoint tensor goes: rows ``start .. stop`` of the fused tensor at ``key``
    (``("embed",)`` or ``("layers", i, "qkv")``); ``shape`` is the checkpoint tensor's."""

    key: tuple[Any, ...]
    start: int
    stop: int
    shape: tuple[int, ...]


def read_config(model_dir: str | Path):
    """The checkpoint's transformers config, after checking the architecture is supported."""
    from transformers import AutoConfig

    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise ModelError(f"{str(path)!r} has no config.json; pass a Hugging Face checkpoint directory")
    try:
        raw = json.loads((path / "config.json").read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
        where = f" at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
        raise ModelError(f"{path}/config.json is not valid JSON{where}; re-save the checkpoint") from None
    if not isinstance(raw, dict):
        raise ModelError(f"{path}/config.json must hold a JSON object, it holds a {type(raw).__name__}")
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelError(f"model_type {str(model_type)[:40]!r} in {path}/config.json is not supported by the "
                         f"embedded engine (supported: {', '.join(SUPPORTED_MODEL_TYPES)}); serve it with SGLang instead")
    try:
        config = AutoConfig.from_pretrained(str(path))
        spec_of(config)
    except (ModelError, OSError):
        raise
    except Exception as e:  # a field of the wrong type or value
        raise ModelError(f"{path}/config.json is not a valid {model_type} config ({type(e).__name__}); "
                         "re-save it with transformers") from None
    if getattr(config, "use_sliding_window", False):
        raise ModelError(f"{path}: sliding-window attention is not supported by the embedded engine")
    if getattr(config, "mlp_bias", False):
        raise ModelError(f"{path}: MLP biases are not supported by the embedded engine")
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") == "dynamic":
        raise ModelError(f"{path}: dynamic RoPE scaling is not supported by the embedded engine")
    return config


def spec_of(config) -> DecoderSpec:
    heads = config.num_attention_heads
    spec = DecoderSpec(
        model_type=config.model_type,
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_heads=heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        vocab_size=config.vocab_size,
        rms_eps=float(config.rms_norm_eps),
        max_positions=config.max_position_embeddings,
        qk_norm=config.model_type == "qwen3",
        attention_bias=config.model_type == "qwen2" or bool(getattr(config, "attention_bias", False)),
    )
    sizes = ("num_layers", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim",
             "vocab_size", "max_positions")
    for name in sizes:
        value = getattr(spec, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ModelError(f"config.json: {name} must be a positive integer, got {str(value)[:40]}")
    if spec.num_heads % spec.num_kv_heads:
        raise ModelError(f"config.json: num_attention_heads ({spec.num_heads}) must be a multiple of "
                         f"num_key_value_heads ({spec.num_kv_heads})")
    return spec


def layout(spec: DecoderSpec, tied: bool) -> dict[str, Slot]:
    """Every tensor name of the architecture -> its ``Slot`` (``lm_head.weight`` of a tied
    model goes to the embedding, which the output layer shares)."""
    s = spec
    h, q, kv, inter = s.hidden_size, s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.intermediate_size
    out: dict[str, Slot] = {}
    for i in range(s.num_layers):
        p, at = f"model.layers.{i}.", ("layers", i)
        for n, start, stop in (("q", 0, q), ("k", q, q + kv), ("v", q + kv, q + 2 * kv)):
            out[p + f"self_attn.{n}_proj.weight"] = Slot((*at, "qkv"), start, stop, (stop - start, h))
            if s.attention_bias:
                out[p + f"self_attn.{n}_proj.bias"] = Slot((*at, "qkv_bias"), start, stop, (stop - start,))
        out[p + "self_attn.o_proj.weight"] = Slot((*at, "o"), 0, h, (h, q))
        out[p + "mlp.gate_proj.weight"] = Slot((*at, "gate_up"), 0, inter, (inter, h))
        out[p + "mlp.up_proj.weight"] = Slot((*at, "gate_up"), inter, 2 * inter, (inter, h))
        out[p + "mlp.down_proj.weight"] = Slot((*at, "down"), 0, h, (h, inter))
        out[p + "input_layernorm.weight"] = Slot((*at, "ln1"), 0, h, (h,))
        out[p + "post_attention_layernorm.weight"] = Slot((*at, "ln2"), 0, h, (h,))
        if s.qk_norm:
            out[p + "self_attn.q_norm.weight"] = Slot((*at, "q_norm"), 0, s.head_dim, (s.head_dim,))
            out[p + "self_attn.k_norm.weight"] = Slot((*at, "k_norm"), 0, s.head_dim, (s.head_dim,))
    out["model.embed_tokens.weight"] = Slot(("embed",), 0, s.vocab_size, (s.vocab_size, h))
    out["model.norm.weight"] = Slot(("norm",), 0, h, (h,))
    out["lm_head.weight"] = Slot(("embed",) if tied else ("lm_head",), 0, s.vocab_size, (s.vocab_size, h))
    return out


def canonical(name: str) -> str:
    """A checkpoint tensor name with the ``model.`` prefix some exports leave out."""
    return name if name.startswith("model.") or name == "lm_head.weight" else f"model.{name}"


def check_tensor(name: str, tensor: torch.Tensor, slot: Slot | None, where: str) -> None:
    """Refuse (``ModelError`` naming ``name``) a tensor of the wrong shape, dtype or values."""
    if slot is None:
        raise ModelError(f"{where}: tensor {name[:200]!r} is not part of the served architecture")
    if tuple(tensor.shape) != slot.shape:
        raise ModelError(f"{where}: tensor {name!r} has shape {tuple(tensor.shape)}, expected {slot.shape}")
    if tensor.dtype not in FLOAT_DTYPES:
        raise ModelError(f"{where}: tensor {name!r} has dtype {tensor.dtype}, expected a floating dtype "
                         "(float32, float16, bfloat16)")
    if not all_finite(tensor):
        raise ModelError(f"{where}: tensor {name!r} holds NaN or infinite values")


def all_finite(t: torch.Tensor) -> bool:
    """No NaN or infinity in ``t``. A NaN or an infinity anywhere makes the sum one, so a finite
    sum settles it in one reduction (0.03 s per 100 M float32 values on one CPU thread, against
    0.5 s for ``isfinite(t).all()`` and its [numel] boolean buffer); a sum that is not finite —
    a bad value, or finite values that overflowed — is decided by looking at every value."""
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def read_tensors(model_dir: str | Path, slots: dict[str, Slot]) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint directory, validated against ``slots`` (all required but a
    tied ``lm_head.weight``)."""
    from safetensors.torch import load_file

    path = Path(model_dir)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{str(path)!r} has no *.safetensors weights; save the checkpoint with "
                         "save_pretrained(..., safe_serialization=True)")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            part = load_file(str(f))
        except Exception as e:  # the library's message may quote the file; ours names it
            raise ModelError(f"{f}: not a readable safetensors file ({type(e).__name__}); re-save the "
                             "checkpoint") from None
        for name, t in part.items():
            if not name.endswith(IGNORED_SUFFIXES):
                name = canonical(name)
                check_tensor(name, t, slots.get(name), str(path))
                tensors[name] = t
    missing = [n for n in slots if n not in tensors and not (n == "lm_head.weight" and slots[n].key == ("embed",))]
    if missing:
        raise ModelError(f"{path}: tensor {missing[0]!r} is missing from the checkpoint"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    if "lm_head.weight" in tensors and slots["lm_head.weight"].key == ("embed",):
        del tensors["lm_head.weight"]  # tied: the embedding is the output layer
    return tensors


Alloc = Callable[[tuple[int, ...]], torch.Tensor]
"""Gives an uninitialised fused tensor of a shape (the served dtype and device)."""


def assemble(tensors: dict[str, torch.Tensor], slots: dict[str, Slot], spec: DecoderSpec, *, device: Any,
             dtype: torch.dtype, base: dict | None = None, fresh: dict[tuple, torch.Tensor] | None = None,
             alloc: Alloc | None = None) -> dict:
    """A new weights dict: ``tensors`` (already checked) written into new fused tensors, on top
    of ``base`` (the served weights: copied where only some rows are written, shared where none
    are) or of nothing (then ``tensors`` must cover every slot). ``fresh``: new fused tensors
    already holding some tensors (``receive_targets``), used as they are. ``alloc`` gives the
    new fused tensors (``Decoder`` hands back the memory of the weights it last replaced)."""
    alloc = alloc or (lambda shape: torch.empty(shape, device=device, dtype=dtype))
    fresh = {**_new_fused({slots[n]: None for n in tensors}, base, _shapes(slots), alloc, skip=fresh or {}),
             **(fresh or {})}
    for name, t in tensors.items():
        slot = slots[name]
        fresh[slot.key][slot.start : slot.stop] = t.to(device=device, dtype=dtype)
    if base is None:
        weights: dict = {"layers": [{"qkv_bias": None} for _ in range(spec.num_layers)]}
        for key, t in fresh.items():
            _set(weights, key, t)
    else:
        weights = with_fused(base, fresh)
    if ("lm_head",) not in _shapes(slots):  # tied
        weights["lm_head"] = weights["embed"]
    return weights


MERGED_ON = "merged_on"
"""The key of a weights dict made by merging a LoRA adapter (``lora_adapter.merge_adapter``)
that holds the base weights it was merged on: the next adapter merges on them too. A weights
dict without it is a base of its own (a full checkpoint, or tensors laid over the served ones)."""


def with_fused(base: dict, fresh: dict[tuple, torch.Tensor]) -> dict:
    """A new weights dict: ``base``'s tensors, but the fused tensors ``fresh`` holds (by key);
    not ``base``'s ``MERGED_ON`` (what is laid over merged weights is a new base)."""
    weights = {**base, "layers": [dict(layer) for layer in base["layers"]]}
    weights.pop(MERGED_ON, None)
    for key, t in fresh.items():
        _set(weights, key, t)
    if base.get("lm_head") is base.get("embed") and ("embed",) in fresh:  # tied: the output layer is the embedding
        weights["lm_head"] = weights["embed"]
    return weights


def receive_targets(announced: list[tuple[str, torch.dtype, tuple[int, ...]]], slots: dict[str, Slot], *, base: dict,
                    device: Any, dtype: torch.dtype, alloc: Alloc | None = None,
                    own: dict[tuple, torch.Tensor] | None = None,
                    ) -> tuple[list[torch.Tensor], dict[tuple, torch.Tensor]]:
    """Where to receive announced ``(name, dtype, shape)`` tensors, and the new fused tensors
    some of them land in. One of the served dtype and its slot's exact shape is received
    straight into its rows of a new fused tensor (uninitialised where the announced tensors
    cover every row of it, a copy of the served one elsewhere), so laying it out costs no copy;
    any other gets a buffer of its own, to be checked (and refused or converted) after.
    ``own``: fused tensors of ``base`` that nobody serves (a staging copy's), received into in
    place. Nothing here is checked: ``check_tensor`` runs on what arrives."""
    device = torch.device(device)
    alloc = alloc or (lambda shape: torch.empty(shape, device=device, dtype=dtype))
    direct: dict[int, Slot] = {}
    seen: set[str] = set()
    for i, (name, dt, shape) in enumerate(announced):
        name = canonical(name)
        slot = slots.get(name)
        if slot is not None and name not in seen and dt == dtype and tuple(shape) == slot.shape:
            direct[i] = slot
        seen.add(name)
    fresh = {**_new_fused(dict.fromkeys(direct.values()), base, _shapes(slots), alloc, skip=own), **(own or {})}
    targets = [fresh[direct[i].key][direct[i].start : direct[i].stop] if i in direct
               else torch.empty(tuple(shape), dtype=dt, device=device) for i, (_, dt, shape) in enumerate(announced)]
    return targets, fresh


def fused_tensors(weights: dict, slots: dict[str, Slot]) -> dict[tuple, torch.Tensor]:
    """Each fused tensor of ``weights`` by its key (``("embed",)``, ``("layers", i, "qkv")``...)."""
    return {key: _get(weights, key) for key in _shapes(slots)}


def _shapes(slots: dict[str, Slot]) -> dict[tuple, tuple[int, ...]]:
    """Each fused tensor's shape."""
    shapes: dict[tuple, tuple[int, ...]] = {}
    for slot in slots.values():
        rows = max(shapes.get(slot.key, (0,))[0], slot.stop)
        shapes[slot.key] = (rows, *slot.shape[1:])
    return shapes


def _new_fused(written: dict[Slot, None], base: dict | None, shapes: dict[tuple, tuple[int, ...]], alloc: Alloc,
               skip: dict[tuple, torch.Tensor] | None = None) -> dict[tuple, torch.Tensor]:
    """A new fused tensor for every key some ``written`` slot falls in (but those in ``skip``):
    uninitialised where the slots cover all its rows (or there is no ``base``), else a copy of
    the served one."""
    spans: dict[tuple, set[tuple[int, int]]] = {}
    for slot in written:
        spans.setdefault(slot.key, set()).add((slot.start, slot.stop))
    fresh: dict[tuple, torch.Tensor] = {}
    for key, rows in spans.items():
        if skip and key in skip:
            continue
        t = alloc(shapes[key])
        covered = sum(stop - start for start, stop in rows)  # the slots of one key are disjoint (or equal)
        if base is not None and covered < shapes[key][0]:
            t.copy_(_get(base, key))
        fresh[key] = t
    return fresh


def load_weights(model_dir: str | Path, spec: DecoderSpec, tied: bool, device: Any, dtype: torch.dtype,
                 alloc: Alloc | None = None) -> dict:
    """A checkpoint directory's tensors, validated, in the fused layout ``Decoder`` runs on."""
    slots = layout(spec, tied)
    return assemble(read_tensors(model_dir, slots), slots, spec, device=device, dtype=dtype, alloc=alloc)


def _get(weights: dict, key: tuple) -> torch.Tensor:
    return weights["layers"][key[1]][key[2]] if key[0] == "layers" else weights[key[0]]


def _set(weights: dict, key: tuple, value: torch.Tensor) -> None:
    if key[0] == "layers":
        weights["layers"][key[1]][key[2]] = value
    else:
        weights[key[0]] = value
