"""The contracts reject inconsistent data at construction, with messages that say why."""

from __future__ import annotations

import math
import random
import subprocess
import sys

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
        (dict(reward=math.inf), "reward must be a finite float, got inf"),
        # wrong types and values: each named by field, index and what was expected
        (dict(loss_mask=True), "Trajectory.loss_mask must be a list, got bool"),
        (dict(loss_mask=[0, 0, True, 1]), "Trajectory.loss_mask[2] must be 0 or 1 (an int), got True (bool)"),
        (dict(loss_mask=[0, 0, 1.0, 1]), "Trajectory.loss_mask[2] must be 0 or 1 (an int), got 1.0 (float)"),
        (dict(versions=[NOT_SAMPLED, NOT_SAMPLED, 0.5, 4]),
         "Trajectory.versions[2] must be a policy version (an int), got 0.5 (float)"),
        (dict(versions=[NOT_SAMPLED, NOT_SAMPLED, True, 4]),
         "Trajectory.versions[2] must be a policy version (an int), got True (bool)"),
        (dict(input_ids=["5", "6", "7", "8"]), "Trajectory.input_ids[0] must be a token id (an int >= 0), got '5' (str)"),
        (dict(input_ids=[5, 6, 7.0, 8]), "Trajectory.input_ids[2] must be a token id (an int >= 0), got 7.0 (float)"),
        (dict(input_ids=[5, -6, 7, 8]), "Trajectory.input_ids[1] must be a token id (an int >= 0), got -6 (int)"),
        (dict(input_ids=(5, 6, 7, 8)), "Trajectory.input_ids must be a list, got tuple"),
        (dict(logprobs="0.0 0.0 -0.5 -1.25"), "Trajectory.logprobs must be a list, got str"),
        (dict(logprobs=[0.0, 0.0, None, -1.0]),
         "Trajectory.logprobs[2] must be a log-probability (a float), got None (NoneType)"),
        (dict(logprobs=[0.0, False, -0.5, -1.0]),
         "Trajectory.logprobs[1] must be a log-probability (a float), got False (bool)"),
        (dict(logprobs=[0.0, 0.0, -math.inf, -1.0]), "logprobs[2]=-inf"),
        (dict(logprobs=[0.0, math.nan, -0.5, -1.0]), "logprobs[1]=nan on a token with loss_mask 0"),
        (dict(reward=True), "Trajectory.reward must be a finite float, got True (bool)"),
        (dict(reward="1.0"), "Trajectory.reward must be a finite float, got '1.0' (str)"),
        (dict(num_turns=1.5), "Trajectory.num_turns must be an int >= 0, got 1.5 (float)"),
        (dict(num_turns=-1), "Trajectory.num_turns must be an int >= 0, got -1 (int)"),
        (dict(group_id=7), "Trajectory.group_id must be a str, got 7 (int)"),
        (dict(metrics=[1.0]), "Trajectory.metrics must be a dict of str to float, got [1.0] (list)"),
        (dict(metrics={"turns": "3"}), "Trajectory.metrics['turns'] must be a float under a str key, got '3' (str)"),
        (dict(status="bogus"), "Trajectory.status must be one of ['ok', 'env_error'"),
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


@pytest.mark.parametrize(
    "kw", [dict(max_new_tokens=-1), dict(temperature=-0.1), dict(top_p=0.0), dict(top_k=0), dict(top_k=-2)]
)
def test_bad_sampling_params_are_rejected(kw):
    with pytest.raises(ValueError):
        SamplingParams(**kw)


def test_valid_edge_cases_are_accepted():
    """Each constructs (no error) and keeps what it was given."""
    assert make_traj(logprobs=[0, 0, -0.5, 0.0]).logprobs == [0, 0, -0.5, 0.0]  # an int 0: a token with p=1
    assert make_traj(loss_mask=[0, 0, 0, 0], logprobs=[0.0] * 4, versions=[NOT_SAMPLED] * 4).loss_mask == [0] * 4
    t = make_traj(input_ids=[0, 1, 0, 1], versions=[NOT_SAMPLED, NOT_SAMPLED, 0, 1], reward=0)
    assert t.input_ids == [0, 1, 0, 1] and t.reward == 0
    assert make_traj(logprobs=[0.0, -0.0, -0.5, 5e-7]).logprobs[3] == 5e-7  # float32 log-softmax rounds a hair above 0
    assert len(Trajectory([], [], [], [])) == 0
    assert Completion([], [], [], "abort").tokens == []
    assert Completion([1, 2], [-0.1, 0], [0, 1], "stop", matched_stop="</s>").matched_stop == "</s>"


def test_completion_lengths_must_agree():
    Completion([1, 2], [-0.1, -0.2], [0, 1], "stop")
    with pytest.raises(TrajectoryError, match=r"Completion fields must all have len\(tokens\)=2, got \{'logprobs': 1\}"):
        Completion([1, 2], [-0.1], [0, 1], "stop")


