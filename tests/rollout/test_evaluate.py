"""pass@k: the unbiased estimator's pinned values, intervals, resuming and curating."""

from __future__ import annotations

import json

import pytest

from agentrl.api import NOT_SAMPLED, Trajectory, TrajectoryStatus
from agentrl.rollout.evaluate import EvalReport, curate, episode_success, evaluate, pass_at_k


def test_pass_at_k_unbiased_estimator():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - (7 * 6) / (10 * 9))
    assert pass_at_k(10, 0, 5) == 0.0 and pass_at_k(10, 8, 3) == 1.0 and pass_at_k(4, 4, 4) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_report_interval_and_table():
    report = EvalReport(k=4, successes={0: 4, 1: 0, 2: 2, 3: 1})
    mean, ci = report.pass_at(1)
    assert mean == pytest.approx((1 + 0 + 0.5 + 0.25) / 4) and ci > 0
    summary = report.summary()
    assert set(summary) >= {"pass@1", "pass@2", "pass@4", "pass@1_ci95"} and summary["pass@4"] == 0.75


def test_the_figures_do_not_depend_on_the_order_problems_finish():
    """Issue 49: two deterministic runs gave eval/pass@1_ci95 0.022203203837749683 and ...69:
    the report summed in completion order. It sums in row order now: any finishing order gives
    the same floats, to the last digit."""
    import random

    def terms(i):
        return [Trajectory([1, 2], [0, 1], [0.0, -0.1], [NOT_SAMPLED, 0], metrics={"reward/x": 0.1 * (i % 7) + 1e-9 * i})]

    successes = {i: (i * 7919) % 5 for i in range(200)}
    summaries = []
    for seed in range(4):
        order = list(successes)
        random.Random(seed).shuffle(order)
        report = EvalReport(k=4)
        for i in order:
            report.successes[i] = successes[i]
            report.add_terms(i, terms(i), success=successes[i] > 0)
            if successes[i] == 0:
                report.errors[i] = f"env_error: row {i}"
        summaries.append((report.summary(), report.first_error))
    assert all(s == summaries[0] for s in summaries) and summaries[0][1] == "env_error: row 0"


def test_report_averages_named_reward_terms_over_episodes_and_over_successes():
    """tool_use_rate is successes/reward/used_tool_result: the term's mean over the successful
    episodes only (failed episodes and other metrics are not averaged)."""
    def episode(reward, used):
        return [Trajectory([1, 2], [0, 1], [0.0, -0.1], [NOT_SAMPLED, 0], reward=reward,
                           metrics={"reward/used_tool_result": used, "turns": 2.0})]

    report = EvalReport(k=1)
    for i, (reward, used) in enumerate(((1.0, 1.0), (1.0, 0.0), (1.0, 1.0), (0.0, 1.0), (0.0, 0.0))):
        report.add_terms(i, episode(reward, used), success=reward > 0)
    report.add_terms(5, [Trajectory.failed(TrajectoryStatus.ENV_ERROR)], success=False)
    summary = report.summary()
    assert summary["successes/reward/used_tool_result"] == pytest.approx(2 / 3)
    assert summary["episodes/reward/used_tool_result"] == pytest.approx(3 / 5)
    assert not any("turns" in key for key in summary)


def test_eval_figures_name_report_scores_and_a_misspelt_one_is_refused():
    """eval.figures reads EvalReport.summary() keys: every key the report writes is accepted, and
    one it never writes (which would read None at every evaluation) is refused naming the key."""
    from agentrl.config import load_config
    from agentrl.errors import ConfigError
    from agentrl.rollout.eval_config import EVAL_SCORE
    from agentrl.run.run_config import RunConfig

    report = EvalReport(k=4, successes={0: 1})
    report.add_terms(0, [Trajectory([1, 2], [0, 1], [0.0, -0.1], [NOT_SAMPLED, 0], reward=1.0,
                                 metrics={"reward/correct": 1.0})], success=True)
    assert all(EVAL_SCORE.fullmatch(key) for key in report.summary()), report.summary()
    cfg = load_config(RunConfig, None, ["model=m", "eval.figures={tool_use_rate: successes/reward/used_tool_result}"])
    assert cfg.eval.figures == {"tool_use_rate": "successes/reward/used_tool_result"}
    with pytest.raises(ConfigError, match="'eval.figures.rate': got 'success/reward/x'"):
        load_config(RunConfig, None, ["model=m", "eval.figures={rate: success/reward/x}"])


