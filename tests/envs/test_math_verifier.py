"""The math verifier: answer extraction, each deliberate decision against plain math-verify's
leniency, and the pool (hard timeout kills the worker, recycling, non-blocking awaits)."""

from __future__ import annotations

import asyncio
import json
import math
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
from envs.math.numbers import compare_numbers, numbers_equal, split_percent
from envs.math.verifier import extract_answers


def score(response: str, gold) -> bool:
    """The verifier's decision, in-process (compare runs on this main thread): every answer
    the reply commits to (each box) must equal the gold."""
    answers = extract_answers(response)
    return bool(answers) and all(compare(answer, gold_of(gold)) for answer in answers)


def plain_math_verify(response: str, gold) -> bool:
    """What math-verify alone says of the reply's last box (what graded rewards before)."""
    from math_verify import parse, verify

    return verify(parse(f"${gold_of(gold)}$"), parse(f"${extract_final_answer(response)}$"))


# Each decision's pairs: (reply, gold, right?). Where plain math-verify disagrees, the test
# says so: those are the false positives (and a few false negatives) this verifier removes.
TINY_NUMBERS = [
    ("\\boxed{0.00000027557}", "\\frac{1}{11!}", False),  # 1/10! written out; 1/11! is 11 times smaller
    ("\\boxed{\\frac{1}{10!}}", "0.0000000250521", False),  # 1/11! written out
    ("\\boxed{0.000000000931322574615479}", "2^{-31}", False),  # 2^-30 written out
    ("\\boxed{2^{-30}}", "0.000000000465661287307739", False),  # 2^-31 written out
    ("\\boxed{0.000000001}", "0.000000002", False),
    ("\\boxed{10^{-20}}", "2 \\cdot 10^{-20}", False),
    ("\\boxed{1.5 \\times 10^{-7}}", "0.00000016", False),
    ("\\boxed{0.0000001\\%}", "0.0000002\\%", False),
    ("\\boxed{\\sqrt{2} \\cdot 10^{-20}}", "\\sqrt{3} \\cdot 10^{-20}", False),
    ("\\boxed{x = 0.0000001}", "0.0000002", False),  # math-verify reads a reply x = v as v
    ("\\boxed{x = 0.0000001}", "10^{-7}", True),
    ("\\boxed{\\frac{1}{3628800}}", "\\frac{1}{10!}", True),
    ("\\boxed{2.755731922398589e-07}", "\\frac{1}{10!}", True),  # Python's print(1/math.factorial(10))
    ("\\boxed{2^{-31}}", "0.0000000004656612873077393", True),
    ("\\boxed{0.000000001}", "10^{-9}", True),
    ("\\boxed{2 \\times 10^{-20}}", "2 \\cdot 10^{-20}", True),
]
EXACT_RATIONALS = [
    ("\\boxed{\\frac{333}{1000}}", "\\frac{1}{3}", False),
    ("\\boxed{0.333}", "\\frac{1}{3}", False),
    ("\\boxed{0.333333}", "\\frac{1}{3}", False),  # a decimal is the number it writes
    ("\\boxed{0.3333334}", "\\frac{1}{3}", False),
    ("\\boxed{1.0000001}", "1", False),
    ("\\boxed{\\frac{1000001}{1000000}}", "1", False),
    ("\\boxed{123456789012345678901234567890}", "123456789012345678901234567891", False),
    ("\\boxed{99999999999999999}", "100000000000000000", False),  # equal as floats
    ("\\boxed{1234567890123456789.5}", "1234567890123456789.4", False),
    ("\\boxed{\\frac{2}{6}}", "\\frac{1}{3}", True),
    ("\\boxed{0.5}", "\\frac{1}{2}", True),
    ("\\boxed{2.50}", "\\frac{5}{2}", True),
    ("\\boxed{-\\frac{3}{4}}", "-0.75", True),
    ("\\boxed{\\frac{-3}{4}}", "-\\frac{3}{4}", True),
    ("\\boxed{123456789012345678901234567890}", "123,456,789,012,345,678,901,234,567,890", True),
    ("\\boxed{1\\,000}", "1000", True),  # a thin space between thousands; math-verify reads 1*000 = 0
    ("\\boxed{1\\,000}", "0", False),
]
IRRATIONALS = [
    ("\\boxed{\\frac{\\sqrt{6}-\\sqrt{2}}{4}}", "\\sin(\\pi/12)", True),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", True),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", True),
    ("\\boxed{\\pi}", "3.141592653589793", True),  # a float's printout: relative tolerance
    ("\\boxed{1.7320508}", "\\sqrt{3}", False),  # give exact answers exactly
    ("\\boxed{3.1415927}", "\\pi", False),
]
FLOAT_GOLDS = [  # golds given as Python floats, and replies that print floats
    ("\\boxed{\\frac{1}{3}}", 1 / 3, True),
    ("\\boxed{0.3}", 0.1 + 0.2, True),
    ("\\boxed{\\pi}", math.pi, True),
    ("\\boxed{\\frac{1}{10!}}", 1 / math.factorial(10), True),
    ("\\boxed{\\frac{1}{11!}}", 1 / math.factorial(10), False),
    ("\\boxed{2^{-31}}", 2.0**-30, False),
    ("\\boxed{2^{-30}}", 2.0**-30, True),
    ("\\boxed{0.3333333333333333}", "\\frac{1}{3}", True),  # what print(1/3) shows
    ("\\boxed{0.33333333333333}", "\\frac{1}{3}", False),  # 14 digits: a decimal, not a float
]
SCIENTIFIC = [
    ("\\boxed{1.5e-7}", "0.00000015", True),  # math-verify reads the e as Euler's number
    ("\\boxed{9.313225746154785 \\times 10^{-10}}", "2^{-31}", False),  # 2^-30's printout
    ("\\boxed{9.313225746154785 \\times 10^{-10}}", "2^{-30}", True),
    ("\\boxed{1.5E+3}", "1500", True),
    ("\\boxed{1.5\\cdot 10^{-7}}", "1.5e-7", True),
    ("\\boxed{6.02 \\times 10^{23}}", "602000000000000000000000", True),
    ("\\boxed{6.02 \\times 10^{23}}", "6.03 \\times 10^{23}", False),
    ("\\boxed{1e-9}", "2e-9", False),
]
NEGATIVE_ZERO = [
    ("\\boxed{-0}", "0", True),
    ("\\boxed{-0.0}", "0", True),
    ("\\boxed{0}", "-0", True),
    ("\\boxed{-0.0001}", "0", False),
    ("\\boxed{0}", "0.0001", False),
]
UNITS = [
    ("\\boxed{5 cm}", "5", True),
    ("\\boxed{5 \\text{ cm}}", "5", True),
    ("\\boxed{5\\,\\mathrm{cm}}", "5", True),
    ("\\boxed{5 \\text{ cm}^2}", "5", True),
    ("\\boxed{5}", "5 \\text{ cm}", True),
    ("\\boxed{\\$18}", "18", True),
    ("\\boxed{30^\\circ}", "30", True),
    ("\\boxed{5 \\text{ m}}", "5 \\text{ cm}", True),  # units are neither converted nor compared
    ("\\boxed{6 \\text{ cm}}", "5", False),
    ("\\boxed{5.5 cm}", "5", False),
]
PERCENT = [
    ("\\boxed{25\\%}", "25", True),  # GSM8K writes "what percent" golds bare
    ("\\boxed{10}", "10\\%", True),
    ("\\boxed{0.1}", "10\\%", True),
    ("\\boxed{50\\%}", "0.5", True),
    ("\\boxed{12.5\\%}", "\\frac{1}{8}", True),
    ("\\boxed{0.1}", "10", False),  # a bare number and its hundredth never match
    ("\\boxed{1000}", "10\\%", False),
    ("\\boxed{5}", "50\\%", False),
    ("\\boxed{0.05}", "50\\%", False),
    ("\\boxed{50\\%}", "5", False),
]
HEDGES = [
    ("\\boxed{20}, so actually \\boxed{18}", "18", False),  # grading the last box paid this hedge
    ("\\boxed{19} or \\boxed{17+1}", "18", False),
    ("\\boxed{18}, or maybe \\boxed{20}", "18", False),
    ("\\boxed{18 \\text{ or } 20}", "18", False),  # a set of two answers in one box
    ("\\boxed{18, 20}", "18", False),
    ("\\boxed{18}. Again: \\boxed{18}", "18", True),  # repeating the answer is no hedge
    ("\\boxed{18}, that is \\boxed{18.0}", "18", True),
    ("\\boxed{\\frac{1}{2}} = \\boxed{0.5}", "0.5", True),
    ("\\boxed{} then \\boxed{18}", "18", True),  # an empty box commits to nothing
]
DECISIONS = {
    "tiny numbers: relative, never absolute": TINY_NUMBERS,
    "rationals: exact": EXACT_RATIONALS,
    "irrationals: 40 digits": IRRATIONALS,
    "float printouts: relative 1e-9": FLOAT_GOLDS,
    "scientific notation": SCIENTIFIC,
    "negative zero": NEGATIVE_ZERO,
    "units ignored": UNITS,
    "percent: a unit of 1/100": PERCENT,
    "every box must be right": HEDGES,
}
ALL_CASES = [(decision, *case) for decision, cases in DECISIONS.items() for case in cases]


