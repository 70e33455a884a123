"""The projections' weights reordered for oneDNN's CPU kernel, kept in step with the plain weights.

What it is: ``prepack(weights)`` makes, for a weights dict (``hf_weights``' layout), a copy of
each projection — the fused q/k/v, o, the fused gate/up and down of every layer, and the output
layer — in oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``), kept under
the dict's ``PACKED`` key; ``linear``/``linear_add`` multiply by such a copy
(``torch.ops.mkldnn._linear_pointwise``, the residual add fused in). Each copy remembers the
plain tensor it was made from and that tensor's version counter, which every in-place write
bumps (through any view of it; a write that does not — a collective's receive — must come
after a bump: ``Decoder._alloc`` bumps every spare it hands out): ``usable`` gives a dict's copies only while every one matches
what the dict holds now, and ``prepack`` reuses every copy that still matches (the tensors an
update left shared with the weights served before).

Why: the projections are most of a decode step once a model is past the demo's size, and at a
decode step's few rows oneDNN's kernel on prepacked weights beats the sgemm behind ``F.linear``
on the plain ones (benchmarks/RESULTS.md, "Prepacked projections"); vLLM's CPU build multiplies
so too (``create_onednn_mm``).

What it is not: the plain weights (kept: staging, LoRA merges and the batch-invariant path
read them), nor when packing runs (``Decoder``: at load, then on a thread of its own after
each swap, the plain weights serving until the copies match). The copies are as large as the plain projections: a second copy of them.
Only float32 on a CPU whose torch has oneDNN (``available``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PACKED = "prepacked"
"""The key of a weights dict that holds its ``Prepacked`` copies (absent: none made yet)."""

PROJECTIONS = ("qkv", "o", "gate_up", "down")
"""Each layer's projections that get a packed copy (``hf_weights``' fused names)."""

MIN_WORK = 1 << 20
"""A product of ``rows`` x the weight's elements below this many multiply-adds runs on the plain
weight: oneDNN's kernel costs a fixed amount more a call than ``F.linear``, which only
larger products win back (the crossover: benchmarks/RESULTS.md, "Prepacked projections")."""

PACK_ROWS = 16
"""The row count oneDNN is told to expect when it picks the blocked layout (a hint: any count
runs; the choice: benchmarks/RESULTS.md, "Prepacked projections")."""


@dataclass(frozen=True)
class Packed:
    """One packed copy: the plain tensor it was made from, that tensor's version then, the copy."""

    source: torch.Tensor
    version: int
    weight: torch.Tensor

    def matches(self, t: torch.Tensor) -> bool:
        return self.source is t and self.version == t._version


@dataclass(frozen=True)
class Prepacked:
    """The packed copies of one weights dict: per layer by projection name, and the output layer's."""

    layers: list[dict[str, Packed]]
    lm_head: Packed

    def matches(self, weights: dict) -> bool:
        """Every copy was made from the tensor ``weights`` holds now, as it is now."""
        return self.lm_head.matches(weights["lm_head"]) and all(
            p.matches(layer[name]) for packs, layer in zip(self.layers, weights["layers"], strict=True)
            for name, p in packs.items())

    def tensors(self) -> list[torch.Tensor]:
        return [p.weight for packs in self.layers for p in packs.values()] + [self.lm_head.weight]


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this torch can prepack for ``device`` and ``dtype``: float32 on a CPU with oneDNN."""
    return (device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def _pack(t: torch.Tensor, known: dict[int, Packed]) -> Packed:
    p = known.get(id(t))
    if p is not None and p.matches(t):
        return p
    version = t._version  # read first: a write during the reorder leaves the copy stale, not wrong-and-fresh
    return Packed(t, version, torch.ops.mkldnn._reorder_linear_weight(t.contiguous(), PACK_ROWS))


def prepack(weights: dict) -> Prepacked:
    """Packed copies of the projections of ``weights``, reusing each copy its ``PACKED`` holds
    that still matches its tensor; the rest are made now (about a copy's time: a second or so per
    GB). Changes no dict: the caller keeps the result under ``PACKED``."""
    known: dict[int, Packed] = {}
    old = weights.get(PACKED)
    if old is not None:
        known.update({id(p.source): p for packs in old.layers for p in packs.values()})
        known[id(old.lm_head.source)] = old.lm_head
    return Prepacked([{name: _pack(layer[name], known) for name in PROJECTIONS} for layer in weights["layers"]],
                     _pack(weights["lm_head"], known))


def usable(weights: dict) -> Prepacked | None:
    """``weights``' packed copies if every one matches the tensor the dict holds now, else None."""
    packed = weights.get(PACKED)
    return packed if packed is not None and packed.matches(weights) else None


def chosen(packed: Prepacked, rows: int) -> list[dict[str, torch.Tensor | None]]:
    """For a forward pass of ``rows`` rows: each layer's packed weight per projection, None where
    the product is too small to gain from it (``worth``)."""
    use = {name: worth(rows, p.source) for name, p in packed.layers[0].items()} if packed.layers else {}
    return [{name: p.weight if use[name] else None for name, p in packs.items()} for packs in packed.layers]


def worth(rows: int, weight: torch.Tensor) -> bool:
    """Whether ``rows`` rows times ``weight`` are enough work for the packed kernel (``MIN_WORK``)."""
    return rows * weight.numel() >= MIN_WORK


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, W, bias)`` with ``packed`` the packed copy of ``W``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def linear_add(x: torch.Tensor, packed: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``residual + F.linear(x, W)`` with ``packed`` the packed copy of ``W``: one kernel."""
    return torch.ops.mkldnn._linear_pointwise.binary(x, residual, packed, None, "add")