def test_an_eval_figure_may_be_the_ratio_of_two_scores():
    """ArithRetry's share of first-wrong episodes fixed is episodes/reward/fixed over
    episodes/reward/first_wrong; None when no episode was wrong at first, or a score is absent."""
    from agentrl.config import load_config
    from agentrl.errors import ConfigError
    from agentrl.rollout.eval_config import figure_value
    from agentrl.run.run_config import RunConfig

    share = "episodes/reward/fixed / episodes/reward/first_wrong"
    cfg = load_config(RunConfig, None, ["model=m", f"eval.figures={{fixed: {share}}}"])
    assert cfg.eval.figures == {"fixed": share}
    report = EvalReport(k=1)
    for i, (first_wrong, fixed) in enumerate(((1.0, 1.0), (1.0, 0.0), (1.0, 0.0), (0.0, 0.0))):
        report.add_terms(i, [Trajectory([1, 2], [0, 1], [0.0, -0.1], [NOT_SAMPLED, 0], reward=fixed,
                                     metrics={"reward/first_wrong": first_wrong, "reward/fixed": fixed})], fixed > 0)
    assert figure_value(share, report.summary()) == pytest.approx(1 / 3)
    assert figure_value("episodes/reward/fixed", report.summary()) == pytest.approx(1 / 4)
    assert figure_value(share, {"episodes/reward/fixed": 0.0, "episodes/reward/first_wrong": 0.0}) is None
    assert figure_value(share, {}) is None
    with pytest.raises(ConfigError, match="or two of them as SCORE / SCORE"):
        load_config(RunConfig, None, ["model=m", "eval.figures={x: pass@1 / problems / problems}"])


def test_success_reads_the_env_metric_else_the_reward():
    t = Trajectory([1, 2], [0, 1], [0.0, -0.1], [NOT_SAMPLED, 0], reward=0.3, metrics={"success": 0.0})
    assert not episode_success([t])
    assert episode_success([Trajectory([1, 2], [0, 1], [0.0, -0.1], [NOT_SAMPLED, 0], reward=0.3)])
    assert not episode_success([Trajectory.failed(TrajectoryStatus.ENV_ERROR)]) and not episode_success(None)


class Parity:
    calls = 0

    async def arun_episode(self, client, row):
        self.calls += 1
        return [Trajectory([1, 2], [0, 1], [0.0, -0.1], [NOT_SAMPLED, 0], reward=float(row["i"] % 2))]


async def test_evaluation_resumes_and_curates(tmp_path):
    rows = [{"i": i} for i in range(6)]
    wf = Parity()
    out = tmp_path / "eval.jsonl"
    report = await evaluate(wf, None, rows[:4], k=2, out=out)
    assert wf.calls == 8 and report.successes == {0: 0, 1: 2, 2: 0, 3: 2}
    report = await evaluate(wf, None, rows, k=2, out=out)  # the first four are in the file
    assert wf.calls == 12 and report.problems == 6 and report.pass_at(1)[0] == 0.5
    n = curate(rows, report, tmp_path / "hard.jsonl")
    kept = [json.loads(line)["i"] for line in (tmp_path / "hard.jsonl").read_text().splitlines()]
    assert n == 3 and kept == [0, 2, 4]


class Broken:
    async def arun_episode(self, client, row):
        raise ValueError("a bug in the workflow")


async def test_a_failing_episode_is_counted_not_fatal():
    report = await evaluate(Broken(), None, [{"i": 0}, {"i": 1}], k=2)
    assert report.successes == {0: 0, 1: 0} and report.failed_episodes == 4
