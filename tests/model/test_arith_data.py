"""The arithmetic task family: seeded generation, the held-out split, answers, the calculator."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agentrl.model.arith_data import (
    CALCULATOR_TOOL,
    calculate,
    extract_answer,
    format_answer,
    generate_problems,
    is_heldout,
    make_problem,
    split_of,
)


def test_same_seed_same_problems_other_seed_differs():
    a = generate_problems(200, seed=3)
    assert a == generate_problems(200, seed=3)
    assert a != generate_problems(200, seed=4)


def test_problem_text_answer_and_expression_agree():
    for p in generate_problems(300, seed=0, num_terms=(3,), max_operand=99, split="all"):
        terms = [int(t) for t in p.expression.split("+")]
        assert len(terms) == 3 and all(0 <= t <= 99 for t in terms)
        assert p.answer == sum(terms)
        assert p.question == f"What is {p.expression}?"


def test_heldout_and_train_never_overlap():
    held = {p.expression for p in generate_problems(2000, seed=0)}
    train = {p.expression for p in generate_problems(20000, seed=0, split="train")}
    assert held and train
    assert not held & train
    assert all(is_heldout(e) for e in held) and not any(is_heldout(e) for e in train)


def test_eval_and_rl_pools_are_disjoint_and_make_up_the_heldout_share():
    evals = {p.expression for p in generate_problems(3000, seed=0)}  # the default: the evaluation pool
    rl = {p.expression for p in generate_problems(3000, seed=0, split="rl")}
    held = {p.expression for p in generate_problems(3000, seed=0, split="heldout")}
    train = {p.expression for p in generate_problems(3000, seed=0, split="train")}
    assert len(evals) > 2900 and len(rl) > 2900
    assert not evals & rl and not (evals | rl) & train
    assert all(split_of(e) == "eval" for e in evals) and all(split_of(e) == "rl" for e in rl)
    assert {split_of(e) for e in held} == {"eval", "rl"} and all(is_heldout(e) for e in evals | rl)


def test_pools_are_a_fixed_hash_of_the_expression():
    # pinned: a change here would silently move problems between evaluation, RL and training data
    pinned = {"90+85+80": "rl", "37+23+24": "eval", "10+89+69": "eval", "87+33+71": "rl",
              "17+72+97": "train", "1+2": "train"}
    assert {e: split_of(e) for e in pinned} == pinned


def test_eval_pool_is_about_half_of_the_heldout_share():
    held = generate_problems(4000, seed=2, split="heldout")
    share = sum(split_of(p.expression) == "eval" for p in held) / len(held)
    assert 0.45 < share < 0.55


def test_an_empty_pool_is_an_error_not_a_hang():
    with pytest.raises(ValueError, match="widen the space"):
        generate_problems(1, seed=0, num_terms=(1,), max_operand=3, split="rl")


def test_heldout_share_is_about_ten_percent():
    every = generate_problems(20000, seed=1, num_terms=(3,), split="all")
    share = sum(is_heldout(p.expression) for p in every) / len(every)
    assert 0.08 < share < 0.12


def test_other_operators_are_computed_with_precedence():
    problems = generate_problems(200, seed=2, num_terms=(3,), ops=("+", "-", "*"), split="all")
    assert {op for p in problems for op in "+-*" if op in p.expression} == {"+", "-", "*"}
    for p in problems:
        assert p.answer == eval(p.expression)  # the expressions are plain integer Python
    assert any(p.answer < 0 for p in problems)


@pytest.mark.parametrize(
    "kwargs",
    [dict(n=-1), dict(num_terms=()), dict(num_terms=(0,)), dict(ops=("/",)), dict(split="test"),
     dict(max_operand=-5)],
)
def test_bad_arguments_are_refused(kwargs):
    args = dict(n=3, seed=0) | kwargs
    with pytest.raises(ValueError):
        generate_problems(args.pop("n"), args.pop("seed"), **args)


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"\boxed{186}", 186),
        (r"The answer is \boxed{-7}.", -7),
        (r"\boxed{ 1,024 }", 1024),
        (r"\boxed{3} no wait \boxed{4}", 4),
        (r"\boxed{4} then \boxed{x}", None),  # only the last box counts
        (r"\boxed{1.5}", None),
        (r"\boxed{}", None),
        ("186", None),
        (r"\boxed{12", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_format_answer_round_trips():
    for n in (0, 7, -13, 186, 10**12):
        assert extract_answer(format_answer(n)) == n
    assert format_answer(186) == r"\boxed{186}"


@pytest.mark.parametrize(
    "expr, result",
    [("17+72+97", "186"), ("2*(3+4)", "14"), ("-5+2", "-3"), (" 10 - 20 ", "-10"), ("2+3*4", "14")],
)
def test_calculator_evaluates(expr, result):
    assert calculate(expr) == result


@pytest.mark.parametrize(
    "expr",
    ["__import__('os')", "2**8", "7/2", "1.5+1", "abc", "1+", "9" * 25 + "*" + "9" * 25, "1+" * 150 + "1"],
)
def test_calculator_refuses_everything_else(expr):
    with pytest.raises(ValueError):
        calculate(expr)


def test_calculator_schema_names_one_string_argument():
    fn = CALCULATOR_TOOL["function"]
    assert fn["name"] == "calculator"
    assert fn["parameters"]["required"] == ["expression"]
    assert fn["parameters"]["properties"]["expression"]["type"] == "string"


def test_make_problem_and_row():
    p = make_problem("1+2")
    assert p.to_row() == {"question": "What is 1+2?", "answer": "3", "expression": "1+2"}


def test_importable_without_torch():
    code = "import sys, agentrl.model.arith_data; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
