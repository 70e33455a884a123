"""Sequence packing: many variable-length sequences into few dense rows, balanced over ranks.

What it is: the planning (which sequences go to which rank and micro-batch: longest first to
the least-loaded rank, then first-fit decreasing into ``token_budget``-token micro-batches, the
same number on every rank since an FSDP forward is a collective) and the layout of one packed
row — sequences back to back with restarting position ids, or a group's sequences behind one
copy of their shared prefix (``shared_prefix_units``), the layout written in the position ids
alone. Its attention: ``sdpa_segments`` (registered with transformers; SDPA calls per sequence or
prefix cluster, no [T, T] mask), an explicit mask for ``sdpa``/``eager``, and none for varlen
kernels, which cannot express a shared prefix. ``token_logprobs`` reads which row position
predicts each token (``PackedMicroBatch.sources``). A padded layout is kept as the baseline of
the tests and ``benchmarks/packing.py``. What it is not: the forward pass or the loss
(``agentrl.trainer.actor``). docs/DESIGN.md §4 "Packing" has the rules.

Main hooks: ``plan_units(shared_prefix_units(...), world_size, token_budget)``, ``pack(sequences,
units)``, ``token_logprobs(logits, ids, packed.sources)``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class Unit:
    """What the planner places: one sequence (``prefix`` 0), or sequences laid out behind one
    copy of their first ``prefix`` tokens. ``tokens`` is the row length it takes."""

    members: tuple[int, ...]
    prefix: int
    tokens: int


def shared_prefix_units(sequences: Sequence[Mapping[str, torch.Tensor]], indices: Sequence[int],
                        groups: Sequence[Hashable] | None, budget: int) -> list[Unit]:
    """``indices`` as planner units: the members of one group (``groups[i]``, e.g. a GRPO group
    id) share their longest common prefix, cut before the first loss token of any of them (a
    ``loss_mask`` field, when present) and before every member's last token; a group too big for
    ``budget`` is split into several units. Without ``groups``, or where no prefix is shared,
    every sequence is a unit of its own."""
    lengths = {i: int(sequences[i]["input_ids"].numel()) for i in indices}
    if groups is None:
        return [Unit((i,), 0, lengths[i]) for i in indices]
    by_group: dict[Hashable, list[int]] = {}
    for i in indices:
        by_group.setdefault(groups[i], []).append(i)
    units: list[Unit] = []
    for members in by_group.values():
        prefix = _common_prefix(sequences, members, lengths) if len(members) > 1 else 0
        if prefix == 0:
            units.extend(Unit((i,), 0, lengths[i]) for i in members)
            continue
        chunk: list[int] = []
        size = prefix  # a chunk holds the prefix once and each member's rest, in order
        for i in members:
            if chunk and size + lengths[i] - prefix > budget:
                units.append(_unit(chunk, prefix, lengths))
                chunk, size = [], prefix
            chunk.append(i)
            size += lengths[i] - prefix
        units.append(_unit(chunk, prefix, lengths))
    return units


def _unit(members: list[int], prefix: int, lengths: Mapping[int, int]) -> Unit:
    if len(members) == 1:
        return Unit((members[0],), 0, lengths[members[0]])
    return Unit(tuple(members), prefix, prefix + sum(lengths[i] - prefix for i in members))


def _common_prefix(sequences: Sequence[Mapping[str, torch.Tensor]], members: list[int],
                   lengths: Mapping[int, int]) -> int:
    cap = min(lengths[i] for i in members) - 1  # every member keeps at least one token of its own
    for i in members:
        mask = sequences[i].get("loss_mask")
        if mask is not None:
            on = (mask.reshape(-1) > 0).nonzero()
            if on.numel():
                cap = min(cap, int(on[0, 0]))
    if cap <= 0:
        return 0
    ids = torch.stack([sequences[i]["input_ids"].reshape(-1)[:cap] for i in members])
    differs = (ids != ids[0]).any(0).nonzero()
    return int(differs[0, 0]) if differs.numel() else cap


def plan_units(units: Sequence[Unit], world_size: int, token_budget: int) -> list[list[list[Unit]]]:
    """``plan_micro_batches`` over units: ``plan[rank][k]`` = the units of micro-batch k."""
    plan = plan_micro_batches([u.tokens for u in units], world_size, token_budget)
    return [[[units[j] for j in mb] for mb in rank] for rank in plan]


# --------------------------------------------------------------------------- layouts


@dataclass
class PackedMicroBatch:
    """One row holding several sequences back to back (groups of them behind a shared prefix).

    ``input_ids`` and ``position_ids``: [1, T]; ``fields``: token-aligned [T] tensors (loss
    mask, log-probabilities, advantages ...; a shared prefix holds its first member's values);
    ``sources``: [1, T] long, the row position whose logits predict each token (-1: none);
    ``seq_lens``: length of each packed sequence; ``indices``: which sequences of the batch they
    are, in order; ``pieces``: per sequence, the row spans that hold its tokens, in order.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    seq_lens: list[int]
    indices: list[int]
    fields: dict[str, torch.Tensor]
    sources: torch.Tensor
    pieces: list[list[tuple[int, int]]]

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def attention_mask(self, attn_implementation: str, dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
        """The row's causal mask (block-diagonal, suffixes also seeing their prefix), or None
        for the varlen kernels and ``sdpa_segments``."""
        if attn_implementation in VARLEN_ATTENTION:
            return None
        allowed = row_causal_mask(self.position_ids)
        if attn_implementation == "eager":
            out = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
            return out.masked_fill_(~allowed, torch.finfo(dtype).min)
        return allowed

    def split(self, values: torch.Tensor) -> list[torch.Tensor]:
        """Cut a token-aligned [T] (or [1, T]) row back into per-sequence tensors."""
        flat = values.reshape(-1)
        out = []
        for spans in self.pieces:
            parts = [flat[a:b] for a, b in spans]
            out.append(parts[0] if len(parts) == 1 else torch.cat(parts))
        return out

    def segment_ids(self) -> torch.Tensor:
        """[T] long: which packed sequence (0 .. len(indices)-1) each row position belongs to; a
        shared prefix belongs to its last member (it never holds a loss token)."""
        out = torch.zeros(self.num_tokens, dtype=torch.long)
        for k, spans in enumerate(self.pieces):
            for a, b in spans:
                out[a:b] = k
        return out

    def join(self, values: Sequence[torch.Tensor]) -> torch.Tensor:
        """The inverse of ``split``: per-sequence tensors (``indices`` order) laid out as the row
        (a shared prefix takes its first member's values)."""
        parts, at = [], 0
        for spans, v in zip(self.pieces, values, strict=True):
            offset = 0
            for a, b in spans:
                if a >= at:  # a span not yet written (a prefix is written by its first member)
                    parts.append(v[offset:offset + b - a])
                    at = b
                offset += b - a
        return torch.cat(parts)


def _segments(position_ids: torch.Tensor) -> list[tuple[int, int, int]]:
    """A packed row's runs of consecutive positions, as (row start, row end, first position)."""
    pos = position_ids.reshape(-1)
    t = int(pos.numel())
    if t == 0:
        return []
    breaks = ((pos[1:] != pos[:-1] + 1).nonzero()[:, 0] + 1).tolist()
    starts = [0, *breaks]
    ends = [*breaks, t]
    first = pos[starts].tolist()
    return list(zip(starts, ends, first, strict=True))


def row_layout(position_ids: torch.Tensor) -> list[tuple[int, int, list[int]]]:
    """The row's clusters as (row start, prefix length, suffix lengths). A run of consecutive
    positions starting at 0 opens a cluster: a whole sequence, or a shared prefix with its first
    suffix written right after it (their positions run on). A run starting at P > 0 is a further
    suffix: the open cluster's first P tokens are its prefix, and every suffix continues the same P."""
    clusters: list[tuple[int, int, list[int]]] = []
    for start, end, first in _segments(position_ids):
        if first == 0:
            clusters.append((start, end - start, []))
            continue
        if clusters:
            row_start, n, suffixes = clusters[-1]
            if not suffixes and 0 < first < n:  # the opening run was the prefix and the first suffix
                clusters[-1] = (row_start, first, [n - first, end - start])
                continue
            if suffixes and first == n:
                suffixes.append(end - start)
                continue
        raise ValueError(f"packed row: a run starting at position {first} at row index {start} "
                         "continues no prefix of that length")
    return clusters


def row_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """[1, 1, T, T] bool: True where query i may attend to key j (j <= i, and j in i's sequence:
    its own run, or the prefix its run continues)."""
    pos = position_ids.reshape(-1)
    device = pos.device
    t = int(pos.numel())
    run = torch.zeros(t, dtype=torch.long, device=device)
    cluster = torch.zeros(t, dtype=torch.long, device=device)
    prefix = torch.zeros(t, dtype=torch.bool, device=device)
    r = 0
    for c, (start, plen, suffixes) in enumerate(row_layout(pos)):
        end = start + plen + sum(suffixes)
        cluster[start:end] = c
        prefix[start:start + plen] = bool(suffixes)
        at = start
        for n in [plen, *suffixes]:
            run[at:at + n] = r
            r, at = r + 1, at + n
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril_()
    same = (run[:, None] == run[None, :]) | ((cluster[:, None] == cluster[None, :]) & prefix[None, :])
    return (causal & same)[None, None]


def pack(sequences: Sequence[Mapping[str, torch.Tensor]], items: Sequence[int | Unit]) -> PackedMicroBatch:
    """Pack ``sequences`` into one row: each item a sequence index, or a ``Unit`` (its members
    behind one copy of their shared prefix). Each sequence is a dict of equal-length 1-D tensors
    with at least ``input_ids``."""
    if not items:
        raise ValueError("pack needs at least one sequence")
    units = [u if isinstance(u, Unit) else Unit((u,), 0, int(sequences[u]["input_ids"].numel())) for u in items]
    indices = [i for u in units for i in u.members]
    lens = [int(sequences[i]["input_ids"].numel()) for i in indices]
    if min(lens) < 1:
        raise ValueError("pack: every sequence needs at least one token")
    keys = list(sequences[indices[0]])
    cuts: list[tuple[int, int, int]] = []  # (sequence, start, end) in row order
    pieces: list[list[tuple[int, int]]] = []
    sources: list[torch.Tensor] = []
    at = 0
    for u in units:
        if u.prefix:
            first = u.members[0]
            cuts.append((first, 0, u.prefix))
            sources.append(torch.arange(at - 1, at + u.prefix - 1))
            sources[-1][0] = -1
            shared, last = (at, at + u.prefix), at + u.prefix - 1
            at += u.prefix
        for i in u.members:
            start = u.prefix
            n = int(sequences[i]["input_ids"].numel()) - start
            cuts.append((i, start, start + n))
            src = torch.arange(at - 1, at + n - 1)
            src[0] = last if u.prefix else -1
            sources.append(src)
            pieces.append([shared, (at, at + n)] if u.prefix else [(at, at + n)])
            at += n
    row = {k: torch.cat([sequences[i][k].reshape(-1)[a:b] for i, a, b in cuts]) for k in keys}
    input_ids = row.pop("input_ids")[None]
    position_ids = torch.cat([torch.arange(a, b) for _, a, b in cuts])[None].to(input_ids.device)
    return PackedMicroBatch(input_ids, position_ids, lens, indices, row,
                            torch.cat(sources)[None].to(input_ids.device), pieces)


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

    query [B, Hq, T, D], key/value [B, Hkv, T, D] -> ([B, T, Hq, D], None). The row's layout
    is read from ``position_ids`` (``row_layout``): a whole sequence is one causal call; a
    shared prefix is one, and its suffixes one more (each suffix seeing the prefix and itself,
    through a mask). Batches of several unpadded rows go to transformers' causal SDPA
    unchanged; a padding mask or a KV cache is refused (the trainer uses neither; load the model
    with ``sdpa`` for those)."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    if attention_mask is not None or query.shape[2] != key.shape[2]:
        raise ValueError(
            f"attn_implementation={SEGMENT_ATTENTION!r} takes packed rows or unpadded batches without a "
            "KV cache; got a padding mask or a cache. Load the model with attn_implementation='sdpa'"
        )
    pos = kwargs.get("position_ids")
    if pos is None or query.shape[0] != 1:
        return sdpa_attention_forward(module, query, key, value, None, dropout=dropout, scaling=scaling, **kwargs)
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    plan = _attention_plan(pos, query.shape[2], query.device)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    # split (not slicing): its backward is one concatenation, not a zero-filled [T] grad per piece
    out = []
    for (q, k, v), cluster in zip(zip(query.split(plan.sizes, 2), key.split(plan.sizes, 2),
                                      value.split(plan.sizes, 2), strict=True), plan.clusters, strict=True):
        n = cluster.prefix
        if not cluster.suffixes:
            out.append(sdpa(q, k, v, dropout_p=dropout, scale=scaling, is_causal=True))
            continue
        out.append(sdpa(q[:, :, :n], k[:, :, :n], v[:, :, :n], dropout_p=dropout, scale=scaling, is_causal=True))
        if cluster.mask is not None:  # short suffixes: one call over all of them, a mask keeps them apart
            out.append(sdpa(q[:, :, n:], k, v, attn_mask=cluster.mask, dropout_p=dropout, scale=scaling))
            continue
        kp, vp = k[:, :, :n], v[:, :, :n]  # long suffixes: one call each, over the prefix and itself
        sizes = [n, *cluster.suffixes]
        for (qs, ks, vs), mask in zip(zip(q.split(sizes, 2)[1:], k.split(sizes, 2)[1:], v.split(sizes, 2)[1:],
                                          strict=True), cluster.suffix_masks, strict=True):
            out.append(sdpa(qs, torch.cat([kp, ks], 2), torch.cat([vp, vs], 2), attn_mask=mask,
                            dropout_p=dropout, scale=scaling))
    return torch.cat(out, dim=2).transpose(1, 2).contiguous(), None


@dataclass
class _Cluster:
    """One cluster of a row for ``segment_sdpa_attention``: a whole sequence (no suffixes), or a
    shared prefix of ``prefix`` tokens and its suffixes, attended either in one call with
    ``mask`` ([S, prefix + S], S the suffixes' tokens) or one call each with ``suffix_masks``."""

    prefix: int
    suffixes: list[int]
    mask: torch.Tensor | None = None
    suffix_masks: list[torch.Tensor] = field(default_factory=list)


@dataclass
class _AttentionPlan:
    sizes: list[int]
    clusters: list[_Cluster]


_plan_cache: tuple[torch.Tensor, _AttentionPlan] | None = None
ONE_CALL_SCORES = 1 << 18
"""Below this many scores a cluster's suffixes share one attention call: fewer, larger calls
beat many small ones there (benchmarks/trainer.py measures the demo's groups both ways)."""


def _attention_plan(position_ids: torch.Tensor, t: int, device: torch.device) -> _AttentionPlan:
    """The plan of a row, computed once per forward (every layer sees the same position ids).

    A cluster's suffixes go in one masked call while its score matrix is small
    (``ONE_CALL_SCORES``) or at most twice the scores of one call per suffix (S x (prefix + S)
    against the sum of s x (prefix + s)); longer ones (multi-turn answers of hundreds of tokens)
    go one call each, so the cost stays linear in the group."""
    global _plan_cache
    pos = position_ids.reshape(-1)
    if _plan_cache is not None and _plan_cache[0].shape == pos.shape and torch.equal(_plan_cache[0], pos):
        return _plan_cache[1]
    layout = row_layout(pos) if pos.numel() == t else [(0, t, [])]
    sizes, clusters = [], []
    for _, n, suffixes in layout:
        sizes.append(n + sum(suffixes))
        if not suffixes:
            clusters.append(_Cluster(n, []))
            continue
        s = sum(suffixes)
        if s * (n + s) <= max(ONE_CALL_SCORES, 2 * sum(m * (n + m) for m in suffixes)):
            run = torch.repeat_interleave(torch.arange(len(suffixes), device=device),
                                          torch.tensor(suffixes, device=device))
            own = (run[:, None] == run[None, :]) & torch.ones(s, s, dtype=torch.bool, device=device).tril_()
            clusters.append(_Cluster(n, suffixes, torch.cat([torch.ones(s, n, dtype=torch.bool, device=device),
                                                             own], dim=1)))
        else:
            masks = [torch.cat([torch.ones(m, n, dtype=torch.bool, device=device),
                                torch.ones(m, m, dtype=torch.bool, device=device).tril_()], dim=1) for m in suffixes]
            clusters.append(_Cluster(n, suffixes, None, masks))
    plan = _AttentionPlan(sizes, clusters)
    _plan_cache = (pos.clone(), plan)
    return plan


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
    logits: torch.Tensor, input_ids: torch.Tensor, sources: torch.Tensor | None = None,
    *, with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-aligned log π(token_t | tokens_<t) from logits [B, T, V] and ids [B, T].

    Returns ([B, T] log-probabilities, [B, T] entropies or None), computed in float32. Token t
    is predicted by the logits at position t - 1 (column 0: no prediction, 0), or, with
    ``sources`` ([B, T] long, a packed row's ``PackedMicroBatch.sources``), at position
    ``sources[b, t]`` (-1: no prediction, 0). Entropies (of the distribution that predicted
    token t) are detached.
    """
    logp_all = logits.float().log_softmax(-1)
    if sources is None:
        sources = torch.arange(-1, input_ids.shape[1] - 1, device=input_ids.device).expand_as(input_ids)
    none = sources < 0
    src = sources.clamp(min=0)
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)[:, None]
    out = logp_all[rows, src, input_ids].masked_fill(none, 0.0)
    ent = None
    if with_entropy:
        with torch.no_grad():
            e = -(logp_all.exp() * logp_all).sum(-1)
            ent = e.gather(1, src).masked_fill(none, 0.0)
    return out, ent