@pytest.mark.parametrize(
    "change, fragment",
    [
        (dict(logprobs=[-0.1, math.nan]), "Completion.logprobs[1] must be a finite log-probability <= 0 (a float), "
                                          "got nan (float)"),
        (dict(logprobs=[math.inf, -0.2]), "Completion.logprobs[0] must be a finite log-probability <= 0 (a float), "
                                          "got inf (float)"),
        (dict(logprobs=[-0.1, -math.inf]), "Completion.logprobs[1] must be a finite log-probability"),
        (dict(logprobs=[-0.1, 0.25]), "Completion.logprobs[1] must be a finite log-probability <= 0 (a float), "
                                      "got 0.25 (float)"),
        (dict(logprobs=[-0.1, "-0.2"]), "Completion.logprobs[1] must be a finite log-probability <= 0 (a float), "
                                        "got '-0.2' (str)"),
        (dict(finish_reason="bogus"), "Completion.finish_reason must be one of ['stop', 'length', 'abort'], "
                                      "got 'bogus'"),
        (dict(finish_reason=None), "Completion.finish_reason must be one of"),
        (dict(tokens=["1", "2"]), "Completion.tokens[0] must be a token id (an int >= 0), got '1' (str)"),
        (dict(tokens=[1, True]), "Completion.tokens[1] must be a token id (an int >= 0), got True (bool)"),
        (dict(tokens=[1, -2]), "Completion.tokens[1] must be a token id (an int >= 0), got -2 (int)"),
        (dict(tokens=(1, 2)), "Completion.tokens must be a list, got tuple"),
        (dict(versions=[0, 0.5]), "Completion.versions[1] must be the policy version that sampled the token "
                                  "(an int >= 0), got 0.5 (float)"),
        (dict(versions=[0, -1]), "Completion.versions[1] must be the policy version"),
        (dict(versions=None), "Completion.versions must be a list, got NoneType"),
        (dict(matched_stop=[2]), "Completion.matched_stop must be a token id (int), a stop string or None, "
                                 "got [2] (list)"),
    ],
)
def test_bad_completion_is_rejected(change, fragment):
    fields = dict(tokens=[1, 2], logprobs=[-0.1, -0.2], versions=[0, 1], finish_reason="stop")
    fields.update(change)
    with pytest.raises(TrajectoryError) as e:
        Completion(**fields)
    assert fragment in str(e.value)


def test_the_fast_check_and_the_explanation_agree():
    """Construction decides validity with whole-list operations and explains a failure with a
    per-token scan: on random trajectories, each damaged in one place, both must agree."""
    from agentrl import api

    rng = random.Random(7)
    bad_values = [True, False, 0.5, -3, 2, "1", None, math.nan, math.inf, -math.inf, 1e-3, -1, 1.0, 0.0]
    fields = ("input_ids", "loss_mask", "logprobs", "versions")
    for _ in range(3000):
        n = rng.randrange(1, 12)
        mask = [rng.randrange(2) for _ in range(n)]
        cols = {
            "input_ids": [rng.randrange(50) for _ in range(n)],
            "loss_mask": mask,
            "logprobs": [-rng.choice([0.0, 0.5, 2.0]) if m else 0.0 for m in mask],
            "versions": [rng.randrange(3) if m else NOT_SAMPLED for m in mask],
        }
        Trajectory(**cols)  # a valid one passes
        name, i = rng.choice(fields), rng.randrange(n)
        cols[name][i] = rng.choice(bad_values)
        args = [cols[f] for f in fields]
        try:
            api._explain_trajectory(*args)
            explained = None
        except TrajectoryError as e:
            explained = str(e)
        assert api._trajectory_tokens_ok(*args) == (explained is None), (cols, explained)


def test_the_contracts_import_nothing_heavy():
    """``agentrl.api`` stays light for environment authors: no torch, httpx or numpy."""
    code = "import sys, agentrl.api; print(sorted({'torch', 'httpx', 'numpy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


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


def test_a_continued_generation_keeps_its_budget_and_draws_fresh_random_numbers():
    from agentrl.api import continuation_seed

    sp = SamplingParams(max_new_tokens=12, min_new_tokens=10, seed=7)
    rest = sp.continued(8)  # interrupted after 8 tokens: 4 left, and 2 of the minimum
    assert (rest.max_new_tokens, rest.min_new_tokens) == (4, 2)
    assert rest.seed == continuation_seed(7, 8) != 7  # the same seed would repeat the first 8 tokens' draws
    assert sp.continued(0).seed == 7 and sp.continued(0, budget=3).max_new_tokens == 3
    assert SamplingParams(max_new_tokens=5).continued(2).seed is None  # unseeded stays unseeded
    assert continuation_seed(7, 8) != continuation_seed(7, 9)
