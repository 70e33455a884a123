"""GAE, the token rewards and the clipped value loss (agentrl.trainer.gae), with pinned numbers."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainer.gae import gae, token_rewards, value_loss

# one sequence: a prompt token, a turn of two tokens, an environment token, a turn of one token
MASK = torch.tensor([0, 1, 1, 0, 1.0])
VALUES = torch.tensor([9.0, 0.5, 0.4, 9.0, 0.3])  # 9s sit off the mask: never read


def test_the_reward_sits_on_the_last_loss_token_and_turn_rewards_on_their_turns():
    assert token_rewards(MASK, 1.0).tolist() == [0, 0, 0, 0, 1.0]
    # turns get 0.5 and 0.2; what is left of the episode's 1.0 (0.3) lands on the last token: the sum stays 1
    torch.testing.assert_close(token_rewards(MASK, 1.0, [0.5, 0.2]), torch.tensor([0, 0, 0.5, 0, 0.5]))
    # scaled turn rewards (the episode reward comes shaped already): 2·0.5, 2·0.2, and 2.0 - 1.4 = 0.6 left
    torch.testing.assert_close(token_rewards(MASK, 2.0, [0.5, 0.2], scale=2.0), torch.tensor([0, 0, 1.0, 0, 1.0]))
    assert token_rewards(torch.zeros(3), 1.0).tolist() == [0, 0, 0]  # no loss token: nowhere to put it
    with pytest.raises(ValueError, match="3 turn rewards for 2 turns"):
        token_rewards(MASK, 1.0, [0.1, 0.2, 0.3])


def test_lambda_one_gamma_one_is_the_return_minus_the_value():
    r = token_rewards(MASK, 1.0, [0.5, 0.2])  # [_, 0, .5, _, .5]: returns from each step 1.0, 1.0, 0.5
    adv, ret = gae(r, VALUES, MASK, gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, torch.tensor([0, 1.0 - 0.5, 1.0 - 0.4, 0, 0.5 - 0.3]))
    torch.testing.assert_close(ret, torch.tensor([0, 1.0, 1.0, 0, 0.5]))  # R = A + V: the return itself


def test_lambda_zero_is_td0():
    r = token_rewards(MASK, 1.0, [0.5, 0.2])
    adv, ret = gae(r, VALUES, MASK, gamma=0.9, lam=0.0)
    # δ_t = r_t + γ V_{t+1} - V_t, skipping the environment token; V after the last step is 0
    expected = [0, 0 + 0.9 * 0.4 - 0.5, 0.5 + 0.9 * 0.3 - 0.4, 0, 0.5 - 0.3]
    torch.testing.assert_close(adv, torch.tensor(expected))
    torch.testing.assert_close(ret, torch.tensor(expected) + VALUES * MASK)


def test_general_gae_pinned():
    r = token_rewards(MASK, 1.0)  # [_, 0, 0, _, 1]
    adv, _ = gae(r, VALUES, MASK, gamma=0.5, lam=0.5)
    # δ = (0 + .5·.4 - .5, 0 + .5·.3 - .4, 1 - .3) = (-.3, -.25, .7); A_t = δ_t + .25·A_{t+1}
    a3 = 0.7
    a2 = -0.25 + 0.25 * a3
    a1 = -0.3 + 0.25 * a2
    torch.testing.assert_close(adv, torch.tensor([0, a1, a2, 0, a3]))


def test_gae_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="equal 1-D shapes"):
        gae(torch.zeros(3), torch.zeros(4), torch.zeros(3))


def test_value_loss_clips_like_ppo():
    mask = torch.tensor([1.0, 1.0, 0.0])
    w = mask / 2  # a token mean over two loss tokens
    old = torch.tensor([0.0, 0.0, 0.0])
    ret = torch.tensor([1.0, 1.0, 5.0])
    v = torch.tensor([0.5, -0.5, 7.0], requires_grad=True)
    loss, st = value_loss(v, old, ret, mask, w, clip=0.2)
    # token 1: (.5-1)² = .25 vs clipped (.2-1)² = .64 → .64 (clipped); token 2: (-.5-1)² = 2.25 vs (-.2-1)² = 1.44 → 2.25
    assert float(loss.detach()) == pytest.approx(0.5 * (0.64 + 2.25) / 2)
    assert float(st["value_clip_frac"]) == pytest.approx(0.5)
    assert float(st["value_mean"]) == pytest.approx(0.0) and float(st["return_mean"]) == pytest.approx(1.0)
    loss.backward()
    # the clipped token's gradient is 0 (V is past the clip); the other's ½·2·(V - R)/2 = (-1.5)/2
    torch.testing.assert_close(v.grad, torch.tensor([0.0, -0.75, 0.0]))
    plain, st = value_loss(v.detach(), old, ret, mask, w, clip=None)
    assert float(plain) == pytest.approx(0.5 * (0.25 + 2.25) / 2) and float(st["value_clip_frac"]) == 0.0