def case_id(case) -> str:
    reply, gold, right = case
    return f"{reply.removeprefix(chr(92) + 'boxed')}~{gold}:{'right' if right else 'wrong'}"


def test_extraction_takes_the_last_box_else_a_final_answer_line():
    assert extract_final_answer("first \\boxed{1} then \\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"
    assert extract_final_answer("\\fbox{7}") == "7"
    assert extract_final_answer("\\boxed{} and nothing") is None
    assert extract_final_answer("Work...\nThe answer is 18 dollars.") == "18"
    assert extract_final_answer("Work...\n**Final Answer:** $\\frac{1}{2}$") == "\\frac{1}{2}"
    assert extract_final_answer("so\n#### 1,000") == "1,000"
    assert extract_final_answer("I think it is 5 or maybe 18") is None
    assert extract_answers("\\boxed{1} then \\boxed{2} and \\boxed{1}") == ["1", "2"]  # each once, in order
    assert extract_final_answer("\\boxed{1} then \\boxed{2} and \\boxed{1}") == "1"
    assert extract_answers("The answer is 4.\nThe answer is 5.") == ["5"]
    assert extract_answers("\\boxed{ } and nothing") == []


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


def test_number_literals_are_read_in_process_as_math_verify_reads_them():
    """``compare_numbers`` (the pool decides these without a worker) reads literals into the
    values math-verify's parser gives, and for plain integers reaches math-verify's verdicts."""
    from math_verify import parse, verify

    from envs.math.verifier import _as_number, _parse

    def through_math_verify(answer, gold):
        g = _as_number(_parse(split_percent(gold)[0], 3)[0], gold, answer=False)
        a = _as_number(_parse(split_percent(answer)[0], 3)[0], answer, answer=True)
        return numbers_equal(a, g)

    integers = [("18", "18"), ("18", "19"), ("025", "25"), ("1,000", "1000"), ("1000", "1,000"), ("-3", "3"),
                ("-0", "0"), ("+5", "5"), ("1,234,567", "1234567"), ("12,345", "12345"), ("100", "1,000"),
                ("007", "7"), ("-12", "-12"), ("99999999999", "99999999998")]
    for answer, gold in integers:
        assert compare_numbers(answer, gold) == verify(parse(f"${gold}$"), parse(f"${answer}$")), (answer, gold)
    others = [("1.5", "\\frac{3}{2}"), ("\\frac{3}{2}", "1.5"), ("\\dfrac{1}{3}", "0.333"), ("\\frac12", "0.5"),
              ("-\\frac{1}{3}", "\\frac{-1}{3}"), ("1.5 \\times 10^{-7}", "0.00000015"), ("10^{3}", "1000"),
              ("25\\%", "0.25"), ("5\\text{ cm}", "5"), ("\\$1,000.50", "1000.5"),
              ("0.3333333333333333", "\\frac{1}{3}"), ("0.0000001", "0.0000002"), (".5", "0.5"), ("7/2", "3.5")]
    for answer, gold in integers + others:
        quick = compare_numbers(answer, gold)
        assert quick is not None, (answer, gold)
        assert quick == through_math_verify(answer, gold), (answer, gold)
    # read differently on purpose: math-verify takes the e for Euler's number, \\, for a product
    assert compare_numbers("1.5e-7", "0.00000015") and not through_math_verify("1.5e-7", "0.00000015")
    assert compare_numbers("1\\,000", "1000") and not through_math_verify("1\\,000", "1000")
    for answer, gold in [("1,2", "12"), ("1, 2", "1, 2"), ("1,23", "123"), ("x", "1"), ("\\sqrt{2}", "1"),
                         ("2^{10}", "1024"), ("5 cm", "5"), ("1e99999", "1"), ("9" * 1200, "1")]:
        assert compare_numbers(answer, gold) is None, (answer, gold)  # left to math-verify in a worker


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


@pytest.mark.parametrize("reply, gold, right", [pytest.param(*case[1:], id=f"{case[0]}: {case_id(case[1:])}")
                                                for case in ALL_CASES])
def test_decision(reply, gold, right):
    assert score(reply, gold) == right


@pytest.mark.parametrize("reply, gold", [(reply, gold) for reply, gold, right in TINY_NUMBERS if not right])
def test_tiny_numbers_that_differ_are_equal_to_plain_math_verify(reply, gold):
    assert plain_math_verify(reply, gold)  # it rounds to 6 decimal places: absolute, not relative


async def test_the_pool_reaches_the_same_verdicts():
    """Through worker processes (and the pool's in-process shortcut for literals), every
    decision above holds, the hedges included."""
    with VerifierPool(VerifierConfig(workers=2)) as pool:
        verdicts = await asyncio.gather(*(pool.averify(reply, gold) for _, reply, gold, _ in ALL_CASES))
    got = {case_id(case[1:]): verdict for case, verdict in zip(ALL_CASES, verdicts, strict=True)}
    assert got == {case_id(case[1:]): case[3] for case in ALL_CASES}


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
        assert await pool.averify("\\boxed{3 + 0.5}", "3.5")  # warm the worker (an expression needs one)
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
        assert await pool.averify("\\boxed{4 + 0.5}", "4.5")  # a fresh worker took over
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
        assert [pool.verify(f"\\boxed{{{i} + 0.5}}", f"{i}.5") for i in range(3)] == [True] * 3
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
        assert pool.verify("\\boxed{3 + 0.5}", "3.5")  # the worker survived
    assert json.loads(json.dumps(pool.stats))["errors"] == 1
