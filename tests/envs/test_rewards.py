"""Composable rewards: each reusable term on hand-made inputs, and the weighted sum."""

from __future__ import annotations

import pytest

from agentrl.env.rewards import Reward, RewardInput, Rubric, boxed_format, discounted, fact, length_penalty
from agentrl.errors import EnvError


def test_fact_reads_bools_numbers_and_defaults():
    assert fact("correct")(RewardInput("", facts={"correct": True})) == 1.0
    assert fact("correct")(RewardInput("", facts={"correct": False})) == 0.0
    assert fact("pass_fraction")(RewardInput("", facts={"pass_fraction": 0.25})) == 0.25
    assert fact("missing", default=-1.0)(RewardInput("")) == -1.0


def test_discounted_by_attempts():
    score = discounted("correct", 0.5)
    assert score(RewardInput("", facts={"correct": True, "attempts": 1})) == 1.0
    assert score(RewardInput("", facts={"correct": True, "attempts": 3})) == 0.25
    assert score(RewardInput("", facts={"correct": False, "attempts": 2})) == 0.0
    with pytest.raises(EnvError, match="gamma"):
        discounted("correct", 0.0)


def test_boxed_format():
    assert boxed_format(RewardInput("so \\boxed{12}")) == 1.0
    assert boxed_format(RewardInput("so \\boxed {12}")) == 1.0
    assert boxed_format(RewardInput("the answer is 12")) == 0.0


def test_length_penalty_is_zero_within_budget_then_linear_then_capped():
    penalty = length_penalty(10)
    assert penalty(RewardInput("x" * 10)) == 0.0
    assert penalty(RewardInput("x" * 15)) == -0.5
    assert penalty(RewardInput("x" * 100)) == -1.0
    assert length_penalty(2, count=lambda s: len(s.split()))(RewardInput("a b c d")) == -1.0


def test_rubric_weighted_sum_and_named_terms():
    rubric = Rubric([Reward("correct", fact("correct")), Reward("format", boxed_format, 0.2),
                     Reward("length", length_penalty(5), 0.5)])
    total, terms = rubric.score(RewardInput("\\boxed{7}", facts={"correct": True}))
    assert terms == {"correct": 1.0, "format": 1.0, "length": -0.8}
    assert total == pytest.approx(1.0 + 0.2 - 0.4)
    assert "0.2*format" in repr(rubric)


async def test_async_terms_are_awaited_by_ascore_and_refused_by_score():
    async def slow_check(inp: RewardInput) -> float:
        return 0.5

    rubric = Rubric([Reward("slow", slow_check, 2.0)])
    assert await rubric.ascore(RewardInput("")) == (1.0, {"slow": 0.5})
    with pytest.raises(EnvError, match="is async"):
        rubric.score(RewardInput(""))


def test_bad_terms_are_clear_errors():
    with pytest.raises(EnvError, match="unique"):
        Rubric([Reward("a", boxed_format), Reward("a", boxed_format)])
    with pytest.raises(EnvError, match="finite"):
        Reward("a", boxed_format, float("nan"))
    with pytest.raises(EnvError, match="finite number"):
        Rubric([Reward("nan", lambda inp: float("nan"))]).score(RewardInput(""))
    with pytest.raises(EnvError, match="finite number"):
        Rubric([Reward("text", lambda inp: "1")]).score(RewardInput(""))
