"""Arith, Math, MathRetry and ToolUse episodes played with hand-written replies."""

from __future__ import annotations

import gymnasium
import pytest

import envs  # noqa: F401
from agentrl.errors import EnvError
from agentrl.model.arith_data import CALCULATOR_TOOL, format_answer, generate_problems
from agentrl.model.tokenizer import tool_call_text
from envs.tool_use import KINDS, make_task

GSM8K_ROW = {"question": "Janet has 16 eggs, eats 3 and bakes with 4, and sells the rest at $2. How much?",
             "answer": "Janet sells 16 - 3 - 4 = 9 eggs.\nShe makes 9 * 2 = $18.\n#### 18"}


def test_arith_rewards_the_boxed_answer_and_logs_exact_format():
    env = gymnasium.make("agentrl/Arith-v0", format_weight=0.5)
    problem = generate_problems(1, seed=5)[0]
    obs, _ = env.reset(options={"task": problem.to_row()})
    assert obs == [{"role": "user", "content": problem.question}]  # as the tiny model was trained
    *_, info = env.step(format_answer(problem.answer))
    assert info["rewards"] == {"correct": 1.0, "format": 1.0} and info["answer"] == problem.answer
    env.reset(options={"task": problem.to_row()})
    _, reward, *_, info = env.step(f"It is {format_answer(problem.answer)}.")
    assert info["rewards"] == {"correct": 1.0, "format": 0.0} and reward == 1.0
    env.reset(options={"task": problem.to_row()})
    assert env.step(format_answer(problem.answer + 1))[1] == 0.5
    with pytest.raises(EnvError, match="integer"):
        env.reset(options={"task": {"question": "q", "answer": "x"}})
    env.close()


def test_arith_rl_rows_and_sampled_tasks_never_hold_an_evaluation_problem():
    from agentrl.model.arith_data import split_of
    from envs.arith import eval_rows, training_rows

    evaluation = {r["question"] for r in eval_rows(seed=3)}
    assert evaluation == {r["question"] for r in eval_rows(seed=4)} and len(evaluation) > 980  # ~1% repeat
    assert evaluation == {p.question for p in generate_problems(1000, seed=0)}  # what build_info measures
    rl = training_rows(seed=3, n=5000)
    assert not evaluation & {r["question"] for r in rl}
    assert {split_of(r["expression"]) for r in rl} == {"rl"}
    env = gymnasium.make("agentrl/Arith-v0")
    sampled = [env.reset(seed=s)[0][0]["content"] for s in range(200)]
    assert not evaluation & set(sampled)
    assert all(split_of(q.removeprefix("What is ").removesuffix("?")) == "rl" for q in sampled)
    env.close()


def test_arith_seeded_problems_follow_the_generator_arguments():
    env = gymnasium.make("agentrl/Arith-v0", num_terms=[2], max_operand=9, ops=["*"])
    obs, _ = env.reset(seed=3)
    expression = obs[0]["content"].removeprefix("What is ").removesuffix("?")
    a, b = expression.split("*")
    assert 0 <= int(a) <= 9 and 0 <= int(b) <= 9
    env.close()
    with pytest.raises(EnvError, match="ops"):
        gymnasium.make("agentrl/Arith-v0", ops=["/"])


def test_math_grades_gsm8k_and_latex_answers():
    env = gymnasium.make("agentrl/Math-v1")
    obs, _ = env.reset(options={"task": GSM8K_ROW})
    assert [m["role"] for m in obs] == ["system", "user"] and "\\boxed{}" in obs[0]["content"]
    _, reward, terminated, _, info = env.step("16-3-4=9 eggs, 9*2=18, so \\boxed{18}")
    assert (reward, terminated, info["correct"], info["answer"]) == (1.0, True, True, "18")
    env.reset(options={"task": {"question": "Half of one?", "answer": "\\frac{1}{2}"}})
    assert env.step("The final answer is 0.5")[1] == 1.0
    env.reset(options={"task": GSM8K_ROW})
    assert env.step("\\boxed{17}")[1] == 0.0
    env.close()
    env = gymnasium.make("agentrl/Math-v1", length_weight=0.5, length_budget=10)
    env.reset(options={"task": GSM8K_ROW})
    _, reward, *_, info = env.step("so the answer is \\boxed{18}")  # 27 characters: 17 over
    assert info["rewards"] == {"correct": 1.0, "format": 1.0, "length": -1.0} and reward == 0.5
    with pytest.raises(EnvError, match="'question'"):
        env.reset(options={"task": {"problem": "x", "answer": "1"}})
    env.close()


