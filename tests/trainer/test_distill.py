"""On-policy distillation's math on hand-made tensors (agentrl.trainer.distill): the per-token
reverse KL, the reward mode's advantages, the loss mode's k2 term and its gradient, and the
config's refusals. The teacher's server: tests/rollout/test_teacher.py; a run: tests/run/."""

from __future__ import annotations

import pytest
import torch

from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.trainer.batch import prepare_batch
from agentrl.trainer.distill import distill_advantages, distill_loss, reverse_kl
from agentrl.trainer.losses import policy_loss
from agentrl.trainer.trainer_config import TrainerConfig

MASK = torch.tensor([0.0, 1.0, 1.0])
STUDENT = torch.tensor([-1.0, -2.0, -0.5])  # log π_student of the sampled tokens (token 0: the prompt)
TEACHER = torch.tensor([0.0, -1.0, -1.5])


def test_reverse_kl_is_the_log_ratio_on_sampled_tokens_only():
    # k = student - teacher = [-1 - 0, -2 + 1, -0.5 + 1.5] = [-1, -1, 1], masked: [0, -1, 1]
    assert reverse_kl(STUDENT, TEACHER, MASK).tolist() == [0.0, -1.0, 1.0]


def test_reward_mode_adds_minus_coef_times_k_to_the_task_advantage():
    adv = torch.tensor([0.0, 0.5, 0.5])
    # A_t = 1·0.5 - 0.5·k_t: token 1 (teacher likes it more than the student: k=-1) 1.0, token 2 (k=+1) 0.0
    out, d = distill_advantages(adv, STUDENT, TEACHER, MASK, coef=0.5)
    assert out.tolist() == [0.0, 1.0, 0.0] and d == {"reverse_kl_sum": 0.0, "loss_tokens": 2.0}
    alone, _ = distill_advantages(adv, STUDENT, TEACHER, MASK, coef=0.5, task_coef=0.0)  # distillation alone
    assert alone.tolist() == [0.0, 0.5, -0.5]


def test_loss_mode_is_half_k_squared_and_its_gradient_is_k_times_the_score():
    logp = STUDENT.clone().requires_grad_(True)
    weights = torch.tensor([0.0, 0.5, 0.5])  # token-mean over 2 loss tokens
    loss, d = distill_loss(logp, TEACHER, MASK, weights, coef=2.0, total_loss_tokens=2)
    # 2 · (0.5·½·1 + 0.5·½·1) = 1.0; the diagnostic is the token mean of k: (-1 + 1) / 2 = 0
    assert loss.item() == pytest.approx(1.0) and d["distill/reverse_kl"].item() == 0.0
    loss.backward()
    # ∂/∂logp_t = coef · a_t · k_t = 2 · 0.5 · [0, -1, 1]
    assert logp.grad.tolist() == [0.0, -1.0, 1.0]
    # the same gradient as REINFORCE with the per-token advantage -coef·k_t (the reward mode without ratio)
    logp2 = STUDENT.clone().requires_grad_(True)
    pg, _ = policy_loss("reinforce", logp2, STUDENT, -2.0 * reverse_kl(STUDENT, TEACHER, MASK), MASK,
                        total_loss_tokens=2, token_weights=weights)
    pg.backward()
    assert torch.allclose(logp2.grad, logp.grad)


def test_teacher_equal_to_student_gives_nothing_to_learn():
    logp = STUDENT.clone().requires_grad_(True)
    loss, _ = distill_loss(logp, STUDENT, MASK, MASK / 2, coef=1.0, total_loss_tokens=2)
    loss.backward()
    assert loss.item() == 0.0 and logp.grad.abs().sum().item() == 0.0


def _traj(teacher):
    from agentrl.api import Trajectory

    return Trajectory([5, 6, 7], [0, 1, 1], [0.0, -2.0, -0.5], [-1, 0, 0], reward=1.0, group_id="g",
                      teacher_logprobs=teacher)


def test_prepare_batch_lays_out_the_teacher_and_the_reward_mode():
    cfg = load_config(TrainerConfig, None, ["distill.teacher.url=http://127.0.0.1:1", "distill.coef=0.5",
                                            "distill.task_coef=0"])
    batch = prepare_batch([_traj([0.0, -1.0, -1.5])], version=0, config=cfg)
    seq = batch.sequences[0]
    assert seq["teacher_logprobs"].tolist() == [0.0, -1.0, -1.5]
    assert seq["advantages"].tolist() == [0.0, 0.5, -0.5]  # a group of one: task advantage 0, the term alone
    assert batch.stats["distill_reverse_kl"] == 0.0  # (-1 + 1) / 2
    with pytest.raises(ConfigError, match="unscored by the teacher"):
        prepare_batch([_traj(None)], version=0, config=cfg)


def test_a_trajectory_refuses_a_teacher_row_that_does_not_fit():
    from agentrl.errors import TrajectoryError

    with pytest.raises(TrajectoryError, match="len\\(input_ids\\)=3"):
        _traj([0.0, -1.0])
    with pytest.raises(TrajectoryError, match="teacher_logprobs\\[0\\]"):
        _traj([-1.0, -1.0, -1.5])  # token 0 was not sampled: 0.0 there


@pytest.mark.parametrize("override, match", [
    ("distill.teacher.url=127.0.0.1:30000", "expected an http\\(s\\) URL"),
    ("distill.mode=rewrad", "did you mean 'reward'"),
    ("distill.coef=0", "distill.coef"),
    ("distill.teacher.engine=tgi", "distill.teacher.engine"),
])
def test_bad_distill_settings_name_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(TrainerConfig, None, [override])


def test_the_teacher_engines_are_the_clients():
    from agentrl.client.engines import AUTO, ENGINES
    from agentrl.trainer.distill import TEACHER_ENGINES

    assert set(TEACHER_ENGINES) == {AUTO, *ENGINES}


def test_distillation_alone_refuses_a_filter_on_the_task_reward():
    from pathlib import Path

    from agentrl.run.run_config import RunConfig, check_objective

    example = Path(__file__).resolve().parents[2] / "examples" / "distill_arith.yaml"
    cfg = load_config(RunConfig, example, ["rollout.filter_equal_rewards=true"])
    with pytest.raises(ConfigError, match="rollout.filter_equal_rewards"):
        check_objective(cfg)
