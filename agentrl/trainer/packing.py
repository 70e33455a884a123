"""Sequence packing: many variable-length sequences into few dense rows, balanced over ranks.

What it is: the planning (which sequences go to which rank and micro-batch) and the tensor
layout of one packed micro-batch — all sequences concatenated into a single row, position ids
restarting at 0 for each sequence, and a block-diagonal causal attention mask so no token sees
another sequence. A padded layout is kept beside it as the baseline the tests and
``benchmarks/packing.py`` compare against. What it is not: the forward pass (``agentrl.trainer.actor``).

Main hooks: ``plan_micro_batches(lengths, world_size, token_budget)`` and ``pack(...)``.

Planning. Sequences are first dealt to ranks by longest-processing-time (largest first, to the
rank holding the fewest tokens), then each rank fills micro-batches to ``token_budget`` tokens
by first-fit decreasing. A sequence longer than the budget gets a micro-batch of its own (it is
never split or dropped). All ranks get the same number of micro-batches — an FSDP forward is a
collective, so a rank with less work runs empty micro-batches (``[]``) to keep in step.

Attention. With ``eager``/``sdpa`` the packed row gets an explicit block-diagonal causal mask,
[1, 1, T, T] (bool for sdpa, additive float for eager): simple, but the attention still costs
T² for the whole row. ``sdpa_segments`` (registered with transformers by
``register_segment_attention``; the CPU default of the actor) computes the same block-diagonal
causal attention block by block — one causal SDPA call per packed sequence, found from the
restarting position ids — so it costs Σ len² and builds no mask. With varlen kernels
(``flash_attention_2``/``3``) no mask is built either: transformers derives the sequence
boundaries from the position ids.

Log-probabilities are token-aligned: entry t of a sequence is log π(token_t | tokens_<t), and
entry 0 of every sequence is 0 (no prediction exists for a first token).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

SEGMENT_ATTENTION = "sdpa_segments"
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3", "kernels-community/flash-attn", SEGMENT_ATTENTION)


# --------------------------------------------------------------------------- planning


def first_fit_decreasing(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Bins of sequence indices whose lengths sum to <= ``budget`` (oversized ones alone).

    Sequences are placed longest first into the first bin with room; bins are returned in
    creation order and each bin lists its indices in ascending order.
    """
    if budget < 1:
        raise ValueError(f"token budget must be >= 1, got {budget}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = lengths[i]
        for b, free in enumerate(room):
            if n <= free:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(budget - n)
    return [sorted(b) for b in bins]


def balance_across_ranks(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Deal sequence indices to ``world_size`` ranks so token counts are as even as greedy
    largest-first placement makes them. Each rank's indices come back in ascending order."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    load = [0] * world_size
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        ranks[r].append(i)
        load[r] += lengths[i]
    return [sorted(r) for r in ranks]


def plan_micro_batches(lengths: Sequence[int], world_size: int, token_budget: int) -> list[list[list[int]]]:
    """``plan[rank][k]`` = sequence indices of micro-batch k on ``rank``; every rank gets the
    same number of micro-batches (padded with empty ones). Deterministic, so every rank can
    compute the whole plan from the same global batch."""
    per_rank = balance_across_ranks(lengths, world_size)
    plan = []
    for idx in per_rank:
        bins = first_fit_decreasing([lengths[i] for i in idx], token_budget)
        plan.append([[idx[j] for j in b] for b in bins])
    depth = max((len(p) for p in plan), default=0)
    for p in plan:
        p.extend([] for _ in range(depth - len(p)))
    return plan


# --------------------------------------------------------------------------- layouts


@dataclass
class PackedMicroBatch:
    """One row holding several sequences back to back.

    ``input_ids`` and ``position_ids``: [1, T]; ``fields``: token-aligned [T] tensors (loss
    mask, log-probabilities, advantages ...); ``seq_lens``: length of each packed sequence;
    ``indices``: which sequences of the batch they are, in order.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    seq_lens: list[int]
    indices: list[int]
    fields: dict[str, torch.Tensor]

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def attention_mask(self, attn_implementation: str, dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
        """The block-diagonal causal mask for this row, or None for varlen kernels."""
        if attn_implementation in VARLEN_ATTENTION:
            return None
        allowed = block_causal_mask(self.seq_lens, self.input_ids.device)
        if attn_implementation == "eager":
            out = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
            return out.masked_fill_(~allowed, torch.finfo(dtype).min)
        return allowed

    def split(self, values: torch.Tensor) -> list[torch.Tensor]:
        """Cut a token-aligned [T] (or [1, T]) tensor back into per-sequence tensors."""
        return list(values.reshape(-1).split(self.seq_lens))


def block_causal_mask(seq_lens: Sequence[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """[1, 1, T, T] bool: True where query i may attend to key j (same sequence, j <= i)."""
    seg = torch.repeat_interleave(
        torch.arange(len(seq_lens), device=device), torch.tensor(list(seq_lens), device=device)
    )
    t = seg.numel()
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril_()
    return (causal & (seg[:, None] == seg[None, :]))[None, None]


def pack(sequences: Sequence[Mapping[str, torch.Tensor]], indices: Sequence[int]) -> PackedMicroBatch:
    """Pack ``sequences[i] for i in indices`` (each a dict of equal-length 1-D tensors with at
    least ``input_ids``) into one row."""
    if not indices:
        raise ValueError("pack needs at least one sequence")
    chosen = [sequences[i] for i in indices]
    lens = [int(s["input_ids"].numel()) for s in chosen]
    if min(lens) < 1:
        raise ValueError("pack: every sequence needs at least one token")
    keys = [k for k in chosen[0] if k != "input_ids"]
    fields = {k: torch.cat([s[k].reshape(-1) for s in chosen]) for k in keys}
    input_ids = torch.cat([s["input_ids"].reshape(-1) for s in chosen])[None]
    position_ids = torch.cat([torch.arange(n) for n in lens])[None].to(input_ids.device)
    return PackedMicroBatch(input_ids, position_ids, lens, list(indices), fields)


@dataclass
class PaddedMicroBatch:
    """The baseline layout: [B, L] right-padded rows with a 2-D attention mask."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    seq_lens: list[int]
    indices: list[int]
    fields: dict[str, torch.Tensor]  # [B, L], zero in padding

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    def split(self, values: torch.Tensor) -> list[torch.Tensor]:
        return [values[b, :n] for b, n in enumerate(self.seq_lens)]


def pad(sequences: Sequence[Mapping[str, torch.Tensor]], indices: Sequence[int], pad_id: int) -> PaddedMicroBatch:
    """Right-pad ``sequences[i] for i in indices`` to the longest of them."""
    chosen = [sequences[i] for i in indices]
    lens = [int(s["input_ids"].numel()) for s in chosen]
    width = max(lens)
    ids = torch.full((len(chosen), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(chosen), width), dtype=torch.long)
    keys = [k for k in chosen[0] if k != "input_ids"]
    fields = {k: torch.zeros((len(chosen), width), dtype=chosen[0][k].dtype) for k in keys}
    for b, (s, n) in enumerate(zip(chosen, lens, strict=True)):
        ids[b, :n] = s["input_ids"]
        attn[b, :n] = 1
        for k in keys:
            fields[k][b, :n] = s[k]
    return PaddedMicroBatch(ids, attn, lens, list(indices), fields)


# --------------------------------------------------------------------------- attention


def segment_sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers attention function: causal SDPA run separately on each packed sequence.

    query [B, Hq, T, D], key/value [B, Hkv, T, D] -> ([B, T, Hq, D], None). Sequence starts are
    the positions where ``position_ids`` is 0. Batches of several unpadded rows go to
    transformers' causal SDPA unchanged; a padding mask or a KV cache is refused (the trainer
    uses neither; load the model with ``sdpa`` for those)."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    if attention_mask is not None or query.shape[2] != key.shape[2]:
        raise ValueError(
            f"attn_implementation={SEGMENT_ATTENTION!r} takes packed rows or unpadded batches without a "
            "KV cache; got a padding mask or a cache. Load the model with attn_implementation='sdpa'"
        )
    pos = kwargs.get("position_ids")
    if pos is None or query.shape[0] != 1:
        return sdpa_attention_forward(module, query, key, value, None, dropout=dropout, scaling=scaling, **kwargs)
    t = query.shape[2]
    starts = [*(pos.reshape(-1) == 0).nonzero()[:, 0].tolist(), t]
    if starts[0] != 0:
        starts.insert(0, 0)
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    lens = [b - a for a, b in zip(starts[:-1], starts[1:], strict=True)]
    # split (not slicing): its backward is one concatenation, not a zero-filled [T] grad per piece
    out = [
        torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling, is_causal=True)
        for q, k, v in zip(query.split(lens, 2), key.split(lens, 2), value.split(lens, 2), strict=True)
    ]
    return torch.cat(out, dim=2).transpose(1, 2).contiguous(), None


