"""Group-relative advantages, reward shaping and batch normalization, with pinned numbers."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainer.advantages import (
    compute_advantages,
    grpo_advantages,
    normalize_advantages,
    overlong_penalty,
    reinforce_pp_advantages,
    rloo_advantages,
    shape_rewards,
)
from agentrl.trainer.trainer_config import AdvantageConfig


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


def test_rloo_pinned():
    # group a (1, 0, 0, 1): A_1 = 1 − (0 + 0 + 1)/3 = 2/3, A_2 = 0 − 2/3; group b (2, 4): ∓2; c alone: 0
    adv, diag = rloo_advantages([1, 0, 0, 1, 2, 4, 7], ["a"] * 4 + ["b"] * 2 + ["c"])
    torch.testing.assert_close(adv, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, -2.0, 2.0, 0.0]))
    assert diag["num_groups"] == 3


def test_rloo_is_group_mean_baseline_times_k_over_k_minus_one():
    # RLOO = k/(k−1) · (R − mean R): on groups of two exactly twice group_norm without std (R_i − R_j)
    rewards, groups = [0.3, 1.0, 5.0, -1.0], ["a", "a", "b", "b"]
    rloo, _ = rloo_advantages(rewards, groups)
    centred, _ = grpo_advantages(rewards, groups, std_normalize=False)
    torch.testing.assert_close(rloo, 2 * centred)
    torch.testing.assert_close(rloo, torch.tensor([-0.7, 0.7, 6.0, -6.0]))
    # a group of k = 5: the factor is 5/4
    r5 = [0.0, 1.0, 3.0, 0.5, 2.0]
    rloo, _ = rloo_advantages(r5, ["g"] * 5)
    centred, _ = grpo_advantages(r5, ["g"] * 5, std_normalize=False)
    torch.testing.assert_close(rloo, 5 / 4 * centred)


def test_rloo_counts_a_split_episode_once():
    adv, _ = rloo_advantages([1, 1, 0, 0.5], ["g"] * 4, ["e1", "e1", "e2", "e3"])
    # episodes (1, 0, 0.5): e1: 1 − 0.25 = 0.75 (both its trajectories), e2: 0 − 0.75, e3: 0.5 − 0.5
    torch.testing.assert_close(adv, torch.tensor([0.75, 0.75, -0.75, 0.0]))


def test_reinforce_pp_normalises_over_the_batch_not_the_group():
    # rewards (1, 0, 2) with (1, 1, 2) loss tokens: mean (1 + 0 + 4)/4 = 1.25, var (0.0625 + 1.5625 + 2·0.5625)/4
    adv, diag = reinforce_pp_advantages([1.0, 0.0, 2.0], ["a", "a", "b"], None, [1, 1, 2])
    std = (2.75 / 4) ** 0.5
    torch.testing.assert_close(adv, torch.tensor([-0.25 / std, -1.25 / std, 0.75 / std]), rtol=1e-5, atol=0)
    assert diag["num_groups"] == 2  # group b has one sample yet a nonzero advantage: no group baseline


def test_overlong_penalty_pinned():
    # L_max 10, L_cache 4: 0 up to 6 tokens, then (6 − |y|)/4, −1 past 10
    pen = overlong_penalty([3, 6, 7, 9, 10, 11, 50], max_tokens=10, buffer_tokens=4, penalty=0.5)
    torch.testing.assert_close(pen, 0.5 * torch.tensor([0.0, 0.0, -0.25, -0.75, -1.0, -1.0, -1.0]))
    hard = overlong_penalty([10, 11], max_tokens=10, buffer_tokens=0)
    assert hard.tolist() == [0.0, -1.0]


def test_compute_advantages_applies_the_penalty_before_the_estimator():
    cfg = AdvantageConfig(kind="rloo", overlong_max_tokens=10, overlong_buffer_tokens=4)
    # equal raw rewards; the 9-token answer loses 0.75 → rewards (1, 0.25): RLOO ±0.75
    adv, diag = compute_advantages([1.0, 1.0], ["g", "g"], None, [5, 9], config=cfg)
    torch.testing.assert_close(adv, torch.tensor([0.75, -0.75]))
    assert diag["overlong_frac"] == 0.5 and diag["overlong_penalty_mean"] == pytest.approx(-0.375)
    # the default is today's GRPO, then optional batch normalization
    adv, _ = compute_advantages([1, 0, 0, 1], ["a"] * 4, None, [1] * 4, config=AdvantageConfig())
    torch.testing.assert_close(adv, torch.tensor([1.0, -1, -1, 1]), rtol=1e-5, atol=0)
