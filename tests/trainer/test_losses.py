"""The policy losses on hand-made tensors: pinned numbers, special cases, split invariance."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.trainer.losses import (
    aggregation_weights,
    cispo_loss,
    decoupled_ppo_loss,
    gspo_loss,
    policy_loss,
    reinforce_loss,
)

# Four tokens, the last one not sampled (mask 0). Per token:
#   t0: w = e^0 = 1,  r = e^(−0.5+1) = 1.6487, A = +1  → clipped to 1.2       → l = −1.2
#   t1: w = e^1,      r = 1,                  A = −2  → l = −e·(−2) = +5.43656
#   t2: w = e^2 = 7.389 (> cap 5: masked),    r = e^−0.5 = 0.60653, A = 0.5
#       → without the cap: min(0.30327, 0.8·0.5) = 0.30327 → l = −7.389·0.30327 = −2.24084
LP = [-0.5, -1.0, -1.5, -0.3]
PROX = [-1.0, -1.0, -1.0, 0.0]
BEHAV = [-1.0, -2.0, -3.0, 0.0]
ADV = [1.0, -2.0, 0.5, 0.0]
MASK = [1.0, 1.0, 1.0, 0.0]


def _t(x, grad=False):
    return torch.tensor(x, dtype=torch.float64, requires_grad=grad)


def test_decoupled_ppo_pinned_with_cap():
    lp = _t(LP, grad=True)
    loss, st = decoupled_ppo_loss(lp, _t(PROX), _t(BEHAV), _t(ADV), _t(MASK), total_loss_tokens=3,
                                  eps_low=0.2, eps_high=0.2, behaviour_weight_cap=5.0)
    assert loss.item() == pytest.approx((-1.2 + 2 * math.e) / 3, rel=1e-6)  # 1.412188
    assert st["clip_frac"].item() == pytest.approx(1 / 3)  # t0 (t2 is clipped but masked by the cap)
    assert st["capped_frac"].item() == pytest.approx(1 / 3)
    assert st["behaviour_weight_max"].item() == pytest.approx(math.exp(2), rel=1e-6)
    # k3 KL(π_prox‖π_θ): q = prox − logp = (−0.5, 0, 0.5) → (0.10653, 0, 0.14872) / 3
    assert st["approx_kl"].item() == pytest.approx(0.0850842, rel=1e-5)
    assert not any(v.requires_grad for v in st.values())
    loss.backward()
    # only t1 has a gradient: t0 is clipped, t2 masked, t3 not sampled; dl/dlogp1 = −w·r·A/N = 2e/3
    torch.testing.assert_close(lp.grad, _t([0.0, 2 * math.e / 3, 0.0, 0.0]))


def test_decoupled_ppo_pinned_without_cap():
    lp = _t(LP, grad=True)
    loss, st = decoupled_ppo_loss(lp, _t(PROX), _t(BEHAV), _t(ADV), _t(MASK), total_loss_tokens=3,
                                  behaviour_weight_cap=None)
    assert loss.item() == pytest.approx(0.6652397, rel=1e-6)  # (−1.2 + 5.43656 − 2.24084) / 3
    assert st["clip_frac"].item() == pytest.approx(2 / 3)
    loss.backward()
    assert lp.grad[2].item() == pytest.approx(-math.exp(2) * math.exp(-0.5) * 0.5 / 3, rel=1e-6)


def test_denominator_is_the_global_token_count():
    args = (_t(LP), _t(PROX), _t(BEHAV), _t(ADV), _t(MASK))
    l3, _ = decoupled_ppo_loss(*args, total_loss_tokens=3)
    l30, _ = decoupled_ppo_loss(*args, total_loss_tokens=30)
    assert l30.item() == pytest.approx(l3.item() / 10)
    with pytest.raises(ValueError, match="total_loss_tokens"):
        decoupled_ppo_loss(*args, total_loss_tokens=0)


def test_ppo_is_decoupled_with_proximal_equal_to_behaviour():
    lp = _t(LP)
    ppo, st = policy_loss("ppo", lp, _t(BEHAV), _t(ADV), _t(MASK), total_loss_tokens=3)
    dec, _ = decoupled_ppo_loss(lp, _t(BEHAV), _t(BEHAV), _t(ADV), _t(MASK), total_loss_tokens=3,
                                behaviour_weight_cap=5.0)
    assert ppo.item() == pytest.approx(dec.item())
    assert st["behaviour_weight_mean"].item() == pytest.approx(1.0)  # w == 1 on every loss token
    # textbook PPO on t0: r = e^(−0.5+1), A=1 → clipped 1.2; t1: r = e^1 = 2.718, A=−2 → −5.43656
    # (the pessimistic unclipped side); t2: r = e^1.5 = 4.48, A=0.5 → clipped 1.2·0.5 = 0.6
    assert ppo.item() == pytest.approx((-1.2 + 2 * math.e - 0.6) / 3, rel=1e-6)


def test_decoupled_needs_proximal_and_kind_is_checked():
    with pytest.raises(ValueError, match="proximal_logprobs"):
        policy_loss("decoupled_ppo", _t(LP), _t(BEHAV), _t(ADV), _t(MASK), total_loss_tokens=3)
    with pytest.raises(ValueError, match="one of"):
        policy_loss("grpo", _t(LP), _t(BEHAV), _t(ADV), _t(MASK), total_loss_tokens=3)  # type: ignore[arg-type]


def test_reinforce_pinned():
    lp = _t(LP, grad=True)
    loss, _ = reinforce_loss(lp, _t(ADV), _t(MASK), total_loss_tokens=3)
    # −(1·−0.5 + −2·−1.0 + 0.5·−1.5)/3 = −(−0.5 + 2 − 0.75)/3 = −0.25
    assert loss.item() == pytest.approx(-0.25)
    loss.backward()
    torch.testing.assert_close(lp.grad, _t([-1 / 3, 2 / 3, -0.5 / 3, 0.0]))


def test_kl_penalty_k3_pinned():
    lp, ref = _t([-1.0, -2.0], grad=True), _t([-1.5, -2.0])
    adv, mask = _t([0.0, 0.0]), _t([1.0, 1.0])
    loss, st = decoupled_ppo_loss(lp, lp.detach(), lp.detach(), adv, mask, total_loss_tokens=2,
                                  ref_logprobs=ref, kl_coef=0.1)
    kl0 = math.exp(-0.5) + 0.5 - 1  # 0.1065307
    assert st["kl_ref"].item() == pytest.approx(kl0 / 2, rel=1e-6)
    assert loss.item() == pytest.approx(0.1 * kl0 / 2, rel=1e-6)
    loss.backward()  # d/dlogp (e^(ref−lp) − (ref−lp) − 1) = 1 − e^(ref−lp)
    assert lp.grad[0].item() == pytest.approx(0.1 * (1 - math.exp(-0.5)) / 2, rel=1e-6)
    assert lp.grad[1].item() == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("kind", ["decoupled_ppo", "ppo", "reinforce"])
def test_sum_over_micro_batches_and_ranks_equals_the_whole(kind):
    g = torch.Generator().manual_seed(0)
    n = 37
    lp = (-torch.rand(n, generator=g, dtype=torch.float64) * 3).requires_grad_()
    prox = lp.detach() + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    behav = prox + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    mask = (torch.rand(n, generator=g) > 0.3).double()
    total = mask.sum().item()
    kw = dict(total_loss_tokens=total, proximal_logprobs=prox, eps_low=0.2, eps_high=0.28)
    whole, st_whole = policy_loss(kind, lp, behav, adv, mask, **kw)
    (g_whole,) = torch.autograd.grad(whole, lp)
    # 2 "ranks" x 2 "micro-batches" of uneven sizes, each normalized by the global count
    parts = [(0, 5), (5, 20), (20, 21), (21, n)]
    pieces, stats = [], {}
    for a, b in parts:
        loss, st = policy_loss(kind, lp[a:b], behav[a:b], adv[a:b], mask[a:b],
                               **{**kw, "proximal_logprobs": prox[a:b]})
        pieces.append(loss)
        for k, v in st.items():
            stats[k] = stats.get(k, 0.0) + v.item()
    total_loss = torch.stack(pieces).sum()
    (g_split,) = torch.autograd.grad(total_loss, lp)
    assert total_loss.item() == pytest.approx(whole.item(), rel=1e-12)
    torch.testing.assert_close(g_split, g_whole)
    for k, v in st_whole.items():
        if not k.endswith("_max"):
            assert stats[k] == pytest.approx(v.item(), rel=1e-6), k  # stats are float32


# --------------------------------------------------------------------------- aggregation

SEG = torch.tensor([0, 0, 0, 1, 1, 1])
AGG_MASK = _t([1.0, 1.0, 0.0, 1.0, 1.0, 1.0])  # sequence 0: 2 loss tokens, sequence 1: 3; N = 5, S = 2


@pytest.mark.parametrize("aggregation, expected", [
    ("token-mean", [0.2, 0.2, 0, 0.2, 0.2, 0.2]),                       # m/N
    ("seq-mean-token-mean", [0.25, 0.25, 0, 1 / 6, 1 / 6, 1 / 6]),      # m/(n_i·S): 1/(2·2), 1/(3·2)
    ("seq-mean-token-sum", [0.5, 0.5, 0, 0.5, 0.5, 0.5]),               # m/S
])
def test_aggregation_weights_pinned(aggregation, expected):
    a = aggregation_weights(AGG_MASK, SEG, aggregation=aggregation, total_loss_tokens=5, total_sequences=2)
    torch.testing.assert_close(a, _t(expected))


def test_aggregations_agree_where_the_papers_say():
    # equal lengths: the mean of per-sequence token means is the token mean
    mask, seg = _t([1.0, 1.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1])
    tm = aggregation_weights(mask, seg, aggregation="token-mean", total_loss_tokens=4)
    smtm = aggregation_weights(mask, seg, aggregation="seq-mean-token-mean", total_loss_tokens=4, total_sequences=2)
    torch.testing.assert_close(tm, smtm)
    # Dr. GRPO's seq-mean-token-sum is the token mean scaled by N/S (here 5/2), whatever the lengths
    tm = aggregation_weights(AGG_MASK, SEG, aggregation="token-mean", total_loss_tokens=5)
    smts = aggregation_weights(AGG_MASK, SEG, aggregation="seq-mean-token-sum", total_loss_tokens=5, total_sequences=2)
    torch.testing.assert_close(smts, tm * 5 / 2)
    with pytest.raises(ValueError, match="segment_ids"):
        aggregation_weights(AGG_MASK, None, aggregation="seq-mean-token-sum", total_loss_tokens=5)


# --------------------------------------------------------------------------- GSPO

# Sequence 0 (2 loss tokens): log r = (0.2, 0.2) → s0 = e^0.2 = 1.22140, A = +1 → clipped at 1.2 → l = −1.2
# Sequence 1 (3 loss tokens + one masked): log r = (−0.1, 0.1, 0.3) → mean 0.1, s1 = e^0.1 = 1.10517,
#   A = −1: inside the clip range → l = −min(−s1, −s1) = +1.10517
G_LP = [-1.0, -2.0, -0.5, -0.5, -0.5, 9.0]
G_PROX = [-1.2, -2.2, -0.4, -0.6, -0.8, 0.0]
G_ADV = [1.0, 1.0, -1.0, -1.0, -1.0, 0.0]
G_MASK = [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
G_SEG = torch.tensor([0, 0, 1, 1, 1, 1])


def test_gspo_pinned_sequence_mean():
    lp = _t(G_LP, grad=True)
    a = aggregation_weights(_t(G_MASK), G_SEG, aggregation="seq-mean-token-mean", total_loss_tokens=5,
                            total_sequences=2)
    loss, st = gspo_loss(lp, _t(G_PROX), _t(G_PROX), _t(G_ADV), _t(G_MASK), G_SEG, total_loss_tokens=5,
                         eps_low=0.2, eps_high=0.2, token_weights=a)
    s1 = math.exp(0.1)
    assert loss.item() == pytest.approx((-1.2 + s1) / 2, rel=1e-9)  # the paper's −1/G Σ_i min(...) = −0.047414
    assert st["clip_frac"].item() == pytest.approx(2 / 5)  # sequence 0's two tokens
    assert st["ratio_mean"].item() == pytest.approx((2 * math.exp(0.2) + 3 * s1) / 5, rel=1e-6)
    loss.backward()
    # sequence 0 is clipped (no gradient); d/dlogp_t of s1 = s1/3 per token, times a = 1/2
    torch.testing.assert_close(lp.grad, _t([0.0, 0.0, s1 / 6, s1 / 6, s1 / 6, 0.0]))


def test_gspo_token_mean_weighs_sequences_by_length():
    loss, _ = gspo_loss(_t(G_LP), _t(G_PROX), _t(G_PROX), _t(G_ADV), _t(G_MASK), G_SEG, total_loss_tokens=5,
                        eps_low=0.2, eps_high=0.2)
    assert loss.item() == pytest.approx((2 * -1.2 + 3 * math.exp(0.1)) / 5, rel=1e-9)  # 0.183103


@pytest.mark.parametrize("cap", [5.0, None])
def test_gspo_with_one_token_sequences_is_token_level_decoupled_ppo(cap):
    seg = torch.arange(4)
    lp1, lp2 = _t(LP, grad=True), _t(LP, grad=True)
    g, _ = gspo_loss(lp1, _t(PROX), _t(BEHAV), _t(ADV), _t(MASK), seg, total_loss_tokens=3, eps_low=0.2,
                     eps_high=0.2, behaviour_weight_cap=cap)
    d, _ = decoupled_ppo_loss(lp2, _t(PROX), _t(BEHAV), _t(ADV), _t(MASK), total_loss_tokens=3,
                              behaviour_weight_cap=cap)
    assert g.item() == pytest.approx(d.item(), rel=1e-12)
    g.backward()
    d.backward()
    torch.testing.assert_close(lp1.grad, lp2.grad)


# --------------------------------------------------------------------------- CISPO

def test_cispo_pinned():
    # t0: r = e^0.5 = 1.6487 → weight clipped to 1.2, w = 1, A = 1: l = −1.2·(−0.5) = +0.6, dl/dlogp = −1.2
    # t1: r = 1, w = e (kept), A = −2: l = −e·(−2)·(−1) = −2e, dl/dlogp = 2e
    # t2: w = e^2 > cap 5: masked (as in decoupled PPO); t3 not sampled
    lp = _t(LP, grad=True)
    loss, st = cispo_loss(lp, _t(PROX), _t(BEHAV), _t(ADV), _t(MASK), total_loss_tokens=3)
    assert loss.item() == pytest.approx((0.6 - 2 * math.e) / 3, rel=1e-9)  # −1.612188
    assert st["clip_frac"].item() == pytest.approx(1 / 3)  # t0's weight was truncated, its gradient stays
    loss.backward()
    torch.testing.assert_close(lp.grad, _t([-1.2 / 3, 2 * math.e / 3, 0.0, 0.0]))


def test_at_ratio_one_cispo_ppo_and_reinforce_have_one_gradient():
    g = torch.Generator().manual_seed(1)
    lp = (-torch.rand(9, generator=g, dtype=torch.float64) * 2).requires_grad_()
    adv = torch.randn(9, generator=g, dtype=torch.float64)
    mask = _t([1, 1, 0, 1, 1, 1, 0, 1, 1])
    prox = lp.detach()  # θ = θ_prox = θ_behav: r = 1, w = 1
    grads = []
    for kind in ("cispo", "decoupled_ppo", "reinforce", "gspo"):
        loss, _ = policy_loss(kind, lp, prox, adv, mask, total_loss_tokens=7, proximal_logprobs=prox,
                              segment_ids=torch.arange(9))
        grads.append(torch.autograd.grad(loss, lp)[0])
    for other in grads[1:]:
        torch.testing.assert_close(other, grads[0])


@pytest.mark.parametrize("kind", ["gspo", "cispo", "decoupled_ppo"])
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_new_kinds_sum_over_micro_batches_to_the_whole(kind, aggregation):
    # 6 sequences of lengths 3..8 split into micro-batches at sequence boundaries (as packing does)
    g = torch.Generator().manual_seed(2)
    lens = [3, 8, 5, 4, 7, 6]
    seg = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)])
    n = len(seg)
    lp = (-torch.rand(n, generator=g, dtype=torch.float64) * 3).requires_grad_()
    prox = lp.detach() + 0.05 * torch.randn(n, generator=g, dtype=torch.float64)
    behav = prox + 0.2 * torch.randn(n, generator=g, dtype=torch.float64)
    adv = torch.randn(len(lens), generator=g, dtype=torch.float64)[seg]
    mask = (torch.rand(n, generator=g) > 0.2).double()
    total = mask.sum().item()

    def run(a, b, first):
        s = seg[a:b] - first
        w = aggregation_weights(mask[a:b], s, aggregation=aggregation, total_loss_tokens=total, total_sequences=6)
        return policy_loss(kind, lp[a:b], behav[a:b], adv[a:b], mask[a:b], total_loss_tokens=total,
                           proximal_logprobs=prox[a:b], segment_ids=s, token_weights=w)[0]

    whole = run(0, n, 0)
    (g_whole,) = torch.autograd.grad(whole, lp)
    cuts = [0, 3, 16, 20, n]  # sequences {0}, {1, 2}, {3}, {4, 5}
    firsts = [0, 1, 3, 4]
    split = torch.stack([run(a, b, f) for a, b, f in zip(cuts, cuts[1:], firsts, strict=False)]).sum()
    (g_split,) = torch.autograd.grad(split, lp)
    assert split.item() == pytest.approx(whole.item(), rel=1e-12)
    torch.testing.assert_close(g_split, g_whole)
