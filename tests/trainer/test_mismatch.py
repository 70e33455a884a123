"""The engine–trainer mismatch weights (TIS / MIS) on hand-made tensors, and how they enter the objectives."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.trainer.losses import decoupled_ppo_loss, reinforce_loss
from agentrl.trainer.mismatch import mismatch_gap, mismatch_weights
from agentrl.trainer.trainer_config import MismatchConfig

# log ρ = prox − behav = (0.5, −0.5, 2.0, ·): ρ = (1.64872, 0.60653, 7.38906); t3 is not a loss token
PROX = torch.tensor([-1.0, -1.0, -1.0, -1.0], dtype=torch.float64)
BEHAV = torch.tensor([-1.5, -0.5, -3.0, -9.0], dtype=torch.float64)
MASK = torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64)
SEG = torch.tensor([0, 0, 1, 1])
R0, R1, R2 = math.exp(0.5), math.exp(-0.5), math.exp(2.0)


def weights(mode, level="token", upper=2.0, lower=0.0):
    return mismatch_weights(PROX, BEHAV, MASK, SEG, config=MismatchConfig(mode=mode, level=level, upper=upper,
                                                                          lower=lower), total_loss_tokens=3)


def test_tis_token_truncates_at_the_upper_bound():
    w, st = weights("tis")
    torch.testing.assert_close(w, torch.tensor([R0, R1, 2.0, 0.0], dtype=torch.float64))
    assert st["mismatch/truncated_frac"].item() == pytest.approx(1 / 3)
    assert st["mismatch/masked_frac"].item() == 0.0
    assert st["mismatch/weight_mean"].item() == pytest.approx((R0 + R1 + 2.0) / 3, rel=1e-6)  # 1.418417
    assert st["mismatch/weight_sq_mean"].item() == pytest.approx((R0**2 + R1**2 + 4.0) / 3, rel=1e-6)
    assert st["mismatch/weight_max"].item() == pytest.approx(2.0)


def test_mis_token_masks_outside_the_bounds():
    w, st = weights("mis", lower=0.7)
    torch.testing.assert_close(w, torch.tensor([R0, 0.0, 0.0, 0.0], dtype=torch.float64))  # 0.607 < 0.7, 7.39 > 2
    assert st["mismatch/masked_frac"].item() == pytest.approx(2 / 3)


def test_sequence_level_uses_the_product_over_the_sequence():
    # sequence 0: ρ = e^0.5·e^−0.5 = 1 for both tokens; sequence 1: ρ = e^2 (t3 is masked, not counted)
    w, _ = weights("tis", level="sequence")
    torch.testing.assert_close(w, torch.tensor([1.0, 1.0, 2.0, 0.0], dtype=torch.float64))
    w, st = weights("mis", level="sequence")
    torch.testing.assert_close(w, torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64))
    assert st["mismatch/masked_frac"].item() == pytest.approx(1 / 3)


def test_decoupled_ppo_with_untruncated_tis_is_decoupled_ppo_without_cap():
    lp = torch.tensor([-0.5, -1.0, -1.5, -0.3], dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0, 0.5, 0.0], dtype=torch.float64)
    w, _ = weights("tis", upper=1e9)
    with_w, _ = decoupled_ppo_loss(lp, PROX, BEHAV, adv, MASK, total_loss_tokens=3, behaviour_weights=w)
    no_cap, _ = decoupled_ppo_loss(lp, PROX, BEHAV, adv, MASK, total_loss_tokens=3, behaviour_weight_cap=None)
    assert with_w.item() == pytest.approx(no_cap.item(), rel=1e-12)
    # and MIS with only an upper bound C is the behaviour_weight_cap rule with cap C
    w, _ = weights("mis", upper=5.0)
    with_w, st = decoupled_ppo_loss(lp, PROX, BEHAV, adv, MASK, total_loss_tokens=3, behaviour_weights=w)
    capped, st_cap = decoupled_ppo_loss(lp, PROX, BEHAV, adv, MASK, total_loss_tokens=3, behaviour_weight_cap=5.0)
    assert with_w.item() == pytest.approx(capped.item(), rel=1e-12)
    assert st["capped_frac"].item() == pytest.approx(st_cap["capped_frac"].item())


def test_tis_reinforce_weights_each_token():
    lp = torch.tensor([-0.5, -1.0, -1.5, -0.3], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([1.0, -2.0, 0.5, 0.0], dtype=torch.float64)
    w, _ = weights("tis")
    loss, _ = reinforce_loss(lp, adv, MASK, total_loss_tokens=3, behaviour_weights=w)
    loss.backward()  # d/dlogp of −w·A·logp / N
    torch.testing.assert_close(lp.grad, torch.tensor([-R0 / 3, 2 * R1 / 3, -0.5 * 2.0 / 3, 0.0], dtype=torch.float64))


def test_mode_off_computes_nothing():
    with pytest.raises(ValueError, match="tis or mis"):
        weights("off")


def test_the_gap_is_measured_apart_from_staleness():
    # |log ρ| = (0.5, 0.5, 2.0) on the loss tokens; t1 was sampled one version ago (stale), t0 and t2 fresh
    st = mismatch_gap(PROX, BEHAV, MASK, torch.tensor([0.0, 1.0, 0.0, 0.0]), total_loss_tokens=3)
    assert st["mismatch/log_ratio_abs_mean"].item() == pytest.approx(1.0)  # (0.5 + 0.5 + 2) / 3
    assert st["mismatch/fresh_frac"].item() == pytest.approx(2 / 3)
    assert st["mismatch/fresh_log_ratio_abs_sum"].item() == pytest.approx(2.5 / 3)  # the actor: 2.5/2 per fresh token
