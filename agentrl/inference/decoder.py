"""A packed decoder forward pass over a slot KV cache, for the Llama/Qwen family.

What it is: the model half of ``agentrl serve``. ``hf_weights.load_weights`` reads
and validates a Hugging Face checkpoint (``config.json`` + safetensors) into plain tensors, and ``Decoder.forward``
runs one ``Step``: decode rows (one token in each of consecutive cache slots) and prefill rows
(any number of tokens from any position of a slot), packed into one matrix without padding.
Each row writes its new keys/values into its own slot (``[positions, kv_heads, head_dim]``
per slot) and attends to everything that slot holds up to its own position. Beside the slots
sits the prefix pool (``pool_k``/``pool_v``, one entry per cached token), with the batched
copies between the two that the prefix cache needs (``load_prefixes``, ``save_prefixes``,
``copy_prefixes``).

Supported ``model_type`` values (``SUPPORTED_MODEL_TYPES``): ``llama``, ``qwen2`` (q/k/v
bias) and ``qwen3`` (per-head q/k RMSNorm) — RMSNorm, RoPE (default, linear, llama3, yarn,
longrope scaling via transformers' own tables), grouped-query attention, SwiGLU MLP, tied or
untied embeddings. Anything else (sliding-window attention, MoE, dynamic RoPE, other
architectures) is refused with a ``ModelError`` naming what is unsupported.

What it is not: a training model (no autograd), nor a general transformers replacement.
Numerics follow transformers' eager implementation in float32 closely enough that logprobs
agree with a teacher-forced ``AutoModelForCausalLM`` pass to ~1e-5 (tested).
"""

from __future__ import annotations

import contextlib
import logging
import math
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from agentrl.errors import ModelError
from agentrl.inference import prepacked
from agentrl.inference.hf_weights import (
    MERGED_ON,
    SUPPORTED_MODEL_TYPES,
    assemble,
    canonical,
    check_tensor,
    fused_tensors,
    layout,
    load_weights,
    read_config,
    receive_targets,
    spec_of,
)
from agentrl.inference.lora_adapter import (
    Adapter,
    LoraWeights,
    is_adapter_dir,
    merge_adapter,
    read_adapter,
    runtime_adapter,
)

__all__ = ["SUPPORTED_MODEL_TYPES", "Decoder", "Step", "read_config"]

log = logging.getLogger(__name__)

_PLAIN = dict.fromkeys(prepacked.PROJECTIONS)
"""A layer's projections when none multiplies by a packed copy."""

ROW_ATTENTION_MAX = 131072
"""Decode attention takes one matmul per row over all key heads while ``heads * head_dim *
keys`` stays below this, one per key head above it: for small heads the call overhead of a small
matmul outweighs twice the (tiny) attention FLOPs; larger heads tip the balance sooner
(``benchmarks/inference.py`` measures the decode step)."""


DECODE_SEGMENT_KEYS = 256
"""Decode rows attend in runs of consecutive slots, each over its own longest row's keys
(``decode_segments``); a run costs about as much as reading this many more keys (its call
overhead: a few small ops per layer), so a cut must save more than that."""


INVARIANT_ROWS = 32
"""With ``batch_invariant``, every matmul over the packed rows runs in blocks of exactly this many
rows (the last one padded with zeros). A GEMM kernel may pick its blocking, and so its order of
sums, by how many rows share the call (docs/DESIGN.md, "Deterministic mode", has what was
measured); one fixed shape gives every row the same numbers whatever it is batched with."""
INVARIANT_KEYS = 32
"""With ``batch_invariant``, a token at position p attends over its slot's first
``ceil((p + 1) / INVARIANT_KEYS) * INVARIANT_KEYS`` keys (those past p masked): a length set by
the token alone, so tokens of similar positions share one batched matmul (whose per-matrix
results do not depend on the batch count) and none is padded to another's length."""