def test_math_retry_feedback_and_discount():
    env = gymnasium.make("agentrl/MathRetry-v1", max_attempts=3, discount=0.5)
    env.reset(options={"task": GSM8K_ROW})
    obs, reward, terminated, truncated, info = env.step("I am not sure.")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert "could not find a final answer" in obs[0]["content"] and "2 attempts left" in obs[0]["content"]
    obs, *_ = env.step("\\boxed{17}")
    assert "17 is not the answer" in obs[0]["content"] and "1 attempt left" in obs[0]["content"]
    obs, reward, terminated, truncated, info = env.step("\\boxed{18}")
    assert (obs, reward, terminated, truncated) == ([], 0.25, True, False)
    assert info["attempts"] == 3 and info["rewards"] == {"correct": 0.25, "format": 1.0, "length": 0.0}
    env.reset(options={"task": GSM8K_ROW})
    for _ in range(2):
        env.step("\\boxed{1}")
    *_, terminated, truncated, info = env.step("\\boxed{2}")
    assert terminated and not truncated and info["rewards"]["correct"] == 0.0
    env.close()


# --------------------------------------------------------------------------- tool use


def test_tool_use_offers_the_calculator_the_tiny_model_knows():
    env = gymnasium.make("agentrl/ToolUse-v0")
    _, info = env.reset(seed=0)
    assert info["tools"][0] == CALCULATOR_TOOL
    assert [t["function"]["name"] for t in info["tools"]] == ["calculator", "lookup"]
    env.close()
    env = gymnasium.make("agentrl/ToolUse-v0", kinds=["calc"])
    obs, info = env.reset(seed=0)
    assert info["tools"] == [CALCULATOR_TOOL] and obs[0]["content"].startswith("What is ")
    env.close()


def _solve(task):
    """The calls a careful agent makes for a tool-use task, one reply per list entry."""
    store, q = task["store"], task["question"]
    if task["kind"] == "calc":
        return [[("calculator", {"expression": q.removeprefix("What is ").removesuffix("?")})]]
    items = [w for w in q.replace("?", "").split() if w in store]
    if task["kind"] == "lookup":
        return [[("lookup", {"key": items[0]})]]
    counts = [int(w) for w in q.split() if w.isdigit()]
    expr = "+".join(f"{n}*{store[i]}" for n, i in zip(counts, items, strict=True))
    return [[("lookup", {"key": i}) for i in items], [("calculator", {"expression": expr})]]


@pytest.mark.parametrize("kind", KINDS)
def test_tool_use_episode_for_each_kind(kind):
    import random

    task = make_task(random.Random(7), kind)
    needed = {"calc": 1, "lookup": 1, "lookup_calc": 2, "two_lookups_calc": 3}[kind]
    env = gymnasium.make("agentrl/ToolUse-v0")
    env.reset(options={"task": task})
    results = []
    for calls in _solve(task):
        obs, reward, terminated, truncated, info = env.step("".join(tool_call_text(n, a) for n, a in calls))
        assert not terminated and not truncated and all(m["role"] == "tool" for m in obs)
        results += [m["content"] for m in obs]
    assert info["tool_calls"] == needed and info["tool_errors"] == 0
    assert results[-1] == task["answer"]
    _, reward, terminated, _, info = env.step(format_answer(int(results[-1])))
    assert (reward, terminated, info["correct"]) == (1.0, True, True)
    env.close()


def test_tool_use_malformed_calls_are_explained_and_turns_are_limited():
    env = gymnasium.make("agentrl/ToolUse-v0", max_turns=3)
    env.reset(options={"task": {"question": "What is the price of one tea?", "answer": "7", "store": {"tea": 7}}})
    obs, *_, info = env.step('<tool_call>{"name": "lookup", "arguments": {"key": "tea"</tool_call>')
    assert obs[0]["role"] == "tool" and "not valid JSON" in obs[0]["content"] and info["tool_errors"] == 1
    obs, *_ = env.step(tool_call_text("lookup", {"key": "coffee"}))
    assert "no item 'coffee'; the items are ['tea']" in obs[0]["content"]
    obs, reward, terminated, truncated, info = env.step(tool_call_text("lookup", {"key": "tea"}))
    assert obs[0]["content"] == "7"
    assert (reward, terminated, truncated, info["truncated_by"]) == (0.0, False, True, "max_turns")
    assert info["rewards"] == {"correct": 0.0, "tool_errors": 2.0, "used_tool_result": 0.0}
    env.close()


