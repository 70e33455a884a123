"""The turn-level estimator (agentrl.trainer.turns: GiGPO's step groups), with pinned numbers."""

from __future__ import annotations

import pytest
import torch

from agentrl.api import NOT_SAMPLED, Trajectory
from agentrl.errors import TrajectoryError
from agentrl.trainer.advantages import compute_advantages
from agentrl.trainer.trainer_config import AdvantageConfig
from agentrl.trainer.turns import discounted_returns, per_turn_rewards, step_advantages, turn_advantages


def _traj(mask, reward, group="g", turn_rewards=None, turn_states=None):
    return Trajectory(list(range(len(mask))), mask, [-0.5 if m else 0.0 for m in mask],
                      [0 if m else NOT_SAMPLED for m in mask], reward=reward, group_id=group,
                      turn_rewards=turn_rewards, turn_states=turn_states)


def test_returns_per_turn():
    # turns of [0, 1, 1, 0, 1, 0, 1]: three; turn rewards 1, 0, 0.5 of an episode reward 2 → the last gets .5 + .5
    assert per_turn_rewards([0, 1, 1, 0, 1, 0, 1], 2.0, [1.0, 0.0, 0.5]) == [1.0, 0.0, 1.0]
    assert per_turn_rewards([0, 1, 1, 0, 1], 2.0, None) == [0.0, 2.0]
    assert discounted_returns([1.0, 0.0, 1.0], 0.5) == [1.25, 0.5, 1.0]


def test_step_groups_compare_turns_in_equal_states():
    returns = [[1.0, 3.0], [2.0, 0.0], [5.0]]
    states = [["s0", "a"], ["s0", "b"], ["s0"]]
    adv, diag = step_advantages(returns, states, ["g", "g", "h"])
    # g/s0 holds 1 and 2: mean 1.5, std .5 → ∓1; g/a, g/b and h/s0 are alone → 0
    assert adv == [[pytest.approx(-1.0, abs=1e-5), 0.0], [pytest.approx(1.0, abs=1e-5), 0.0], [0.0]]
    assert diag == {"step_groups": 1.0, "turns_grouped_frac": pytest.approx(2 / 5), "step_adv_abs_mean": pytest.approx(2 / 5, abs=1e-5)}
    none, diag = step_advantages(returns, [None, None, None], ["g", "g", "h"])
    assert none == [[0.0, 0.0], [0.0, 0.0], [0.0]] and diag["step_groups"] == 0


def test_without_state_keys_turn_is_group_norm():
    trajs = [_traj([0, 1, 0, 1], 1.0), _traj([0, 1, 1], 0.0)]
    cfg = AdvantageConfig(kind="turn")
    ep, _ = compute_advantages([1.0, 0.0], ["g", "g"], None, [2, 2], config=cfg)
    ref, _ = compute_advantages([1.0, 0.0], ["g", "g"], None, [2, 2], config=AdvantageConfig(kind="group_norm"))
    torch.testing.assert_close(ep, ref)
    per_token, _ = turn_advantages(trajs, ep.tolist(), [1.0, 0.0], cfg)
    torch.testing.assert_close(per_token[0], torch.tensor([0, 1.0, 0, 1.0]), atol=1e-5, rtol=0)
    torch.testing.assert_close(per_token[1], torch.tensor([0, -1.0, -1.0]), atol=1e-5, rtol=0)


def test_gigpo_pinned():
    # two samples of one task, two turns each; both start in state "start", then part ways
    a = _traj([0, 1, 0, 1], 1.0, turn_rewards=[0.0, 1.0], turn_states=["start", "left"])
    b = _traj([0, 1, 0, 1], 0.0, turn_rewards=[0.0, 0.0], turn_states=["start", "right"])
    cfg = AdvantageConfig(kind="turn", gamma=0.5, turn_weight=0.5)
    # episode advantages (group_norm): ±1. Returns: a (0 + .5·1, 1) = (.5, 1), b (0, 0).
    # step group "start": .5 vs 0 → ±1; "left", "right": alone → 0. A = A^E + .5·A^S
    out, diag = turn_advantages([a, b], [1.0, -1.0], [1.0, 0.0], cfg)
    torch.testing.assert_close(out[0], torch.tensor([0, 1.5, 0, 1.0]), atol=1e-5, rtol=0)
    torch.testing.assert_close(out[1], torch.tensor([0, -1.5, 0, -1.0]), atol=1e-5, rtol=0)
    assert diag["step_groups"] == 1.0 and diag["turns_grouped_frac"] == 0.5


def test_a_trajectory_refuses_turn_lists_of_the_wrong_length():
    with pytest.raises(TrajectoryError, match="turn_rewards must be 2 finite floats"):
        _traj([0, 1, 0, 1], 1.0, turn_rewards=[1.0])
    with pytest.raises(TrajectoryError, match="turn_states must be 1 str keys"):
        _traj([0, 1, 1], 1.0, turn_states=["a", "b"])
    t = _traj([0, 1, 0, 1], 1.0, turn_rewards=[0.5, 0.5], turn_states=["a", "b"])
    assert Trajectory.from_dict(t.to_dict()) == t


def test_prepare_batch_lays_the_turn_advantages_on_their_tokens():
    from agentrl.trainer.batch import prepare_batch
    from agentrl.trainer.trainer_config import TrainerConfig

    a = _traj([0, 1, 0, 1], 1.0, turn_rewards=[0.0, 1.0], turn_states=["start", "left"])
    b = _traj([0, 1, 0, 1], 0.0, turn_rewards=[0.0, 0.0], turn_states=["start", "right"])
    cfg = TrainerConfig(advantages=AdvantageConfig(kind="turn", gamma=0.5, turn_weight=0.5))
    batch = prepare_batch([a, b], version=0, config=cfg)
    # the numbers of test_gigpo_pinned, with group_norm's 1e-6 in the episode part
    torch.testing.assert_close(batch.sequences[0]["advantages"], torch.tensor([0, 1.5, 0, 1.0]), atol=1e-5, rtol=0)
    torch.testing.assert_close(batch.sequences[1]["advantages"], torch.tensor([0, -1.5, 0, -1.0]), atol=1e-5, rtol=0)
    assert batch.stats["adv/step_groups"] == 1.0 and batch.stats["adv/turns_grouped_frac"] == 0.5
