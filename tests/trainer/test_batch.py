"""prepare_batch: what enters the loss, what is dropped and counted, and the warnings."""

from __future__ import annotations

import pytest
import torch

from agentrl.api import Trajectory, TrajectoryStatus
from agentrl.trainer.batch import prepare_batch
from agentrl.trainer.trainer_config import AdvantageConfig, TrainerConfig


def traj(reward, group, *, version=3, prompt=2, sampled=3, first_sampled=False):
    mask = [0] * prompt + [1] * sampled
    if first_sampled:
        mask[0] = 1
    return Trajectory(
        input_ids=list(range(1, prompt + sampled + 1)), loss_mask=mask,
        logprobs=[-0.5 if m else 0.0 for m in mask], versions=[version if m else -1 for m in mask],
        reward=reward, group_id=group,
    )


def test_failed_stale_and_empty_trajectories_are_counted_not_trained():
    trajs = [
        traj(1.0, "a"), traj(0.0, "a"),
        traj(1.0, "a", version=0),  # 4 − 0 > η = 2: stale
        Trajectory.failed(TrajectoryStatus.SANDBOX_ERROR, group_id="a"),
        traj(0.5, "b", sampled=0),  # nothing sampled
    ]
    b = prepare_batch(trajs, version=4, config=TrainerConfig(max_staleness=2))
    s = b.stats
    assert (s["num_trajectories"], s["num_stale"], s["num_sandbox_error"], s["num_no_loss_tokens"],
            s["num_kept"]) == (5, 1, 1, 1, 2)
    assert len(b) == 2 and b.num_loss_tokens == 6
    # advantages over the two kept ones (1, 0): ±1 on sampled tokens, 0 on the prompt
    torch.testing.assert_close(b.sequences[0]["advantages"], torch.tensor([0, 0, 1.0, 1, 1]), rtol=1e-5, atol=0)
    torch.testing.assert_close(b.sequences[1]["advantages"], torch.tensor([0, 0, -1.0, -1, -1]), rtol=1e-5, atol=0)
    assert b.sequences[0]["behaviour_logprobs"].tolist() == [0, 0, -0.5, -0.5, -0.5]
    assert s["staleness_mean"] == 1.0
    assert b.sequences[0]["staleness"].tolist() == [0, 0, 1, 1, 1]  # sampled at version 3, trainer at 4


def test_first_token_is_never_a_loss_token():
    b = prepare_batch([traj(1.0, "a", prompt=0, sampled=4), traj(0.0, "a")], version=3, config=TrainerConfig())
    assert b.sequences[0]["loss_mask"].tolist() == [0, 1, 1, 1]
    assert b.stats["first_token_unmasked"] == 1


def test_all_stale_warns_and_gives_an_empty_batch():
    with pytest.warns(RuntimeWarning, match="max_staleness"):
        b = prepare_batch([traj(1.0, "a", version=0)], version=9, config=TrainerConfig(max_staleness=1))
    assert len(b) == 0 and b.stats["num_stale"] == 1


def test_no_reward_variance_warns():
    with pytest.warns(RuntimeWarning, match="identical rewards"):
        b = prepare_batch([traj(1.0, "a"), traj(1.0, "a")], version=3, config=TrainerConfig())
    assert b.stats["adv/frac_groups_zero_std"] == 1.0
    assert all(float(s["advantages"].abs().sum()) == 0 for s in b.sequences)


def test_reward_shaping_and_batch_normalization_apply():
    cfg = TrainerConfig(advantages=AdvantageConfig(std_normalize=False, batch_normalize=True, reward_scale=2.0))
    b = prepare_batch([traj(1.0, "a"), traj(0.0, "a"), traj(3.0, "b", sampled=1), traj(1.0, "b", sampled=1)],
                      version=3, config=cfg)
    adv = [float(s["advantages"][-1]) for s in b.sequences]
    # before normalization: (1, −1, 2, −2) on (3, 3, 1, 1) tokens: mean 0, var (6 + 8)/8 = 1.75
    assert adv == pytest.approx([1 / 1.75**0.5, -1 / 1.75**0.5, 2 / 1.75**0.5, -2 / 1.75**0.5], rel=1e-5)
