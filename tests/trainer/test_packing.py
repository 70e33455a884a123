"""Packing: the plan is balanced and complete, and packed rows compute exactly what padded rows do."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainer.packing import (
    Unit,
    balance_across_ranks,
    first_fit_decreasing,
    pack,
    pad,
    plan_micro_batches,
    plan_units,
    row_causal_mask,
    row_layout,
    shared_prefix_units,
    token_logprobs,
)


def test_first_fit_decreasing_pinned():
    # longest first: 7 -> bin0, 5 -> bin1, 4 -> bin1 (9), 3 -> bin0 (10), 2 -> bin2, 1 -> bin1 (10)
    assert first_fit_decreasing([3, 7, 5, 4, 2, 1], 10) == [[0, 1], [2, 3, 5], [4]]


def test_oversized_sequence_gets_its_own_bin_and_nothing_is_lost():
    bins = first_fit_decreasing([12, 3, 3], 10)
    assert bins == [[0], [1, 2]]
    assert sorted(i for b in bins for i in b) == [0, 1, 2]
    with pytest.raises(ValueError, match="budget"):
        first_fit_decreasing([1], 0)


def test_ranks_balanced_by_tokens():
    lengths = [100, 90, 10, 10, 10, 10, 10, 10, 10, 10, 5]
    ranks = balance_across_ranks(lengths, 2)
    loads = [sum(lengths[i] for i in r) for r in ranks]
    assert sorted(i for r in ranks for i in r) == list(range(len(lengths)))
    assert abs(loads[0] - loads[1]) <= 5, loads


def test_plan_gives_every_rank_the_same_number_of_micro_batches():
    lengths = [50, 3, 3, 3, 3, 3, 3, 3, 3]
    plan = plan_micro_batches(lengths, world_size=2, token_budget=8)
    assert len(plan[0]) == len(plan[1])
    flat = sorted(i for rank in plan for mb in rank for i in mb)
    assert flat == list(range(len(lengths)))
    for rank in plan:
        for mb in rank:
            assert len(mb) <= 1 or sum(lengths[i] for i in mb) <= 8
    assert [] in plan[0] or [] in plan[1]  # the lighter rank runs empty micro-batches


def test_row_causal_mask_pinned():
    # two whole sequences of 2 and 1 tokens: block-diagonal causal
    m = row_causal_mask(torch.tensor([[0, 1, 0]]))[0, 0].int().tolist()
    assert m == [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    # a prefix of 2 tokens, then two suffixes (positions 2, 3 and 2): each sees the prefix and itself
    m = row_causal_mask(torch.tensor([[0, 1, 2, 3, 2]]))[0, 0].int().tolist()
    assert m == [[1, 0, 0, 0, 0],
                 [1, 1, 0, 0, 0],
                 [1, 1, 1, 0, 0],
                 [1, 1, 1, 1, 0],
                 [1, 1, 0, 0, 1]]
    assert row_layout(torch.tensor([0, 1, 2, 3, 2, 0, 1])) == [(0, 2, [2, 1]), (5, 2, [])]
    assert row_layout(torch.tensor([0, 1, 2, 3, 2, 3, 4])) == [(0, 2, [2, 3])]
    with pytest.raises(ValueError, match="continues no prefix"):
        row_layout(torch.tensor([0, 1, 3, 4]))


def test_pack_lays_a_group_behind_one_copy_of_its_prefix():
    # three members of one group share [7, 8, 9]; the first loss token of member 2 is its 3rd,
    # so the shared prefix stops before it (every loss token stays in one member's own suffix)
    ids = [[7, 8, 9, 1, 2], [7, 8, 9, 3], [7, 8, 9, 4, 5, 6]]
    masks = [[0, 0, 0, 1, 1], [0, 0, 0, 1], [0, 0, 1, 1, 1, 1]]
    seqs = [{"input_ids": torch.tensor(i), "loss_mask": torch.tensor(m, dtype=torch.float32)}
            for i, m in zip(ids, masks, strict=True)]
    seqs.append({"input_ids": torch.tensor([7, 8, 9, 9]), "loss_mask": torch.tensor([0.0, 0, 0, 1])})
    units = shared_prefix_units(seqs, [0, 1, 2, 3], ["g", "g", "g", "h"], budget=100)
    assert units == [Unit((0, 1, 2), 2, 2 + 3 + 2 + 4), Unit((3,), 0, 4)]
    p = pack(seqs, units)
    assert p.input_ids[0].tolist() == [7, 8, 9, 1, 2, 9, 3, 9, 4, 5, 6, 7, 8, 9, 9]
    assert p.position_ids[0].tolist() == [0, 1, 2, 3, 4, 2, 3, 2, 3, 4, 5, 0, 1, 2, 3]
    # who predicts each token: the one before it; a suffix's first token, the prefix's last
    assert p.sources[0].tolist() == [-1, 0, 1, 2, 3, 1, 5, 1, 7, 8, 9, -1, 11, 12, 13]
    assert [t.tolist() for t in p.split(p.input_ids)] == ids + [[7, 8, 9, 9]]
    assert p.split(p.fields["loss_mask"])[2].tolist() == masks[2]
    assert torch.equal(p.join(p.split(p.fields["loss_mask"])), p.fields["loss_mask"])
    # a group too big for the budget is cut into several units, each with the prefix
    units = shared_prefix_units(seqs, [0, 1, 2], ["g"] * 3, budget=8)
    assert [u.members for u in units] == [(0, 1), (2,)]
    assert sorted(i for rank in plan_units(units, 2, 8) for mb in rank for u in mb for i in u.members) == [0, 1, 2]
    # no groups, or nothing in common: every sequence alone
    assert all(u.prefix == 0 for u in shared_prefix_units(seqs, [0, 1, 2], None, 100))


@pytest.mark.parametrize("attn", ["eager", "sdpa", "sdpa_segments"])
def test_packed_and_padded_logprobs_agree(attn):
    from transformers import AutoModelForCausalLM

    from agentrl.model.tinymodel import tiny_config
    from agentrl.trainer.packing import register_segment_attention

    register_segment_attention()

    torch.manual_seed(0)
    torch.set_num_threads(2)
    ref_cfg, cfg = tiny_config(hidden_size=64, num_layers=2), tiny_config(hidden_size=64, num_layers=2)
    ref_cfg._attn_implementation, cfg._attn_implementation = "eager", attn
    padded_model = AutoModelForCausalLM.from_config(ref_cfg).float().eval()  # the reference
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    model.load_state_dict(padded_model.state_dict())
    gen = torch.Generator().manual_seed(1)
    lens = [5, 17, 1, 9, 30]
    seqs = [{"input_ids": torch.randint(0, 256, (n,), generator=gen),
             "tag": torch.full((n,), float(i))} for i, n in enumerate(lens)]
    idx = [4, 0, 2, 3, 1]
    with torch.no_grad():
        p = pack(seqs, idx)
        assert p.position_ids[0, :6].tolist() == [0, 1, 2, 3, 4, 5]
        assert [t[0].item() for t in p.split(p.fields["tag"])] == [4, 0, 2, 3, 1]
        logits = model(input_ids=p.input_ids, position_ids=p.position_ids,
                       attention_mask=p.attention_mask(attn)).logits
        packed, ent = token_logprobs(logits, p.input_ids, p.sources, with_entropy=True)
        q = pad(seqs, idx, pad_id=256)
        logits = padded_model(input_ids=q.input_ids, attention_mask=q.attention_mask).logits
        padded, _ = token_logprobs(logits, q.input_ids)
    for a, b, n in zip(p.split(packed), q.split(padded), [lens[i] for i in idx], strict=True):
        assert a.shape == b.shape == (n,)
        assert a[0] == 0.0
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    # and each one equals the sequence run on its own
    with torch.no_grad():
        alone = model(input_ids=seqs[3]["input_ids"][None]).logits
        ref, _ = token_logprobs(alone, seqs[3]["input_ids"][None])
    torch.testing.assert_close(p.split(packed)[3], ref[0], rtol=0, atol=1e-5)
    assert ent is not None and (ent >= 0).all()


def test_segment_attention_refuses_a_padding_mask():
    from transformers import AutoModelForCausalLM

    from agentrl.model.tinymodel import tiny_config
    from agentrl.trainer.packing import register_segment_attention

    cfg = tiny_config(hidden_size=32, num_layers=1)
    cfg._attn_implementation = register_segment_attention()
    model = AutoModelForCausalLM.from_config(cfg).eval()
    ids = torch.tensor([[5, 6, 7], [8, 9, 256]])
    with torch.no_grad(), pytest.raises(ValueError, match="padding mask"):
        model(input_ids=ids, attention_mask=torch.tensor([[1, 1, 1], [1, 1, 0]]))
    with torch.no_grad():  # unpadded rows are fine
        assert torch.isfinite(model(input_ids=ids).logits).all()


@pytest.mark.parametrize("attn", ["eager", "sdpa", "sdpa_segments"])
@pytest.mark.parametrize(("suffix_len", "one_call"), [(1, True), (40, True), (40, False)])
def test_a_shared_prefix_gives_the_same_logprobs_and_gradients(attn, suffix_len, one_call, monkeypatch):
    """A group packed behind one copy of its prompt computes what the whole sequences do,
    gradients included (the prefix's gradient is the sum of what each member sends it) — with
    the suffixes in one masked attention call, or in one call each (sdpa_segments)."""
    from transformers import AutoModelForCausalLM

    from agentrl.model.tinymodel import tiny_config
    from agentrl.trainer import packing
    from agentrl.trainer.packing import register_segment_attention

    monkeypatch.setattr(packing, "_plan_cache", None)
    if not one_call:
        monkeypatch.setattr(packing, "ONE_CALL_SCORES", 0)

    register_segment_attention()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    cfg = tiny_config(hidden_size=64, num_layers=2)
    cfg._attn_implementation = attn
    model = AutoModelForCausalLM.from_config(cfg).float()
    gen = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 256, (11,), generator=gen)
    seqs = []
    for k in range(5):
        answer = torch.randint(0, 256, (suffix_len + k,), generator=gen)
        seqs.append({"input_ids": torch.cat([prompt, answer]),
                     "loss_mask": torch.cat([torch.zeros(11), torch.ones(len(answer))]),
                     "weight": torch.rand(11 + len(answer), generator=gen)})
    seqs.append({"input_ids": torch.randint(0, 256, (9,), generator=gen), "loss_mask": torch.ones(9),
                 "weight": torch.rand(9, generator=gen)})
    groups = ["g"] * 5 + ["other"]

    def loss_and_grads(items):
        model.zero_grad()
        p = pack(seqs, items)
        mask = p.attention_mask(attn)
        logits = model(input_ids=p.input_ids, position_ids=p.position_ids, attention_mask=mask).logits
        logp, _ = token_logprobs(logits, p.input_ids, p.sources)
        loss = (logp[0] * p.fields["loss_mask"] * p.fields["weight"]).sum()
        loss.backward()
        return p, logp[0].detach(), {n: w.grad.clone() for n, w in model.named_parameters()}

    units = shared_prefix_units(seqs, range(6), groups, budget=10_000)
    assert units[0].prefix == 11 and units[0].tokens == 11 + sum(len(s["input_ids"]) - 11 for s in seqs[:5])
    shared, logp_s, grads_s = loss_and_grads(units)
    whole, logp_w, grads_w = loss_and_grads(list(range(6)))
    assert shared.num_tokens < whole.num_tokens
    for a, b in zip(shared.split(logp_s), whole.split(logp_w), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-5)
    for name, g in grads_w.items():
        torch.testing.assert_close(grads_s[name], g, rtol=1e-4, atol=2e-5, msg=name)
    if attn == "sdpa_segments":
        cluster = packing._attention_plan(shared.position_ids, shared.num_tokens, torch.device("cpu")).clusters[0]
        assert cluster.suffixes and (cluster.mask is not None) == one_call