def test_tool_use_says_whether_the_final_answer_is_a_tool_result():
    """tool_use_rate (examples/tool_agent.yaml) is read from this term: 1 when the final answer
    is the result of a call that succeeded in the episode; a right answer given without one, or
    a number a failed call printed, counts 0. Its weight is 0: the reward stays `correct`."""
    task = {"question": "What is 37*48?", "answer": "1776"}
    env = gymnasium.make("agentrl/ToolUse-v0", kinds=("calc",))
    env.reset(options={"task": task})
    obs, *_ = env.step(tool_call_text("calculator", {"expression": "37*48"}))
    assert obs[0]["content"] == "1776"
    *_, reward, terminated, _, info = env.step("\\boxed{1776}")
    assert (reward, terminated, info["used_tool_result"], info["rewards"]["used_tool_result"]) == (1.0, True, True, 1.0)
    env.reset(options={"task": task})  # right, but not from the calculator
    *_, reward, _, _, info = env.step("\\boxed{1776}")
    assert reward == 1.0 and info["rewards"]["used_tool_result"] == 0.0
    env.reset(options={"task": task})  # a call that failed: its message is no result to use
    obs, *_ = env.step(tool_call_text("calculator", {"expression": "37/48"}))
    assert obs[0]["content"].startswith("error:")
    *_, reward, _, _, info = env.step("\\boxed{37}")
    assert reward == 0.0 and info["rewards"]["used_tool_result"] == 0.0
    env.reset(options={"task": task})  # the wrong expression's result, used: a tool result, not right
    env.step(tool_call_text("calculator", {"expression": "37*47"}))
    *_, reward, _, _, info = env.step("\\boxed{1739}")
    assert reward == 0.0 and info["rewards"]["used_tool_result"] == 1.0
    env.close()


def test_arith_retry_says_too_high_or_too_low_and_discounts_later_attempts():
    env = gymnasium.make("agentrl/ArithRetry-v0", max_attempts=3, discount=0.5)
    task = {"question": "What is 10+20+30?", "answer": "60"}
    obs, _ = env.reset(options={"task": task})
    assert obs == [{"role": "user", "content": "What is 10+20+30?"}]  # Arith-v0's first turn
    obs, reward, terminated, truncated, info = env.step("\\boxed{61}")
    assert obs[0]["content"] == "Too high. Try again." and not terminated and reward == 0.0
    obs, reward, terminated, _, _ = env.step("no box")
    assert obs[0]["content"].startswith("I could not find") and not terminated
    obs, reward, terminated, truncated, info = env.step("\\boxed{60}")
    assert terminated and not truncated and obs == [] and reward == 0.25 and info["attempts"] == 3
    env.reset(options={"task": task})
    assert env.step("\\boxed{59}")[0][0]["content"] == "Too low. Try again."
    assert env.step("\\boxed{58}")[2] is False
    _, reward, terminated, truncated, _ = env.step("\\boxed{1}")
    assert terminated and not truncated and reward == 0.0  # out of attempts
    env.close()


def test_arith_retry_last_digit_hint_and_the_fixed_share_terms():
    """hint="last_digit" tells the direction and the answer's last digit; every episode reports
    first_wrong and fixed (weight 0: the reward is unchanged), whose ratio is the share fixed."""
    env = gymnasium.make("agentrl/ArithRetry-v0", max_attempts=2, hint="last_digit")
    task = {"question": "What is 10+20+36?", "answer": "66"}
    env.reset(options={"task": task})
    obs, reward, terminated, _, info = env.step("\\boxed{64}")
    assert obs[0]["content"] == "Too low. The answer ends in 6. Try again." and not terminated
    *_, reward, terminated, _, info = env.step("\\boxed{66}")
    assert terminated and reward == 0.5 and info["rewards"] == {"correct": 0.5, "first_wrong": 1.0, "fixed": 1.0}
    env.reset(options={"task": task})
    *_, reward, terminated, truncated, info = env.step("\\boxed{66}")
    assert terminated and reward == 1.0 and info["rewards"] == {"correct": 1.0, "first_wrong": 0.0, "fixed": 0.0}
    env.reset(options={"task": task})
    assert env.step("\\boxed{69}")[0][0]["content"] == "Too high. The answer ends in 6. Try again."
    *_, reward, terminated, truncated, info = env.step("\\boxed{69}")
    assert terminated and not truncated and info["rewards"] == {"correct": 0.0, "first_wrong": 1.0, "fixed": 0.0}
    env.close()
    with pytest.raises(EnvError, match="hint must be one of"):
        gymnasium.make("agentrl/ArithRetry-v0", hint="digits")