def register_segment_attention() -> str:
    """Make ``attn_implementation="sdpa_segments"`` known to transformers; returns the name.

    Its mask function is the one of the varlen kernels: no mask for unpadded input, and the 2-D
    padding mask otherwise (which the attention function then refuses, rather than ignore)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

    AttentionInterface.register(SEGMENT_ATTENTION, segment_sdpa_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(SEGMENT_ATTENTION, flash_attention_mask)
    return SEGMENT_ATTENTION


# --------------------------------------------------------------------------- log-probabilities


def token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, seq_starts: torch.Tensor | None = None,
    *, with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-aligned log π(token_t | tokens_<t) from logits [B, T, V] and ids [B, T].

    Returns ([B, T] log-probabilities, [B, T] entropies or None), computed in float32; column 0
    is 0, and so is every position flagged in ``seq_starts`` ([B, T] bool: first token of a
    packed sequence). Entropies (of the distribution that predicted token t) are detached.
    """
    logp_all = logits[:, :-1].float().log_softmax(-1)
    picked = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    out = torch.cat([picked.new_zeros(picked.shape[0], 1), picked], dim=1)
    ent = None
    if with_entropy:
        with torch.no_grad():
            e = -(logp_all.exp() * logp_all).sum(-1)
            ent = torch.cat([e.new_zeros(e.shape[0], 1), e], dim=1)
    if seq_starts is not None:
        out = out.masked_fill(seq_starts, 0.0)
        if ent is not None:
            ent = ent.masked_fill(seq_starts, 0.0)
    return out, ent


def sequence_starts(seq_lens: Sequence[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """[1, T] bool, True on the first token of each packed sequence."""
    starts = torch.zeros(sum(seq_lens), dtype=torch.bool, device=device)
    offsets = torch.tensor([0, *list(seq_lens)[:-1]], device=device).cumsum(0)
    starts[offsets] = True
    return starts[None]
