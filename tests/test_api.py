"""The contracts reject inconsistent data at construction, with messages that say why."""

from __future__ import annotations

import math

import pytest

from agentrl.api import (
    NOT_SAMPLED,
    Completion,
    ExecRequest,
    ExecResult,
    ExecStatus,
    SamplingParams,
    Trajectory,
    TrajectoryStatus,
)
from agentrl.errors import TrajectoryError


def make_traj(**kw):
    base = dict(
        input_ids=[5, 6, 7, 8],
        loss_mask=[0, 0, 1, 1],
        logprobs=[0.0, 0.0, -0.5, -1.25],
        versions=[NOT_SAMPLED, NOT_SAMPLED, 3, 4],
        reward=1.0,
    )
    base.update(kw)
    return Trajectory(**base)


def test_valid_trajectory_reports_sampled_tokens_and_oldest_version():
    t = make_traj()
    assert len(t) == 4
    assert t.num_sampled == 2
    assert t.oldest_version == 3
    assert Trajectory.from_dict(t.to_dict()) == t


@pytest.mark.parametrize(
    "change, fragment",
    [
        (dict(logprobs=[0.0, 0.0, -0.5]), "len(input_ids)=4"),
        (dict(loss_mask=[0, 2, 1, 1]), "loss_mask[1] must be 0 or 1"),
        (dict(versions=[0, NOT_SAMPLED, 3, 4]), "versions[0]=0 but loss_mask[0]=0"),
        (dict(versions=[NOT_SAMPLED, NOT_SAMPLED, NOT_SAMPLED, 4]), "versions[2]=-1 but loss_mask[2]=1"),
        (dict(logprobs=[0.0, 0.0, 0.5, -1.0]), "logprobs[2]=0.5"),
        (dict(logprobs=[0.0, 0.0, math.nan, -1.0]), "logprobs[2]=nan"),
        (dict(logprobs=[-0.1, 0.0, -0.5, -1.0]), "logprobs[0]=-0.1 on a token with loss_mask 0"),
        (dict(reward=math.inf), "reward must be finite"),
    ],
)
def test_inconsistent_trajectory_is_rejected(change, fragment):
    with pytest.raises(TrajectoryError) as e:
        make_traj(**change)
    assert fragment in str(e.value)


def test_failed_trajectory_is_empty_and_keeps_its_reason():
    t = Trajectory.failed(TrajectoryStatus.SANDBOX_ERROR, group_id="g", error="docker died")
    assert (len(t), t.status, t.error, t.oldest_version) == (0, TrajectoryStatus.SANDBOX_ERROR, "docker died", -1)
    with pytest.raises(TrajectoryError):
        Trajectory.failed(TrajectoryStatus.OK)


def test_sampling_params_speak_sglang():
    sp = SamplingParams(max_new_tokens=7, temperature=0.0, stop=["\n"], seed=3)
    assert sp.to_sglang() == {
        "max_new_tokens": 7,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "ignore_eos": False,
        "stop": ["\n"],
        "sampling_seed": 3,
    }


@pytest.mark.parametrize(
    "kw", [dict(max_new_tokens=-1), dict(temperature=-0.1), dict(top_p=0.0), dict(top_k=0), dict(top_k=-2)]
)
def test_bad_sampling_params_are_rejected(kw):
    with pytest.raises(ValueError):
        SamplingParams(**kw)


def test_completion_lengths_must_agree():
    Completion([1, 2], [-0.1, -0.2], [0, 1], "stop")
    with pytest.raises(TrajectoryError):
        Completion([1, 2], [-0.1], [0, 1], "stop")


def test_exec_types_round_trip_through_json_dicts():
    req = ExecRequest(code="print(1)", stdin="x", files={"a.txt": "hi"}, fetch=["out.txt"])
    assert ExecRequest.from_dict(req.to_dict()) == req
    res = ExecResult(status="timeout", exit_code=None, signal=9, stdout="partial", wall_s=1.5)
    back = ExecResult.from_dict(res.to_dict())
    assert back == res and back.status is ExecStatus.TIMEOUT and not back.ok
    with pytest.raises(ValueError):
        ExecRequest(code="x", language="ruby")
    with pytest.raises(ValueError):
        ExecRequest(code="x", time_limit_s=0)
