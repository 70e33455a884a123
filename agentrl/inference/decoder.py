"""A batched decoder forward pass over a slot KV cache, for the Llama/Qwen family.

What it is: the model half of ``agentrl serve``'s engine. ``load_decoder(DIR)`` reads a
Hugging Face checkpoint (``config.json`` + safetensors) into plain tensors, and
``Decoder.forward`` runs any set of cache slots at once: each row of the batch is one
request, with its own positions, writing its new keys/values into its own slot of the cache
and attending to everything that slot holds up to its own position. Prefill (many tokens per
row, right-padded) and decode (one token per row) are the same call.

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
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Decoder:
    """Weights + slot KV cache + the forward pass. Not thread-safe: one engine thread owns it."""

    def __init__(self, model_dir: str | Path, *, num_slots: int, max_len: int, device: str = "cpu",
                 dtype: torch.dtype | None = None) -> None:
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
        shape = (s.num_layers, num_slots, s.num_kv_heads, max_len, s.head_dim)
        self.cache_k = torch.zeros(shape, device=self.device, dtype=dtype)
        self.cache_v = torch.zeros(shape, device=self.device, dtype=dtype)
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
        to ``self.weights`` between two steps (the cache is kept)."""
        config = read_config(model_dir)
        if spec_of(config) != self.spec:
            raise ModelError(
                f"{model_dir}: its architecture differs from the served model; only same-shape "
                f"checkpoints can be loaded (got {spec_of(config)}, serving {self.spec})"
            )
        tied = bool(getattr(config, "tie_word_embeddings", False))
        return load_weights(model_dir, self.spec, tied, str(self.device), self.dtype)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor | slice,
                logit_index: torch.Tensor | None = None) -> torch.Tensor:
        """Run rows ``[B, T]`` of tokens at ``positions`` ``[B, T]`` in cache ``slots``.

        ``slots`` is a ``[B]`` long tensor of slot indices, or a ``slice`` of consecutive
        slots (no gather). Keys/values are written at each row's positions; each query
        attends to its slot's keys at positions <= its own. Right padding is allowed (pad
        with any token at positions past the real ones; their outputs are garbage and
        their cache entries are overwritten later). Returns float32 logits ``[B, T, V]``, or
        ``[B, V]`` at one position per row when ``logit_index`` (``[B]``) is given.
        """
        s, w = self.spec, self.weights
        B, T = tokens.shape
        L = int(positions.max()) + 1
        if L > self.max_len:
            raise ModelError(f"position {L - 1} is past the cache length {self.max_len}")
        if isinstance(slots, slice):
            row_slot = torch.arange(slots.start, slots.stop, device=self.device)
        else:
            row_slot = slots
        cos = self.cos[positions].unsqueeze(1)  # [B, 1, T, D]
        sin = self.sin[positions].unsqueeze(1)
        key_pos = torch.arange(L, device=self.device)
        mask = (key_pos[None, None, None, :] <= positions[:, None, :, None])  # [B, 1, T, L]
        bias = torch.zeros(mask.shape, dtype=self.dtype, device=self.device).masked_fill_(~mask, float("-inf"))
        scale = 1.0 / math.sqrt(s.head_dim)
        # Rows of the flattened cache [S * KV * max_len, D] that this call writes: [B, KV, T].
        heads = torch.arange(s.num_kv_heads, device=self.device)
        write_rows = ((row_slot[:, None, None] * s.num_kv_heads + heads[None, :, None]) * self.max_len
                      + positions[:, None, :]).reshape(-1)
        q_out, kv_out = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        x = w["embed"][tokens]
        for i, layer in enumerate(w["layers"]):
            h = _rms_norm(x, layer["ln1"], s.rms_eps)
            qkv = F.linear(h, layer["qkv"], layer["qkv_bias"])
            q = qkv[..., :q_out].view(B, T, s.num_heads, s.head_dim)
            k = qkv[..., q_out : q_out + kv_out].view(B, T, s.num_kv_heads, s.head_dim)
            v = qkv[..., q_out + kv_out :].view(B, T, s.num_kv_heads, s.head_dim)
            if s.qk_norm:
                q = _rms_norm(q, layer["q_norm"], s.rms_eps)
                k = _rms_norm(k, layer["k_norm"], s.rms_eps)
            q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, H, T, D]
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            ck, cv = self.cache_k[i], self.cache_v[i]  # [S, KV, max_len, D]
            ck.view(-1, s.head_dim).index_copy_(0, write_rows, k.reshape(-1, s.head_dim))
            cv.view(-1, s.head_dim).index_copy_(0, write_rows, v.transpose(1, 2).reshape(-1, s.head_dim))
            keys, values = ck[slots, :, :L], cv[slots, :, :L]
            if T == 1:
                # one query per row: grouped heads as a small batched matmul (SDPA's CPU
                # kernels are tiled for long queries and cost several times more here)
                g = s.num_heads // s.num_kv_heads
                scores = torch.matmul(q.reshape(B, s.num_kv_heads, g, s.head_dim), keys.transpose(-1, -2))
                probs = (scores * scale + bias).softmax(dim=-1)
                attn = torch.matmul(probs, values).reshape(B, s.num_heads, 1, s.head_dim)
            else:
                attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale,
                                                      enable_gqa=s.num_kv_heads != s.num_heads)
            x = x + F.linear(attn.transpose(1, 2).reshape(B, T, q_out), layer["o"])
            h = _rms_norm(x, layer["ln2"], s.rms_eps)
            gate, up = F.linear(h, layer["gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer["down"])
        if logit_index is not None:
            x = x[torch.arange(B, device=self.device), logit_index]
        x = _rms_norm(x, w["norm"], s.rms_eps)
        return F.linear(x, w["lm_head"]).float()
