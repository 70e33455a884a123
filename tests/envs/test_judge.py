"""LLM-as-judge rewards (``agentrl.env.judge``) against a real ``agentrl serve`` as the judge.

The bug stories: a judge that cannot be reached scoring the reply 0 (a silent wrong reward
instead of a failed episode), and a group of equal replies paying for one request each.
"""

from __future__ import annotations

import re

import gymnasium
import httpx
import pytest

from agentrl.client.transport import KeepAliveTransport
from agentrl.env import RewardInput
from agentrl.env.judge import LLMJudge
from agentrl.errors import VerifierError
from agentrl.plugins import find_env
from agentrl.process.services import free_port

PROMPT = "What is {a}+{b}+{response}?"  # what the tiny model can answer: its grade is its sum


async def test_the_grade_is_the_judges_answer_cached_by_prompt(tiny_server):
    judge = LLMJudge(tiny_server.url + "/v1", prompt=PROMPT, max_score=300, max_tokens=12)
    inp = RewardInput("40", task={"a": 12, "b": 30})
    async with httpx.AsyncClient(timeout=60) as client:  # the same request, asked directly
        r = await client.post(tiny_server.url + "/v1/chat/completions", json={
            "model": "default", "messages": [{"role": "user", "content": "What is 12+30+40?"}],
            "max_tokens": 12, "temperature": 0.0})
    said = r.json()["choices"][0]["message"]["content"]
    expected = min(1.0, float(re.findall(r"-?\d+(?:\.\d+)?", said)[-1]) / 300)
    assert await judge(inp) == pytest.approx(expected) and judge.requests == 1
    assert await judge(inp) == pytest.approx(expected) and judge.requests == 1  # cached


async def test_one_connection_serves_every_grade(tiny_server):
    transport = KeepAliveTransport()  # counts the connections it opens
    judge = LLMJudge(tiny_server.url + "/v1", prompt=PROMPT, max_score=300, max_tokens=12, transport=transport)
    for reply in ("1", "2", "3"):
        await judge(RewardInput(reply, task={"a": 1, "b": 2}))
    assert judge.requests == 3 and transport.connections_opened == 1
    await judge.aclose()
    await judge(RewardInput("4", task={"a": 1, "b": 2}))  # a closed judge opens a new client when asked again
    assert judge.requests == 4 and transport.connections_opened == 2
    await judge.aclose()


async def test_an_unreachable_judge_fails_the_episode_after_its_retries():
    judge = LLMJudge(f"http://127.0.0.1:{free_port()}/v1", retries=2, backoff_s=0.01, timeout_s=2)
    with pytest.raises(VerifierError, match="failed 3 times"):
        await judge(RewardInput("x", task={"question": "q"}))
    assert judge.requests == 3


def test_grades_are_read_and_scaled():
    judge = LLMJudge("http://127.0.0.1:1/v1", score_pattern="Score:", max_score=10)
    assert judge.parse("reasoning 3 ... Score: 7") == 0.7
    assert judge.parse("Score: 12") == 1.0
    with pytest.raises(VerifierError, match="no grade"):
        judge.parse("I cannot grade this")


def test_a_reasoning_gym_env_with_a_judge_term(tiny_server):
    env = gymnasium.make(find_env("reasoning_gym/chain_sum"), judge={
        "base_url": tiny_server.url + "/v1", "prompt": "What is 1+2+{answer}?", "max_score": 10_000,
        "weight": 0.5}).unwrapped
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(f"\\boxed{{{env.task['answer']}}}")
    assert terminated and info["rewards"]["score"] == 1.0 and 0.0 <= info["rewards"]["judge"] <= 1.0
    assert reward == pytest.approx(1.0 + 0.5 * info["rewards"]["judge"])
    env.close()


def test_the_default_grade_is_the_number_the_answer_ends_with():
    """Issue 49: with no ``score_pattern`` the last number anywhere won: an error text "rate
    limit reached, retry in 30 seconds" graded 1.0 and "3 unsafe claims" 0.3. Now an answer must
    end with its grade; one that ends in words holds none (the episode fails, as data)."""
    judge = LLMJudge("http://127.0.0.1:1/v1", max_score=10)
    for answer, grade in (("7", 0.7), (" Score: 8.5\n", 0.85), ("7/10", 0.7), ("\\boxed{9}.", 0.9), ("**6**", 0.6)):
        assert judge.parse(answer) == grade, answer
    for answer in ("rate limit reached, retry in 30 seconds", "3 unsafe claims", "I cannot grade this", ""):
        with pytest.raises(VerifierError, match="no grade"):
            judge.parse(answer)


async def test_a_judge_that_drips_its_answer_is_cut_off_at_the_timeout():
    """Issue 49: ``timeout_s`` bounded each read, so a judge sending a byte a second never timed
    out (``envs check`` hung past 240 s). It bounds the whole exchange now."""
    import asyncio
    import time

    async def drip(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
        try:
            for _ in range(100):
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(0.2)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(drip, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    judge = LLMJudge(f"http://127.0.0.1:{port}/v1", retries=0, timeout_s=1.0)
    t0 = time.perf_counter()
    try:
        with pytest.raises(VerifierError, match="no answer within 1 s"):
            await asyncio.wait_for(judge(RewardInput("x", task={"question": "q"})), 10)
    finally:
        server.close()
        await judge.aclose()
    assert time.perf_counter() - t0 < 3
