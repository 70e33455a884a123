"""The Tinker API's losses against their definitions in the Tinker docs, on hand-made tensors.

Tokens: target log-probs t = log p_θ = [-1, -2, -0.5], sampler log-probs q = [-1.2, -1.5, -0.5],
advantages A = [1, -2, 0.5]; so r = exp(t - q) = [e^0.2, e^-0.5, 1] = [1.2214, 0.6065, 1].
"""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.trainer.tinker_losses import (
    cispo,
    cross_entropy,
    dro,
    gspo,
    importance_sampling,
    ppo,
    tinker_loss,
)

T = [-1.0, -2.0, -0.5]
Q = [-1.2, -1.5, -0.5]
A = [1.0, -2.0, 0.5]
R = [math.exp(0.2), math.exp(-0.5), 1.0]


def leaf() -> torch.Tensor:
    return torch.tensor(T, dtype=torch.float64, requires_grad=True)


def args() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(Q, dtype=torch.float64), torch.tensor(A, dtype=torch.float64)


def test_cross_entropy_is_the_weighted_sum_of_negative_logprobs():
    t = leaf()
    loss = cross_entropy(t, torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64))
    loss.backward()
    assert loss.item() == pytest.approx(1.0 + 2 * 0.5)  # -(1·-1 + 0·-2 + 2·-0.5)
    assert t.grad.tolist() == [-1.0, 0.0, -2.0]


def test_importance_sampling_is_minus_ratio_times_advantage():
    t = leaf()
    loss = importance_sampling(t, *args())
    loss.backward()
    assert loss.item() == pytest.approx(-(R[0] * 1 + R[1] * -2 + 1 * 0.5))  # = 0.0916
    # d/dt of -r·A is -r·A: the ratio's own gradient, unclipped
    assert t.grad.tolist() == pytest.approx([-R[0], 2 * R[1], -0.5])


def test_ppo_clips_the_ratio_on_the_side_that_would_gain():
    t = leaf()
    loss = ppo(t, *args(), clip_low_threshold=0.8, clip_high_threshold=1.2)
    loss.backward()
    # token 0: r=1.2214>1.2 with A>0: min(1.2214, 1.2)·1 = 1.2 (clipped, no gradient)
    # token 1: r=0.6065<0.8 with A<0: min(0.6065·-2, 0.8·-2) = -1.6 (clipped, no gradient)
    # token 2: r=1: 0.5
    assert loss.item() == pytest.approx(-(1.2 - 1.6 + 0.5))
    assert t.grad.tolist() == pytest.approx([0.0, 0.0, -0.5])


def test_ppo_keeps_the_gradient_where_the_unclipped_term_is_smaller():
    t = leaf()
    # wide thresholds: nothing is clipped, PPO is importance sampling
    loss = ppo(t, *args(), clip_low_threshold=0.1, clip_high_threshold=10.0)
    assert loss.item() == pytest.approx(importance_sampling(leaf(), *args()).item())


def test_cispo_weighs_every_tokens_gradient_by_the_clipped_ratio_held_constant():
    t = leaf()
    loss = cispo(t, *args(), clip_low_threshold=0.8, clip_high_threshold=1.2)
    loss.backward()
    clipped = [1.2, 0.8, 1.0]
    assert loss.item() == pytest.approx(-(1.2 * -1 * 1 + 0.8 * -2 * -2 + 1.0 * -0.5 * 0.5))  # = -1.75
    # the gradient of every token survives, scaled by sg(clip(r))·A (unlike PPO's token 0 and 1)
    assert t.grad.tolist() == pytest.approx([-c * a for c, a in zip(clipped, A, strict=True)])


def test_gspo_gives_every_token_the_sequences_ratio_and_its_own_gradient():
    q, a = args()
    mask = torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)  # the third token is not in the ratio
    s = math.exp((0.2 - 0.5) / 2)  # exp(mean log-ratio over the masked tokens) = 0.8607
    t = leaf()
    loss = gspo(t, q, a, mask)  # 0.8 <= s <= 1.2: nothing clipped, -Σ s·A
    loss.backward()
    assert loss.item() == pytest.approx(-s * (1 - 2 + 0.5))
    assert t.grad.tolist() == pytest.approx([-s * 1, -s * -2, -s * 0.5])  # d s_t / d t_t = s
    t = leaf()
    loss = gspo(t, q, a, mask, clip_low_threshold=0.9, clip_high_threshold=1.1)
    loss.backward()
    # s < 0.9: for A < 0 (token 1) the clipped 0.9·A is the smaller term, so it counts, without gradient
    assert loss.item() == pytest.approx(-(s * 1 + 0.9 * -2 + s * 0.5))
    assert t.grad.tolist() == pytest.approx([-s, 0.0, -s * 0.5])


def test_dro_is_reinforce_minus_half_beta_times_the_squared_log_ratio():
    t = leaf()
    loss = dro(t, *args(), beta=0.5)
    loss.backward()
    # log-ratios t - q = [0.2, -0.5, 0]; Σ t·A = -1 + 4 - 0.25 = 2.75; Σ (t-q)² = 0.04 + 0.25 = 0.29
    assert loss.item() == pytest.approx(-(2.75 - 0.25 * 0.29))
    # d/dt = -(A - β·(t - q)): the penalty pulls each token back toward the sampler's log-prob
    assert t.grad.tolist() == pytest.approx([-(1 - 0.5 * 0.2), -(-2 + 0.5 * 0.5), -0.5])
    assert tinker_loss("dro", leaf(), {"logprobs": args()[0], "advantages": args()[1]}, {"beta": 0.5}).item() == \
        pytest.approx(loss.item())


def test_tinker_loss_reads_the_clip_thresholds_from_the_config_and_refuses_unknown_names():
    q, a = args()
    inputs = {"logprobs": q, "advantages": a}
    assert tinker_loss("ppo", leaf(), inputs, {}).item() == pytest.approx(-(1.2 - 1.6 + 0.5))
    wide = {"clip_low_threshold": 0.1, "clip_high_threshold": 10.0}
    assert tinker_loss("cispo", leaf(), inputs, wide).item() == pytest.approx(
        -sum(r * t * adv for r, t, adv in zip(R, T, A, strict=True)))
    with pytest.raises(ValueError, match="loss_fn must be one of"):
        tinker_loss("stable_reinforce", leaf(), inputs, {})
