"""Group-relative advantages, reward shaping and batch normalization, with pinned numbers."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainer.advantages import grpo_advantages, normalize_advantages, shape_rewards


def test_grpo_pinned():
    # group a: rewards (1, 0, 0, 1): mean .5, population std .5 → ±1; group b: (2, 4): mean 3, std 1 → ∓1
    adv, diag = grpo_advantages([1, 0, 0, 1, 2, 4], ["a"] * 4 + ["b"] * 2)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1, -1, 1, -1, 1]), rtol=1e-5, atol=0)
    assert diag["num_groups"] == 2 and diag["num_episodes"] == 6
    assert diag["frac_groups_zero_std"] == 0.0
    assert diag["reward_mean"] == pytest.approx(8 / 6)


def test_without_std_division_is_reward_minus_group_mean():
    adv, _ = grpo_advantages([1, 0, 0, 1, 2, 4], ["a"] * 4 + ["b"] * 2, std_normalize=False)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, -0.5, 0.5, -1.0, 1.0]))


def test_zero_variance_and_singleton_groups_give_zero_and_are_counted():
    adv, diag = grpo_advantages([1, 1, 1, 0.3], ["a", "a", "a", "b"])
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]
    assert diag["frac_groups_zero_std"] == 1.0  # a: all equal; b: one sample has no variance either


def test_an_episode_split_into_several_trajectories_counts_once():
    # e1 was split into 3 trajectories (reward 1), e2 is one (reward 0): episodes (1, 0) → ±1.
    # Counting trajectories instead would give mean 0.75 and unequal advantages.
    adv, diag = grpo_advantages([1, 1, 1, 0], ["g"] * 4, ["e1", "e1", "e1", "e2"])
    torch.testing.assert_close(adv, torch.tensor([1.0, 1.0, 1.0, -1.0]), rtol=1e-5, atol=0)
    assert diag["num_episodes"] == 2
    # the same episode id in another group is another episode
    adv, _ = grpo_advantages([1, 0, 0, 1], ["g", "g", "h", "h"], ["e", "f", "e", "f"], std_normalize=False)
    assert adv.tolist() == [0.5, -0.5, -0.5, 0.5]


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="equal length"):
        grpo_advantages([1, 2], ["a"])


def test_batch_normalization_is_weighted_by_loss_tokens():
    # adv (1, −1) with 3 and 1 tokens: mean (3 − 1)/4 = .5, var (3·.25 + 1·2.25)/4 = .75
    out = normalize_advantages(torch.tensor([1.0, -1.0]), [3, 1])
    torch.testing.assert_close(out, torch.tensor([0.5 / 0.75**0.5, -1.5 / 0.75**0.5]), rtol=1e-5, atol=0)


def test_shape_rewards_pinned():
    r = shape_rewards([1.0, -3.0, 0.5], scale=2.0, bias=0.5, clip=2.5)
    assert r.tolist() == [2.5, -2.5, 2.0]  # (1.5·2 → 3 → clip 2.5), (−2.5·2 → −5 → −2.5), 1·2
    with pytest.raises(ValueError, match="clip"):
        shape_rewards([1.0], clip=0.0)
