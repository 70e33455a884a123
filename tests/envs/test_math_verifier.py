"""The math verifier: answer extraction, each deliberate decision against plain math-verify's
leniency, and the pool (hard timeout kills the worker, recycling, non-blocking awaits)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from agentrl.env.datasets import data_path, load_rows
from agentrl.errors import VerifierError
from envs.math import (
    VerifierConfig,
    VerifierPool,
    amath_reward_fn,
    compare,
    extract_final_answer,
    math_reward_fn,
)
from envs.math import normalize_gold as gold_of


def score(response: str, gold) -> bool:
    """The verifier's decision, in-process (compare runs on this main thread)."""
    answer = extract_final_answer(response)
    return answer is not None and compare(answer, gold_of(gold))


def test_extraction_takes_the_last_box_else_a_final_answer_line():
    assert extract_final_answer("first \\boxed{1} then \\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"
    assert extract_final_answer("\\fbox{7}") == "7"
    assert extract_final_answer("\\boxed{} and nothing") is None
    assert extract_final_answer("Work...\nThe answer is 18 dollars.") == "18"
    assert extract_final_answer("Work...\n**Final Answer:** $\\frac{1}{2}$") == "\\frac{1}{2}"
    assert extract_final_answer("so\n#### 1,000") == "1,000"
    assert extract_final_answer("I think it is 5 or maybe 18") is None


def test_gold_normalization():
    assert gold_of("She makes 9 * 2 = $18 every day.\n#### 18") == "18"
    assert gold_of(27.0) == "27" and gold_of(2.5) == "2.5" and gold_of(7) == "7"
    assert gold_of("$\\frac{1}{2}$") == "\\frac{1}{2}" and gold_of("\\boxed{3}") == "3"
    with pytest.raises(VerifierError):
        gold_of("####   ")


def test_equal_answers_in_different_forms():
    assert score("\\boxed{18}", "#### 18")
    assert score("\\boxed{18.0}", "18") and score("\\boxed{\\$18}", "18")
    assert score("\\boxed{1,000}", "1000") and score("\\boxed{2125}", "2,125")
    assert score("\\boxed{\\frac{1}{2}}", "0.5") and score("\\boxed{\\dfrac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}")
    assert score("\\boxed{25}", "025")  # AIME answers are written with leading zeros
    assert not score("\\boxed{19}", "18") and not score("\\boxed{-18}", "18")


def test_integer_fast_path_agrees_with_math_verify():
    from math_verify import parse, verify

    from envs.math.verifier import compare_integers

    pairs = [("18", "18"), ("18", "19"), ("025", "25"), ("1,000", "1000"), ("1000", "1,000"), ("-3", "3"),
             ("-0", "0"), ("+5", "5"), ("1,234,567", "1234567"), ("12,345", "12345"), ("100", "1,000"),
             ("007", "7"), ("-12", "-12"), ("99999999999", "99999999998")]
    for answer, gold in pairs:
        quick = compare_integers(answer, gold)
        assert quick is not None, (answer, gold)
        assert quick == verify(parse(f"${gold}$"), parse(f"${answer}$")), (answer, gold)
    for answer, gold in [("1,2", "12"), ("1.0", "1"), ("1, 2", "1, 2"), ("1,23", "123"), ("x", "1"), ("5", "5%")]:
        assert compare_integers(answer, gold) is None, (answer, gold)


def test_decision_no_anchor_no_answer():
    # plain math-verify finds the 18 in "5 or 18"; we grade only a committed answer
    from math_verify import parse, verify

    assert verify(parse("$18$"), parse("I think it is 5 or maybe 18"))
    assert not score("I think it is 5 or maybe 18", "18")


def test_decision_unbracketed_lists_are_ordered():
    from math_verify import parse, verify

    assert verify(parse("$1, 2$"), parse("$2, 1$"))  # plain math-verify: order ignored
    assert not score("\\boxed{2, 1}", "1, 2")
    assert score("\\boxed{1, 2}", "1, 2") and score("\\boxed{(1, 2)}", "1, 2")
    assert not score("\\boxed{1, 2, 3}", "1, 2")
    assert score("\\boxed{2, 1}", "\\{1, 2\\}")  # a gold written as a set accepts any order
    assert not score("\\boxed{(2, 1)}", "(1, 2)")


def test_decision_percent_sign_is_a_unit():
    assert score("\\boxed{25\\%}", "25")  # GSM8K writes "what percent" golds bare
    assert score("\\boxed{10}", "10\\%") and score("\\boxed{0.1}", "10\\%")
    assert not score("\\boxed{0.1}", "10")  # a bare number and its hundredth never match
    assert not score("\\boxed{1000}", "10\\%")


def test_decision_hedged_boxes_fail():
    assert not score("\\boxed{18 \\text{ or } 20}", "18")
    assert not score("\\boxed{18, 20}", "18")


def test_every_gold_answer_verifies_against_itself_in_the_pool():
    rows = load_rows(data_path("gsm8k_test.jsonl"), limit=100)
    rows += load_rows(data_path("aime24_test.jsonl")) + load_rows(data_path("amc23_test.jsonl"))
    with VerifierPool(VerifierConfig(workers=2)) as pool:
        futures = [pool.submit(gold_of(r["answer"]), gold_of(r["answer"])) for r in rows]
        assert all(f.result(timeout=120) for f in futures)
        assert pool.stats["verified"] == len(rows)


async def test_hard_timeout_kills_the_worker_and_the_loop_keeps_running():
    cfg = VerifierConfig(workers=1, hard_timeout_s=1.0, soft_timeout_s=30)
    with VerifierPool(cfg) as pool:
        assert await pool.averify("\\boxed{3.5}", "3.5")  # warm the worker
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        task = asyncio.create_task(ticker())
        start = time.monotonic()
        with pytest.raises(VerifierError, match="worker was killed"):
            await pool.averify("\\boxed{10^{10^{10}}}", "5")
        elapsed = time.monotonic() - start
        task.cancel()
        assert 1.0 <= elapsed < 8 and ticks >= 10  # the event loop ran while we waited
        assert pool.stats["timeouts"] == 1
        assert await pool.averify("\\boxed{4.5}", "4.5")  # a fresh worker took over
        # in a batch, the jobs queued behind a hanging one are re-sent to a fresh worker
        futures = [pool.submit("3", "3"), pool.submit("10^{10^{10}}", "5"), pool.submit("4", "4"),
                   pool.submit("5", "6")]
        assert futures[0].result(timeout=60) and futures[2].result(timeout=60)
        assert futures[3].result(timeout=60) is False
        with pytest.raises(VerifierError, match="worker was killed"):
            futures[1].result(timeout=60)
        assert pool.stats["timeouts"] == 2


def test_workers_are_recycled():
    with VerifierPool(VerifierConfig(workers=1, max_tasks_per_worker=2)) as pool:
        assert [pool.verify(f"\\boxed{{{i}.5}}", f"{i}.5") for i in range(3)] == [True] * 3
        assert pool.stats["restarts"] == 1


async def test_reward_functions_share_the_default_pool():
    assert math_reward_fn("The answer is \\boxed{42}.", "#### 42") == 1.0
    assert math_reward_fn("The answer is \\boxed{41}.", "#### 42") == 0.0
    assert math_reward_fn("no answer here", "42") == 0.0
    scores = await asyncio.gather(*(amath_reward_fn(f"\\boxed{{{i}}}", str(i % 3)) for i in range(6)))
    assert scores == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


def test_worker_protocol_errors_are_verifier_errors():
    with VerifierPool(VerifierConfig(workers=1)) as pool:
        with pytest.raises(VerifierError, match="cannot read the gold"):
            pool.submit("3", "\\text{}").result(timeout=60)
        assert pool.verify("\\boxed{3.5}", "3.5")  # the worker survived
    assert json.loads(json.dumps(pool.stats))["errors"] == 1