def _blocked_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` in blocks of ``INVARIANT_ROWS`` rows: row i's result depends on row i alone."""
    n = x.shape[0]
    blocks = -(-n // INVARIANT_ROWS)
    padded = F.pad(x, (0, 0, 0, blocks * INVARIANT_ROWS - n))
    return torch.cat([F.linear(padded[b * INVARIANT_ROWS : (b + 1) * INVARIANT_ROWS], weight, bias)
                      for b in range(blocks)])[:n]


def decode_segments(positions: list[int]) -> tuple[list[tuple[int, int, int]], float]:
    """Decode rows ``0 .. len(positions) - 1`` (one per consecutive slot) cut into runs
    ``(start, end, keys)`` that each attend over their own longest row's ``keys``, and the cost
    of those runs: the cuts minimise the keys read, ``sum((end - start) * keys)``, plus
    ``DECODE_SEGMENT_KEYS`` per run, with cuts only every ``len // 16`` rows (a small exact
    search). Rows of similar positions in neighbouring slots make it cheap."""
    D = len(positions)
    width = -(-D // 16)
    cuts = [*range(0, D, width), D]
    tops = [max(positions[cuts[i] : cuts[i + 1]]) + 1 for i in range(len(cuts) - 1)]
    best, back = [0] + [math.inf] * len(tops), [0] * (len(tops) + 1)
    for j in range(1, len(tops) + 1):
        top = 0
        for i in range(j - 1, -1, -1):
            top = max(top, tops[i])
            cost = best[i] + (cuts[j] - cuts[i]) * top + DECODE_SEGMENT_KEYS
            if cost < best[j]:
                best[j], back[j] = cost, i
    runs, j = [], len(tops)
    while j:
        i = back[j]
        runs.append((cuts[i], cuts[j], max(tops[i:j])))
        j = i
    return runs[::-1], best[-1]


def _fused(weights: dict) -> list[torch.Tensor]:
    """Every fused tensor of a weights dict, once each (a tied output layer is the embedding)."""
    out = {id(t): t for t in (weights.get("embed"), weights.get("norm"), weights.get("lm_head")) if t is not None}
    for layer in weights["layers"]:
        out.update({id(t): t for t in layer.values() if isinstance(t, torch.Tensor)})
    return list(out.values())


def _inside(t: torch.Tensor, fresh: dict[tuple, torch.Tensor] | None, bases: set[int]) -> bool:
    """``t`` is a view into one of the new fused tensors (received in place)."""
    return bool(fresh) and t._base is not None and t._base.data_ptr() in bases


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:  # one fused kernel, the same numbers as the formula below
        return F.rms_norm(x, weight.shape, weight, eps)
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _lora_rows(lora: list[LoraWeights | None], decode: int, lens: list[int],
               device: torch.device) -> list[tuple[LoraWeights, torch.Tensor | None]]:
    """Each adapter of a step with the packed token indices of its rows (None: every token)."""
    if not any(lora):
        return []
    spans = [(i, 1) for i in range(decode)]
    at = decode
    for n in lens:
        spans.append((at, n))
        at += n
    tokens: dict[LoraWeights, list[int]] = {}
    for adapter, (start, n) in zip(lora, spans, strict=True):
        if adapter is not None:
            tokens.setdefault(adapter, []).extend(range(start, start + n))
    return [(a, None if len(idx) == at else torch.tensor(idx, device=device)) for a, idx in tokens.items()]


def _add_lora(out: torch.Tensor, inp: torch.Tensor, loras: list[tuple[LoraWeights, torch.Tensor | None]],
              layer: int, key: str, invariant: bool = False) -> None:
    """``out[rows] += (inp[rows] @ A.T) @ B.T`` for each adapter that changes projection ``key``
    of ``layer``, over its rows (in place); ``invariant``: in fixed blocks (``_blocked_linear``)."""
    for adapter, rows in loras:
        ab = adapter.layers[layer].get(key)
        if ab is None:
            continue
        a, b = ab
        if invariant:
            x = inp if rows is None else inp[rows]
            delta = _blocked_linear(_blocked_linear(x, a), b)
            if rows is None:
                out.add_(delta)
            else:
                out.index_add_(0, rows, delta)
        elif rows is None:
            out.addmm_(inp @ a.t(), b.t())
        else:
            out.index_add_(0, rows, (inp[rows] @ a.t()) @ b.t())


@dataclass
class Step:
    """The rows of one forward pass: what ``Decoder.forward`` computes, packed without padding.

    ``decode``: one entry per cache slot ``0 .. len(decode) - 1`` (consecutive slots, so their
    keys are read in place): ``(token, position)`` computes that one token in the slot; None
    is a filler row for a slot with nothing to compute (its output is garbage and its
    keys/values go to a scratch slot). ``prefill``: ``(slot, start, tokens)`` computes
    ``tokens`` at positions ``start, start + 1, ...`` of ``slot``; the slot must already hold
    the keys/values of positions ``< start`` (a prefix copied from the prefix cache, or a
    retracted request's earlier tokens are recomputed with ``start = 0``). A slot appears in
    at most one live row.
    """

    decode: list[tuple[int, int] | None]
    prefill: list[tuple[int, int, list[int]]]
    hidden_from: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Prefill row ``j -> (offset, count)``: also keep the final (normed) hidden states of that
    row's tokens ``offset .. offset + count - 1``, in ``hidden[j]`` ``[count, hidden]`` (for
    their logits: ``Decoder.token_logprobs``)."""
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # filled by Decoder.forward
    lora: list[LoraWeights | None] = field(default_factory=list)
    """The LoRA adapter each row computes with (``decode`` rows, then ``prefill`` rows; None: the
    served weights alone); empty: every row without one."""


@dataclass
class _PrefillGather:
    """The prefill rows of a step as one padded batch for SDPA: ``rows`` x ``width`` queries."""

    rows: int
    width: int
    gather: torch.Tensor  # [rows, width]: the packed token of each padded query
    slots: torch.Tensor  # [rows]: each row's cache slot
    keys: int  # the keys read per row (the longest row's end)
    mask: torch.Tensor  # [rows, 1, width, keys]: which keys each query sees
    keep: torch.Tensor  # the padded outputs that are real tokens, in packed order


@dataclass
class _Plan:
    """What every layer of one forward shares (``Decoder._plan``)."""

    tokens: torch.Tensor  # [N] packed token ids: decode rows first, then the prefill rows'
    decode: int  # decode rows (D)
    lens: list[int]  # tokens of each prefill row
    last: list[int]  # the packed index whose logits each row returns
    cos: torch.Tensor  # [N, H + KV, hd] RoPE tables, the queries' scaled by 1/sqrt(hd)
    sin: torch.Tensor
    write_rows: torch.Tensor  # [N] rows of a layer's flattened cache this step writes
    invariant: list | None  # batch-invariant groups (``_invariant_groups``), or None
    segments: list[tuple]  # decode runs (``_decode_runs``)
    prefill: _PrefillGather | None
    loras: list  # each adapter of the step with its rows (``_lora_rows``)


class Decoder:
    """Weights, slot KV cache, prefix pool and the forward pass. Not thread-safe: one engine
    thread owns it."""

    def __init__(self, model_dir: str | Path, *, num_slots: int, max_len: int, device: str = "cpu",
                 dtype: torch.dtype | None = None, pool_tokens: int = 0, batch_invariant: bool = False,
                 prepack: bool = True) -> None:
        """``batch_invariant``: a token's logits are the same bits whatever shares its forward
        pass (other requests, a prefill split into chunks, keys from the prefix cache): the
        matmuls run in fixed blocks (``INVARIANT_ROWS``) and every token's attention, decode
        or prefill, is computed alone against its own keys (``_invariant_attention``).
        ``prepack``: the projections multiply by copies of their weights in oneDNN's layout
        (``prepacked``), where that applies: float32 on a CPU, without ``batch_invariant``
        (whose fixed blocks are the plain kernel's); ``self.prepack`` says whether it does. The
        copies of new weights are made on a thread of its own after the swap (``_packs``), so
        an update's pause does not wait for them."""
        self.batch_invariant = batch_invariant
        self.config = read_config(model_dir)
        self.spec = spec_of(self.config)
        self.device = torch.device(device)
        if dtype is None:
            dtype = torch.float32 if self.device.type == "cpu" else torch.bfloat16
        self.dtype = dtype
        self.tied = bool(getattr(self.config, "tie_word_embeddings", False))
        self.slots = layout(self.spec, self.tied)
        self.prepack = prepack and not batch_invariant and prepacked.available(self.device, dtype)
        self.weights = load_weights(model_dir, self.spec, self.tied, device, dtype)
        self._packer = ThreadPoolExecutor(1, thread_name_prefix="agentrl-prepack") if self.prepack else None
        self._packing: tuple[dict, Future] | None = None  # the weights being packed, and the job
        if self.prepack:
            self.weights[prepacked.PACKED] = prepacked.prepack(self.weights)
        self.base = self.weights  # what a LoRA adapter merges on: the weights of the last full update
        self._spares: list[torch.Tensor] = []  # fused tensors of replaced weights, reused by staging
        self.num_slots, self.max_len = num_slots, max_len
        s = self.spec
        # [layers, slots + 1, positions, kv_heads, head_dim]: a slot's keys are one [positions,
        # kv_heads * head_dim] matrix (what the decode attention reads in one piece); one slot
        # past the last is the scratch slot that filler rows write to.
        self._cache_shape = (s.num_layers, num_slots + 1, max_len, s.num_kv_heads, s.head_dim)
        # The prefix cache's entries, one token each: [layers, pool_tokens, kv_heads, head_dim].
        self.pool_tokens = pool_tokens
        self._pool_shape = (s.num_layers, pool_tokens, s.num_kv_heads, s.head_dim)
        self.kv_released = False
        self._allocate_kv()
        self.cos, self.sin = self._rope_table(max_len)

    def _allocate_kv(self) -> None:
        dev, dtype = self.device, self.dtype
        self.cache_k = torch.zeros(self._cache_shape, device=dev, dtype=dtype)
        self.cache_v = torch.zeros(self._cache_shape, device=dev, dtype=dtype)
        self.pool_k = torch.zeros(self._pool_shape, device=dev, dtype=dtype)
        self.pool_v = torch.zeros(self._pool_shape, device=dev, dtype=dtype)

    # ------------------------------------------------------------------ memory (colocated training)

    def release_kv(self) -> None:
        """Free the slot cache and the prefix pool (SGLang's ``kv_cache`` tag of
        ``/release_memory_occupation``): nothing may run until ``occupy_kv``. The scheduler
        calls it with no request in a slot and the prefix cache emptied."""
        empty = torch.empty(0, device=self.device, dtype=self.dtype)
        self.cache_k = self.cache_v = self.pool_k = self.pool_v = empty
        self.kv_released = True

    def occupy_kv(self) -> None:
        """The slot cache and the prefix pool again, zeroed (``/resume_memory_occupation``)."""
        if self.kv_released:
            self._allocate_kv()
            self.kv_released = False

    def release_spares(self) -> None:
        """Free the spare weight copies kept for the next staging and the packed copies of the
        served weights (``weights`` tag; the first forward pass after it serves on the plain
        weights while the packing thread makes them again). The served weights stay where they
        are: offloading them is not built."""
        self._spares = []
        self.weights.pop(prepacked.PACKED, None)

    def memory_bytes(self) -> dict[str, int]:
        """Bytes held now: the served weights (their base too, when an adapter is merged), the
        spares, and the slot cache with the prefix pool."""
        def size(tensors: list[torch.Tensor]) -> int:
            return sum(t.numel() * t.element_size() for t in {id(t): t for t in tensors}.values())
        packed = self.weights.get(prepacked.PACKED)
        return {"weights": size(_fused(self.weights) + _fused(self.base)), "spares": size(self._spares),
                "prepacked": size(packed.tensors()) if packed is not None else 0,
                "kv_cache": size([self.cache_k, self.cache_v, self.pool_k, self.pool_v])}

    def _rope_table(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        rope = dict(getattr(self.config, "rope_parameters", None) or {})
        kind = rope.get("rope_type", "default")
        if kind == "default":
            base = rope.get("rope_theta", getattr(self.config, "rope_theta", 10000.0))
            d = self.spec.head_dim
            inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float) / d))
            scale = 1.0
        else:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            inv_freq, scale = ROPE_INIT_FUNCTIONS[kind](self.config, torch.device("cpu"))
        freqs = torch.arange(length, dtype=torch.float)[:, None] * inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return ((emb.cos() * scale).to(self.device, self.dtype), (emb.sin() * scale).to(self.device, self.dtype))

    def prepare_weights(self, model_dir: str | Path) -> dict:
        """Load and validate a same-architecture checkpoint into a staging copy without
        installing it: the engine assigns the result to ``self.weights`` between two steps
        (the slot cache is kept; the engine empties the prefix cache). Raises ``ModelError``
        naming what is wrong; the served weights are untouched either way. A LoRA adapter
        directory (peft's ``adapter_config.json`` + ``adapter_model.safetensors``) is merged
        into the base weights (``lora_adapter``): the adapter alone travels, and the result is
        base + this adapter whatever adapter was served before."""
        if is_adapter_dir(model_dir):
            return self.merge_adapter(read_adapter(model_dir, self.slots))
        config = read_config(model_dir)
        spec = spec_of(config)
        if spec != self.spec:
            diff = [f"{k}={getattr(spec, k)} (serving {getattr(self.spec, k)})" for k in self.spec.__dataclass_fields__
                    if getattr(spec, k) != getattr(self.spec, k)]
            raise ModelError(f"{model_dir}: its architecture differs from the served model: {', '.join(diff)}; "
                             "only checkpoints of the same architecture can be loaded")
        tied = bool(getattr(config, "tie_word_embeddings", False))
        if tied != self.tied:
            raise ModelError(f"{model_dir}: tie_word_embeddings={tied}, the served model has {self.tied}")
        return load_weights(model_dir, self.spec, tied, self.device, self.dtype, alloc=self._alloc)

    def load_adapter(self, adapter_dir: str | Path, name: str) -> LoraWeights:
        """A LoRA adapter directory, validated (``read_adapter``) and laid out for run-time use
        (``Step.lora``): it adds to whatever weights are served, full updates included."""
        return self.runtime_adapter(read_adapter(adapter_dir, self.slots), name, str(adapter_dir))

    def merge_adapter(self, adapter: Adapter) -> dict:
        """A staging copy: the base weights with a validated ``adapter`` merged in (a directory's,
        or one received by broadcast); as ``prepare_weights``, under the server's weight lock."""
        return merge_adapter(adapter, self.base, self.slots, alloc=self._alloc)

    def runtime_adapter(self, adapter: Adapter, name: str, path: str) -> LoraWeights:
        """A validated ``adapter`` laid out for run-time use, as ``load_adapter``'s."""
        return runtime_adapter(adapter, self.slots, self.spec.num_layers, name=name, path=path,
                               device=self.device, dtype=self.dtype)

    def prepare_tensors(self, tensors: list[tuple[str, torch.Tensor]], where: str,
                        fresh: dict[tuple, torch.Tensor] | None = None, onto: dict | None = None) -> dict:
        """Validate some checkpoint tensors (names as in a Hugging Face checkpoint; each at most
        once) and lay them over a copy of the served weights: the staging copy the engine
        installs. Tensors already received into ``fresh`` (``receive_targets``) stay where they are.
        ``onto``: a staging copy made by an earlier call, laid over instead of the served weights
        (its own tensors are written in place: after a refusal it must be dropped)."""
        named: dict[str, torch.Tensor] = {}
        fresh = {**self._owned(onto), **(fresh or {})}
        placed = {t.data_ptr() for t in fresh.values()}
        for name, t in tensors:
            name = canonical(name)
            if name in named:
                raise ModelError(f"{where}: tensor {name!r} appears twice")
            check_tensor(name, t, self.slots.get(name), where)
            named[name] = t
        rest = {n: t for n, t in named.items() if not _inside(t, fresh, placed)}
        return assemble(rest, self.slots, self.spec, device=self.device, dtype=self.dtype,
                        base=self.weights if onto is None else onto, fresh=fresh, alloc=self._alloc)

    def receive_targets(self, announced: list[tuple[str, torch.dtype, tuple[int, ...]]], onto: dict | None = None):
        """Buffers to receive announced tensors into (``hf_weights.receive_targets``), over the
        served weights or over the staging copy ``onto`` (into its own tensors in place)."""
        return receive_targets(announced, self.slots, base=self.weights if onto is None else onto, device=self.device,
                               dtype=self.dtype, alloc=self._alloc, own=self._owned(onto))

    def _owned(self, onto: dict | None) -> dict[tuple, torch.Tensor]:
        """The fused tensors of the staging copy ``onto`` that the served weights do not hold."""
        if onto is None:
            return {}
        served = {id(t) for t in _fused(self.weights)} | {id(t) for t in _fused(self.base)}
        return {k: t for k, t in fused_tensors(onto, self.slots).items() if id(t) not in served}

    def discard(self, weights: dict) -> None:
        """Drop a staging copy that will not be installed: its tensors become spares (under the
        server's weight lock, as staging)."""
        held = {id(t) for t in _fused(self.weights)} | {id(t) for t in self._spares} | {id(t) for t in _fused(self.base)}
        self._spares += [t for t in _fused(weights) if id(t) not in held]

    def swap_weights(self, weights: dict) -> None:
        """Serve ``weights`` from the next forward pass on (scheduler thread, between two steps).
        The fused tensors of the replaced weights that the new ones do not share are kept as
        spares: the next staging copy is written into them (``_alloc``) instead of fresh memory,
        whose first touch costs a page fault per 4 KiB — on a 100 M-parameter model on CPU, a
        quarter of a second of each update. So the server holds two copies of the weights from
        the first update on, where it needed two at each update anyway. Merged LoRA weights
        keep their base (``MERGED_ON``) beside them, and its tensors are never spares: a third
        copy of the projections while an adapter is served."""
        old, old_base = self.weights, self.base
        self.weights, self.base = weights, weights.get(MERGED_ON, weights)
        if self.prepack:
            if prepacked.PACKED not in weights and prepacked.PACKED in old:  # what packing them may reuse
                weights[prepacked.PACKED] = old[prepacked.PACKED]
            if self.base is not weights:  # a base only merged on: its packed copies are not multiplied by
                self.base.pop(prepacked.PACKED, None)
        kept = {id(t) for t in _fused(weights)} | {id(t) for t in _fused(self.base)}
        gone = {id(t): t for t in _fused(old) + _fused(old_base) if id(t) not in kept}
        self._spares = list(gone.values())

    def _packs(self) -> prepacked.Prepacked | None:
        """The served weights' packed copies if every one matches its tensor now; else None — this
        step multiplies by the plain weights — and the packing thread (re)makes them, taken up
        by a later step (here, on the scheduler thread: only it assigns ``PACKED``)."""
        if not self.prepack:
            return None
        w, job = self.weights, self._packing
        if job is not None and job[0] is w and job[1].done():
            self._packing = None
            try:
                w[prepacked.PACKED] = job[1].result()
            except Exception as e:  # memory, most likely: serve on the plain weights
                log.warning("prepacking the weights failed (%s); the plain weights serve from now on", e)
                self.prepack = False
                return None
        packed = prepacked.usable(w)
        if packed is None and (self._packing is None or self._packing[0] is not w):
            self._packing = (w, self._packer.submit(prepacked.prepack, w))
        return packed

    def wait_packed(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the packing thread; whether the next forward pass
        multiplies by packed copies (on the thread that owns the decoder: tests, benchmarks)."""
        if self._packs() is None and self._packing is not None:
            with contextlib.suppress(TimeoutError):
                self._packing[1].result(timeout)
        return self._packs() is not None

    def _alloc(self, shape: tuple[int, ...]) -> torch.Tensor:
        """An uninitialised fused tensor: a spare of that shape if there is one (staging runs on
        one thread at a time, under the server's weight lock, and never while a swap does)."""
        for i, t in enumerate(self._spares):
            if tuple(t.shape) == tuple(shape):
                # what is written into it next may not bump its version counter (a collective's
                # receive does not): bump it now, so no packed copy of its old values matches it
                if not t.is_inference():  # (an inference tensor has no counter, and no packed copy)
                    torch.autograd.graph.increment_version(t)
                return self._spares.pop(i)
        return torch.empty(shape, device=self.device, dtype=self.dtype)

    # ------------------------------------------------------------------ prefix pool
    # Each call moves keys and values for many tokens with one gather and one scatter per
    # tensor; ``cache[:, slots, positions]`` and ``pool[:, entries]`` are ``[layers, tokens,
    # kv_heads, head_dim]``.

    def load_prefixes(self, loads: list[tuple[int, list[int]]]) -> None:
        """For each ``(slot, entries)``: copy pool ``entries`` (one per token) into positions
        ``0 .. len - 1`` of ``slot``."""
        if not loads:
            return
        slots = self._index([slot for slot, entries in loads for _ in entries])
        positions = self._index([p for _, entries in loads for p in range(len(entries))])
        entries = self._index([e for _, ent in loads for e in ent])
        for cache, pool in ((self.cache_k, self.pool_k), (self.cache_v, self.pool_v)):
            cache[:, slots, positions] = pool[:, entries]

    def save_prefixes(self, saves: dict[int, tuple[int, int]]) -> None:
        """For each ``entry: (slot, position)``: copy that position of that slot into the pool entry."""
        if not saves:
            return
        entries = self._index(list(saves))
        slots = self._index([slot for slot, _ in saves.values()])
        positions = self._index([p for _, p in saves.values()])
        for cache, pool in ((self.cache_k, self.pool_k), (self.cache_v, self.pool_v)):
            pool[:, entries] = cache[:, slots, positions]

    def copy_prefixes(self, copies: list[tuple[int, int, int]]) -> None:
        """For each ``(source slot, target slot, length)``: copy positions ``0 .. length - 1``
        (one gather/scatter over whole slots per distinct length)."""
        by_length: dict[int, list[tuple[int, int]]] = {}
        for src, dst, n in copies:
            by_length.setdefault(n, []).append((src, dst))
        for n, pairs in by_length.items():
            sources, targets = self._index([p[0] for p in pairs]), self._index([p[1] for p in pairs])
            for cache in (self.cache_k, self.cache_v):
                cache[:, :, :n].index_copy_(1, targets, cache[:, sources, :n])

    def _index(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    # ------------------------------------------------------------------ forward

    @torch.inference_mode()
    def forward(self, step: Step) -> torch.Tensor:
        """Run ``step``; returns float32 logits ``[len(step.decode) + len(step.prefill), V]``:
        one row per decode entry (garbage for fillers), then one per prefill row, at its last
        token.

        All tokens go through the projections and the MLP as one packed ``[N, hidden]``
        matrix. Attention is the only per-row part: decode rows read their slot's keys in
        place (consecutive slots: a view, no copy) with small batched matmuls
        (``ROW_ATTENTION_MAX``), in runs of neighbouring slots padded to each run's longest row
        (``decode_segments``); prefill rows gather their slots' keys and run one masked SDPA
        call, padded to the longest prefill row (padding in attention only, not in the matmuls).
        Rows with a LoRA adapter (``Step.lora``) add its ``(x @ A.T) @ B.T`` to each projection
        it targets: one pair of small matmuls per adapter in the step, over its rows only.
        """
        s, w = self.spec, self.weights
        plan = self._plan(step)
        N, H, KV, hd = plan.tokens.shape[0], s.num_heads, s.num_kv_heads, s.head_dim
        q_out, kv_out = H * hd, KV * hd
        invariant, loras = plan.invariant is not None, plan.loras
        linear = _blocked_linear if invariant else F.linear
        packs = self._packs()
        chosen = prepacked.chosen(packs, N) if packs is not None else None
        x = w["embed"][plan.tokens]
        for i, layer in enumerate(w["layers"]):
            pk = chosen[i] if chosen is not None else _PLAIN  # each projection's packed weight, or None
            h = _rms_norm(x, layer["ln1"], s.rms_eps)
            if pk["qkv"] is not None:
                qkv = prepacked.linear(h, pk["qkv"], layer["qkv_bias"])
            else:
                qkv = linear(h, layer["qkv"], layer["qkv_bias"])
            _add_lora(qkv, h, loras, i, "qkv", invariant)
            qk = qkv[:, : q_out + kv_out].view(N, H + KV, hd)
            if s.qk_norm:
                qk = torch.cat([_rms_norm(qk[:, :H], layer["q_norm"], s.rms_eps),
                                _rms_norm(qk[:, H:], layer["k_norm"], s.rms_eps)], 1)
            qk = qk * plan.cos + _rotate_half(qk) * plan.sin
            ck, cv = self.cache_k[i], self.cache_v[i]  # [S + 1, max_len, KV, hd]
            ck.view(-1, kv_out).index_copy_(0, plan.write_rows, qk[:, H:].reshape(N, kv_out))
            cv.view(-1, kv_out).index_copy_(0, plan.write_rows, qkv[:, q_out + kv_out :])
            attn = self._attention(plan, qk[:, :H], ck, cv)
            if pk["o"] is not None:
                x = prepacked.linear_add(attn, pk["o"], x)
            elif invariant:
                x = x + _blocked_linear(attn, layer["o"])
            else:
                x = torch.addmm(x, attn, layer["o"].t())  # x + attn @ o^T, the residual add fused in
            _add_lora(x, attn, loras, i, "o", invariant)
            h = _rms_norm(x, layer["ln2"], s.rms_eps)
            gate_up = prepacked.linear(h, pk["gate_up"]) if pk["gate_up"] is not None else linear(h, layer["gate_up"])
            _add_lora(gate_up, h, loras, i, "gate_up", invariant)
            gate, up = gate_up.chunk(2, dim=-1)
            act = F.silu(gate).mul_(up)
            if pk["down"] is not None:
                x = prepacked.linear_add(act, pk["down"], x)
            elif invariant:
                x = x + _blocked_linear(act, layer["down"])
            else:
                x = torch.addmm(x, act, layer["down"].t())
            _add_lora(x, act, loras, i, "down", invariant)
        if step.hidden_from:
            starts = [plan.decode + sum(plan.lens[:j]) for j in range(len(plan.lens))]
            for j, (offset, count) in step.hidden_from.items():
                at = starts[j] + offset
                step.hidden[j] = _rms_norm(x[at : at + count], w["norm"], s.rms_eps)
        x = _rms_norm(x[torch.tensor(plan.last, device=self.device)], w["norm"], s.rms_eps)
        return self._logits(x, packs)

    def _logits(self, x: torch.Tensor, packs: prepacked.Prepacked | None) -> torch.Tensor:
        """Float32 logits of final hidden states ``x``."""
        if packs is not None and prepacked.worth(x.shape[0], packs.lm_head.source):
            return prepacked.linear(x, packs.lm_head.weight).float()
        return (_blocked_linear if self.batch_invariant else F.linear)(x, self.weights["lm_head"]).float()

    def _plan(self, step: Step) -> _Plan:
        """What every layer of ``step``'s forward shares: the packed tokens, their RoPE tables and
        cache rows, and how attention reads the cache (decode runs, the prefill gather)."""
        s, dev = self.spec, self.device
        D, scratch = len(step.decode), self.num_slots
        rows = [(0, 0, scratch) if row is None else (row[0], row[1], i) for i, row in enumerate(step.decode)]
        toks, pos, wslot = ([*col] for col in zip(*rows, strict=True)) if rows else ([], [], [])
        last = list(range(D))
        lens = []
        for slot, start, ids in step.prefill:
            toks.extend(ids)
            pos.extend(range(start, start + len(ids)))
            wslot.extend([slot] * len(ids))
            last.append(len(toks) - 1)
            lens.append(len(ids))
        N = len(toks)
        top = max(pos) + 1
        if top > self.max_len:
            raise ModelError(f"position {top - 1} is past the cache length {self.max_len}")
        H, KV, hd = s.num_heads, s.num_kv_heads, s.head_dim
        positions = torch.tensor(pos, device=dev)
        # RoPE tables for the query heads and the key heads side by side, the queries' scaled by
        # 1/sqrt(head_dim) (folded in here instead of once per layer): [N, H + KV, hd].
        scale = 1.0 / math.sqrt(hd)
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
        cos = torch.cat([(cos * scale).expand(N, H, hd), cos.expand(N, KV, hd)], 1)
        sin = torch.cat([(sin * scale).expand(N, H, hd), sin.expand(N, KV, hd)], 1)
        invariant = self._invariant_groups(wslot, pos) if self.batch_invariant else None
        return _Plan(
            tokens=torch.tensor(toks, device=dev), decode=D, lens=lens, last=last, cos=cos, sin=sin,
            # rows of a layer's cache flattened to [(S + 1) * max_len, KV * hd] this call writes: [N]
            write_rows=torch.tensor(wslot, device=dev) * self.max_len + positions,
            invariant=invariant,
            segments=self._decode_runs(pos[:D], positions) if D and invariant is None else [],
            prefill=self._prefill_gather(step, D, lens, positions) if lens and invariant is None else None,
            loras=_lora_rows(step.lora, D, lens, dev))

    def _decode_runs(self, pos: list[int], positions: torch.Tensor) -> list[tuple]:
        """The decode rows cut into runs (``decode_segments``): per run, rows a .. b - 1 against their
        slots' first ``keys`` keys, with the attention layout and its additive mask: (a, b, keys,
        per_row, bias)."""
        s, dev = self.spec, self.device
        H, KV, hd = s.num_heads, s.num_kv_heads, s.head_dim
        segments = []
        for a, b, keys in decode_segments(pos)[0]:
            dec_pos = positions[a:b]
            # Short keys: each row's H query heads against its slot's keys as one [keys * KV, hd]
            # matrix (column j: position j // KV, key head j % KV; a query head sees only its own
            # key head's columns): KV times the attention FLOPs in one matmul per row instead of
            # KV, which is cheaper while the keys are short. Long keys: one matmul per key head.
            per_row = KV == 1 or H * hd * keys <= ROW_ATTENTION_MAX
            cols = torch.arange(keys * KV if per_row else keys, device=dev)
            seen = ((cols // KV) if per_row else cols)[None, :] <= dec_pos[:, None]  # [rows, cols]
            if per_row:
                own = (cols % KV)[None, :] == (torch.arange(H, device=dev) // (H // KV))[:, None]  # [H, cols]
                seen = own[None] & seen[:, None]  # [rows, H, cols]
            else:
                seen = seen[:, None, None, :]  # [rows, 1, 1, cols]
            bias = torch.zeros(seen.shape, dtype=self.dtype, device=dev).masked_fill_(~seen, float("-inf"))
            segments.append((a, b, keys, per_row, bias))
        return segments

    def _prefill_gather(self, step: Step, D: int, lens: list[int], positions: torch.Tensor) -> _PrefillGather:
        """How the prefill rows attend in one masked SDPA call, padded to the longest row."""
        dev = self.device
        T = max(lens)
        offsets = torch.tensor([0, *lens[:-1]], device=dev).cumsum(0)
        t = torch.arange(T, device=dev)
        length = torch.tensor(lens, device=dev)
        valid = t[None, :] < length[:, None]  # [P, T]
        # padded query t of row p is packed token D + offsets[p] + t (pads repeat the last one)
        gather = D + offsets[:, None] + torch.minimum(t[None, :], length[:, None] - 1)
        q_pos = positions[gather]  # [P, T]
        pre_len = max(start + len(ids) for _, start, ids in step.prefill)
        return _PrefillGather(
            rows=len(lens), width=T, gather=gather,
            slots=torch.tensor([slot for slot, _, _ in step.prefill], device=dev), keys=pre_len,
            mask=torch.arange(pre_len, device=dev)[None, None, None, :] <= q_pos[:, None, :, None],
            keep=valid.reshape(-1).nonzero().squeeze(1))

    def _attention(self, plan: _Plan, q: torch.Tensor, ck: torch.Tensor, cv: torch.Tensor) -> torch.Tensor:
        """One layer's attention output ``[N, H * hd]`` for the packed queries ``q`` ``[N, H, hd]``,
        from the layer's caches (this step's keys and values already written)."""
        H, KV, hd = self.spec.num_heads, self.spec.num_kv_heads, self.spec.head_dim
        q_out = H * hd
        parts = []
        if plan.invariant is not None:  # every token alone against its own keys, decode or prefill
            parts.append(self._invariant_attention(plan.invariant, q, ck, cv))
        # decode rows: small batched matmuls (SDPA's CPU kernels are tiled for long queries, slower here)
        for a, b, n, per_row, bias in plan.segments:
            keys, values = ck[a:b, :n], cv[a:b, :n]  # views: consecutive slots
            if per_row:
                keys, values = keys.reshape(b - a, n * KV, hd), values.reshape(b - a, n * KV, hd)
                probs = torch.baddbmm(bias, q[a:b], keys.transpose(1, 2)).softmax(dim=-1)
                parts.append(torch.bmm(probs, values).reshape(b - a, q_out))
            else:
                scores = torch.matmul(q[a:b].reshape(b - a, KV, H // KV, hd), keys.permute(0, 2, 3, 1))
                probs = scores.add_(bias).softmax(dim=-1)
                parts.append(torch.matmul(probs, values.transpose(1, 2)).reshape(b - a, q_out))
        pre = plan.prefill
        if pre is not None:  # one masked SDPA call over the prefill rows
            qp = q[pre.gather].transpose(1, 2)  # [P, H, T, hd]
            keys = ck[pre.slots, : pre.keys].transpose(1, 2)  # [P, KV, pre_len, hd]
            values = cv[pre.slots, : pre.keys].transpose(1, 2)
            out = F.scaled_dot_product_attention(qp, keys, values, attn_mask=pre.mask, scale=1.0,
                                                 enable_gqa=KV != H)
            parts.append(out.transpose(1, 2).reshape(pre.rows * pre.width, q_out)[pre.keep])
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _invariant_groups(self, slots: list[int], positions: list[int]) -> list[tuple[torch.Tensor, ...]]:
        """The packed tokens grouped by key length (``INVARIANT_KEYS``): per group, the tokens'
        rows, their slots, their key length and the mask of keys past each token."""
        by_len: dict[int, list[int]] = {}
        for n, p in enumerate(positions):
            by_len.setdefault(min(self.max_len, -(-(p + 1) // INVARIANT_KEYS) * INVARIANT_KEYS), []).append(n)
        groups = []
        for length, rows in sorted(by_len.items()):
            idx = self._index(rows)
            past = torch.arange(length, device=self.device)[None, :] > self._index([positions[n] for n in rows])[:, None]
            bias = torch.zeros(past.shape, dtype=self.dtype, device=self.device).masked_fill_(past, float("-inf"))
            groups.append((idx, self._index([slots[n] for n in rows]), length, bias[:, None, None, :]))
        return groups

    def _invariant_attention(self, groups: list[tuple[torch.Tensor, ...]], q: torch.Tensor, ck: torch.Tensor,
                             cv: torch.Tensor) -> torch.Tensor:
        """Attention of every packed token (``q``: ``[N, H, hd]``, scaled) over its own slot's
        keys, one batched matmul per key-length group; ``[N, H * hd]``."""
        s = self.spec
        H, KV, hd = s.num_heads, s.num_kv_heads, s.head_dim
        out = q.new_empty(q.shape[0], H * hd)
        for idx, slots, length, bias in groups:
            R = idx.shape[0]
            # contiguous: on a strided operand the matmul's kernel (and so its order of sums) may
            # depend on R, the group's size (DESIGN.md §4, "Deterministic mode")
            keys = ck[slots, :length].permute(0, 2, 3, 1).contiguous()  # [R, KV, hd, length]
            values = cv[slots, :length].transpose(1, 2).contiguous()  # [R, KV, length, hd]
            scores = torch.matmul(q[idx].view(R, KV, H // KV, hd), keys).add_(bias)
            out[idx] = torch.matmul(scores.softmax(dim=-1), values).reshape(R, H * hd)
        return out

    @torch.inference_mode()
    def token_logprobs(self, hidden: torch.Tensor, targets: list[int], top_n: int = 0,
                       chunk: int = 256) -> tuple[list[float], list[list[tuple[float, int]]]]:
        """Log-probabilities of ``targets[i]`` under the raw model distribution at ``hidden[i]``
        (``Step.hidden``), and the ``top_n`` most likely (logprob, id) pairs of each row;
        ``chunk`` rows of logits at a time."""
        lps: list[float] = []
        tops: list[list[tuple[float, int]]] = []
        ids = torch.tensor(targets, device=self.device)
        packs = self._packs()
        for i in range(0, len(targets), chunk):
            rows = hidden[i : i + chunk]
            logp = self._logits(rows, packs).log_softmax(dim=-1)
            lps.extend(logp.gather(1, ids[i : i + chunk, None]).squeeze(1).tolist())
            if top_n:
                vals, idx = logp.topk(min(top_n, logp.shape[1]), dim=-1)
                tops.extend([list(zip(v, t, strict=True)) for v, t in zip(vals.tolist(), idx.tolist(), strict=True)])
        return lps, tops
