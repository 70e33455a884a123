"""The policy losses on hand-made tensors: pinned numbers, special cases, split invariance."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.trainer.losses import decoupled_ppo_loss, policy_loss, reinforce_loss

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
