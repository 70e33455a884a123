"""Packing: the plan is balanced and complete, and packed rows compute exactly what padded rows do."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainer.packing import (
    balance_across_ranks,
    block_causal_mask,
    first_fit_decreasing,
    pack,
    pad,
    plan_micro_batches,
    sequence_starts,
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


def test_block_causal_mask_pinned():
    m = block_causal_mask([2, 1])[0, 0].int().tolist()
    assert m == [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    assert sequence_starts([2, 1, 3]).int().tolist() == [[1, 0, 1, 1, 0, 0]]


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
        packed, ent = token_logprobs(logits, p.input_ids, sequence_starts(p.seq_lens), with_entropy=True)
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
