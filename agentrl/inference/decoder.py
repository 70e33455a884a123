"""A packed decoder forward pass over a slot KV cache, for the Llama/Qwen family.

What it is: the model half of ``agentrl serve``'s engine. ``load_weights`` reads a Hugging
Face checkpoint (``config.json`` + safetensors) into plain tensors, and ``Decoder.forward``
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

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from agentrl.errors import ModelError

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")

ROW_ATTENTION_MAX = 131072
"""Decode attention takes one matmul per row over all key heads while ``heads * head_dim *
keys`` stays below this, one per key head above it. On the tiny model (4 x 32, 2 key heads, one
CPU thread) a decode step of 256 rows over 20 keys took 13.0 ms instead of 15.3, 64 rows over
250 keys 11.2 instead of 15.1, 16 rows over 600 keys 6.6 instead of 9.6: the call overhead of a
small matmul outweighs twice the (tiny) attention FLOPs. Larger heads tip the balance sooner."""


@dataclass
class DecoderSpec:
    """Shapes and constants of one checkpoint (what must match for a weight swap)."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_eps: float
    max_positions: int
    qk_norm: bool


def read_config(model_dir: str | Path):
    """The checkpoint's transformers config, after checking the architecture is supported."""
    from transformers import AutoConfig

    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise ModelError(f"{str(path)!r} has no config.json; pass a Hugging Face checkpoint directory")
    raw = json.loads((path / "config.json").read_text())
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelError(
            f"model_type {model_type!r} in {path}/config.json is not supported by the embedded engine "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)}); serve it with SGLang instead"
        )
    config = AutoConfig.from_pretrained(str(path))
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
    return DecoderSpec(
        model_type=config.model_type,
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_heads=heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        vocab_size=config.vocab_size,
        rms_eps=config.rms_norm_eps,
        max_positions=config.max_position_embeddings,
        qk_norm=config.model_type == "qwen3",
    )


def _read_state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelError(
            f"{str(model_dir)!r} has no *.safetensors weights; save the checkpoint with "
            "save_pretrained(..., safe_serialization=True)"
        )
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def load_weights(model_dir: str | Path, spec: DecoderSpec, tied: bool, device: str, dtype: torch.dtype):
    """Read a checkpoint's tensors into the fused layout ``Decoder`` runs on."""
    path = Path(model_dir)
    state = _read_state_dict(path)

    def take(name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        t = state.get(name)
        if t is None:
            t = state.get(name.removeprefix("model."))
        if t is None:
            raise ModelError(f"{path}: tensor {name!r} is missing from the checkpoint")
        if shape is not None and tuple(t.shape) != shape:
            raise ModelError(f"{path}: tensor {name!r} has shape {tuple(t.shape)}, expected {shape}")
        return t.to(device=device, dtype=dtype)

    s = spec
    q_out, kv_out = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    layers = []
    for i in range(s.num_layers):
        p = f"model.layers.{i}."
        qkv = torch.cat([take(p + f"self_attn.{n}_proj.weight") for n in "qkv"], 0)
        if qkv.shape != (q_out + 2 * kv_out, s.hidden_size):
            raise ModelError(f"{path}: layer {i} q/k/v projections do not match config.json")
        bias = None
        if p + "self_attn.q_proj.bias" in state:
            bias = torch.cat([take(p + f"self_attn.{n}_proj.bias") for n in "qkv"], 0)
        layer = {
            "ln1": take(p + "input_layernorm.weight", (s.hidden_size,)),
            "qkv": qkv,
            "qkv_bias": bias,
            "o": take(p + "self_attn.o_proj.weight", (s.hidden_size, q_out)),
            "ln2": take(p + "post_attention_layernorm.weight", (s.hidden_size,)),
            "gate_up": torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")], 0),
            "down": take(p + "mlp.down_proj.weight"),
        }
        if s.qk_norm:
            layer["q_norm"] = take(p + "self_attn.q_norm.weight", (s.head_dim,))
            layer["k_norm"] = take(p + "self_attn.k_norm.weight", (s.head_dim,))
        layers.append(layer)
    embed = take("model.embed_tokens.weight", (s.vocab_size, s.hidden_size))
    lm_head = embed if tied or "lm_head.weight" not in state else take("lm_head.weight", (s.vocab_size, s.hidden_size))
    return {"embed": embed, "norm": take("model.norm.weight", (s.hidden_size,)), "lm_head": lm_head, "layers": layers}


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


class Decoder:
    """Weights, slot KV cache, prefix pool and the forward pass. Not thread-safe: one engine
    thread owns it."""

    def __init__(self, model_dir: str | Path, *, num_slots: int, max_len: int, device: str = "cpu",
                 dtype: torch.dtype | None = None, pool_tokens: int = 0) -> None:
        self.config = read_config(model_dir)
        self.spec = spec_of(self.config)
        self.device = torch.device(device)
        if dtype is None:
            dtype = torch.float32 if self.device.type == "cpu" else torch.bfloat16
        self.dtype = dtype
        self.tied = bool(getattr(self.config, "tie_word_embeddings", False))
        self.weights = load_weights(model_dir, self.spec, self.tied, device, dtype)
        self.num_slots, self.max_len = num_slots, max_len
        s = self.spec
        # [layers, slots + 1, positions, kv_heads, head_dim]: a slot's keys are one [positions,
        # kv_heads * head_dim] matrix (what the decode attention reads in one piece); one slot
        # past the last is the scratch slot that filler rows write to.
        shape = (s.num_layers, num_slots + 1, max_len, s.num_kv_heads, s.head_dim)
        self.cache_k = torch.zeros(shape, device=self.device, dtype=dtype)
        self.cache_v = torch.zeros(shape, device=self.device, dtype=dtype)
        # The prefix cache's entries, one token each: [layers, pool_tokens, kv_heads, head_dim].
        self.pool_tokens = pool_tokens
        pool = (s.num_layers, pool_tokens, s.num_kv_heads, s.head_dim)
        self.pool_k = torch.zeros(pool, device=self.device, dtype=dtype)
        self.pool_v = torch.zeros(pool, device=self.device, dtype=dtype)
        self.cos, self.sin = self._rope_table(max_len)

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
        """Load a same-shape checkpoint without installing it: the engine assigns the result
        to ``self.weights`` between two steps (the slot cache is kept; the engine empties
        the prefix cache)."""
        config = read_config(model_dir)
        if spec_of(config) != self.spec:
            raise ModelError(
                f"{model_dir}: its architecture differs from the served model; only same-shape "
                f"checkpoints can be loaded (got {spec_of(config)}, serving {self.spec})"
            )
        tied = bool(getattr(config, "tie_word_embeddings", False))
        return load_weights(model_dir, self.spec, tied, str(self.device), self.dtype)

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
        (``ROW_ATTENTION_MAX``); prefill rows gather their slots' keys and run one masked SDPA
        call, padded to the longest prefill row (padding in attention only, not in the matmuls).
        """
        s, w, dev = self.spec, self.weights, self.device
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
        q_out, kv_out = H * hd, KV * hd
        tokens = torch.tensor(toks, device=dev)
        positions = torch.tensor(pos, device=dev)
        # RoPE tables for the query heads and the key heads side by side, the queries' scaled by
        # 1/sqrt(head_dim) (folded in here instead of once per layer): [N, H + KV, hd].
        scale = 1.0 / math.sqrt(hd)
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
        cos = torch.cat([(cos * scale).expand(N, H, hd), cos.expand(N, KV, hd)], 1)
        sin = torch.cat([(sin * scale).expand(N, H, hd), sin.expand(N, KV, hd)], 1)
        # Rows of a layer's cache flattened to [(S + 1) * max_len, KV * hd] this call writes: [N].
        write_rows = torch.tensor(wslot, device=dev) * self.max_len + positions
        if D:
            dec_pos = positions[:D]
            dec_len = int(dec_pos.max()) + 1
            # Short keys: each row's H query heads against its slot's keys as one [dec_len * KV,
            # hd] matrix (column j: position j // KV, key head j % KV; a query head sees only its
            # own key head's columns): KV times the attention FLOPs in one matmul per row instead
            # of KV, which is cheaper while the keys are short. Long keys: one matmul per key head.
            per_row = KV == 1 or H * hd * dec_len <= ROW_ATTENTION_MAX
            cols = torch.arange(dec_len * KV if per_row else dec_len, device=dev)
            seen = ((cols // KV) if per_row else cols)[None, :] <= dec_pos[:, None]  # [D, cols]
            if per_row:
                own = (cols % KV)[None, :] == (torch.arange(H, device=dev) // (H // KV))[:, None]  # [H, cols]
                seen = own[None] & seen[:, None]  # [D, H, cols]
            else:
                seen = seen[:, None, None, :]  # [D, 1, 1, cols]
            dec_bias = torch.zeros(seen.shape, dtype=self.dtype, device=dev).masked_fill_(~seen, float("-inf"))
        if lens:
            P, T = len(lens), max(lens)
            pre_slots = torch.tensor([slot for slot, _, _ in step.prefill], device=dev)
            pre_len = max(start + len(ids) for _, start, ids in step.prefill)
            offsets = torch.tensor([0, *lens[:-1]], device=dev).cumsum(0)
            t = torch.arange(T, device=dev)
            length = torch.tensor(lens, device=dev)
            valid = t[None, :] < length[:, None]  # [P, T]
            # padded query t of row p is packed token D + offsets[p] + t (pads repeat the last one)
            gather = D + offsets[:, None] + torch.minimum(t[None, :], length[:, None] - 1)
            q_pos = positions[gather]  # [P, T]
            pre_mask = (torch.arange(pre_len, device=dev)[None, None, None, :] <= q_pos[:, None, :, None])
            keep = valid.reshape(-1).nonzero().squeeze(1)
        x = w["embed"][tokens]
        for i, layer in enumerate(w["layers"]):
            h = _rms_norm(x, layer["ln1"], s.rms_eps)
            qkv = F.linear(h, layer["qkv"], layer["qkv_bias"])
            qk = qkv[:, : q_out + kv_out].view(N, H + KV, hd)
            if s.qk_norm:
                qk = torch.cat([_rms_norm(qk[:, :H], layer["q_norm"], s.rms_eps),
                                _rms_norm(qk[:, H:], layer["k_norm"], s.rms_eps)], 1)
            qk = qk * cos + _rotate_half(qk) * sin
            q = qk[:, :H]
            ck, cv = self.cache_k[i], self.cache_v[i]  # [S + 1, max_len, KV, hd]
            ck.view(-1, kv_out).index_copy_(0, write_rows, qk[:, H:].reshape(N, kv_out))
            cv.view(-1, kv_out).index_copy_(0, write_rows, qkv[:, q_out + kv_out :])
            parts = []
            if D:  # small batched matmuls (SDPA's CPU kernels are tiled for long queries, slower here)
                keys, values = ck[:D, :dec_len], cv[:D, :dec_len]  # views: consecutive slots
                if per_row:
                    keys, values = keys.reshape(D, dec_len * KV, hd), values.reshape(D, dec_len * KV, hd)
                    probs = torch.baddbmm(dec_bias, q[:D], keys.transpose(1, 2)).softmax(dim=-1)
                    parts.append(torch.bmm(probs, values).reshape(D, q_out))
                else:
                    scores = torch.matmul(q[:D].reshape(D, KV, H // KV, hd), keys.permute(0, 2, 3, 1))
                    probs = scores.add_(dec_bias).softmax(dim=-1)
                    parts.append(torch.matmul(probs, values.transpose(1, 2)).reshape(D, q_out))
            if lens:
                qp = q[gather].transpose(1, 2)  # [P, H, T, hd]
                keys = ck[pre_slots, :pre_len].transpose(1, 2)  # [P, KV, pre_len, hd]
                values = cv[pre_slots, :pre_len].transpose(1, 2)
                out = F.scaled_dot_product_attention(qp, keys, values, attn_mask=pre_mask, scale=1.0,
                                                     enable_gqa=KV != H)
                parts.append(out.transpose(1, 2).reshape(P * T, q_out)[keep])
            attn = parts[0] if len(parts) == 1 else torch.cat(parts)
            x = torch.addmm(x, attn, layer["o"].t())  # x + attn @ o^T, the residual add fused in
            h = _rms_norm(x, layer["ln2"], s.rms_eps)
            gate, up = F.linear(h, layer["gate_up"]).chunk(2, dim=-1)
            x = torch.addmm(x, F.silu(gate).mul_(up), layer["down"].t())
        x = _rms_norm(x[torch.tensor(last, device=dev)], w["norm"], s.rms_eps)
        return F.linear(x, w["lm_head"]).float()
