"""The episode record: what an env was given and gave back, noted by EnvPool into the episode
that runs it, bounded with every cut marked, and enough to score the episode again."""

from __future__ import annotations

import asyncio
import json

import pytest

import envs.arith  # noqa: F401  (registers agentrl/Arith-v0)
from agentrl.api import Completion, SamplingParams
from agentrl.rollout.env_pool import EnvPool
from agentrl.rollout.record import EpisodeRecord, current_record, recording, reward_input

ROW = {"question": "What is 2+3?", "answer": "5", "expression": "2+3"}


async def play(pool: EnvPool, reply: str) -> tuple[float, dict]:
    async with pool.lease() as env:
        await pool.reset(env, ROW)
        _, reward, _, _, info = await pool.step(env, reply)
    return reward, info


def test_env_pool_notes_reset_and_step_into_the_open_record_and_its_rubric_scores_it_again():
    async def main():
        pool = EnvPool("agentrl/Arith-v0")
        try:
            assert current_record() is None
            await play(pool, "\\boxed{5}")  # no record open: nothing noted, nothing fails
            with recording() as record:
                reward, info = await play(pool, "\\boxed{5}")
            env = pool._idle[0]
        finally:
            await pool.aclose()
        return record, reward, info, env

    record, reward, info, env = asyncio.run(main())
    reset, step = record.events
    assert reset["kind"] == "reset" and reset["task"] == ROW
    assert reset["observation"] == [{"role": "user", "content": "What is 2+3?"}]
    assert step["action"] == "\\boxed{5}" and step["reward"] == reward == 1.0 and step["terminated"] is True
    assert step["info"]["rewards"] == info["rewards"] and step["info"]["correct"] is True
    d = record.to_dict()
    assert d["truncated"] is False and d["bytes"] == sum(len(json.dumps(e, separators=(",", ":"))) for e in d["events"])
    # the env's own rubric on what the record rebuilds gives the reward the env gave
    inp = reward_input(d)
    assert inp.response == "\\boxed{5}" and inp.task == ROW and inp.facts["correct"] is True
    assert inp.transcript[-1] == {"role": "assistant", "content": "\\boxed{5}"}
    assert env.rubric.score(inp)[0] == reward


def test_each_task_has_its_own_record():
    async def episode(pool, reply):
        with recording() as record:
            await asyncio.sleep(0)  # the other episode runs in between
            await play(pool, reply)
        return record

    async def main():
        pool = EnvPool("agentrl/Arith-v0")
        try:
            return await asyncio.gather(episode(pool, "\\boxed{5}"), episode(pool, "\\boxed{7}"))
        finally:
            await pool.aclose()

    a, b = asyncio.run(main())
    assert [e["action"] for e in a.events if e["kind"] == "step"] == ["\\boxed{5}"]
    assert [e["action"] for e in b.events if e["kind"] == "step"] == ["\\boxed{7}"]


def test_the_bound_cuts_long_strings_and_marks_every_cut():
    record = EpisodeRecord(600, seed=7)
    record.generate(20, SamplingParams(seed=7), Completion([1, 2], [-0.1, -0.2], [0, 0], "stop"))
    record.step("x" * 5000, [{"role": "tool", "content": "y" * 5000}], 0.0, False, False, {"turn": 1})
    d = record.to_dict()
    assert d["bytes"] <= 600 and d["truncated"] is True and d["cut_events"] == 1 and d["seed"] == 7
    gen, step = d["events"]
    assert gen == {"kind": "generate", "seed": 7, "prompt_tokens": 20, "tokens": 2, "finish_reason": "stop"}
    assert step["cut"] is True and "chars cut]" in step["action"] and step["action"].startswith("xxx")
    assert reward_input(d) is None  # a cut episode is not scored again
    for _ in range(20):  # past the bound: kept as a bare marker, then not at all, and counted
        record.step("z" * 100, [], 0.0, False, False, {})
    d = record.to_dict()
    assert d["bytes"] <= 600 and d["cut_events"] == 21 and d["dropped_events"] > 0
    assert all(e.get("cut") for e in d["events"][2:])
    assert EpisodeRecord(0).to_dict()["bytes"] == 0


def test_values_that_are_not_json_are_written_as_their_repr():
    class Odd:
        def __repr__(self) -> str:
            return "Odd()"

    record = EpisodeRecord()
    record.step("a", [], 1.0, True, False, {"thing": Odd(), "nan": float("nan")})
    info = record.events[0]["info"]
    assert info["thing"] == "Odd()" and info["nan"] != info["nan"]


def test_a_record_without_a_step_scores_nothing():
    assert reward_input({"events": [{"kind": "reset", "task": ROW, "observation": [], "info": {}}]}) is None


def test_a_negative_bound_is_refused():
    with pytest.raises(ValueError, match="max_bytes must be >= 0"):
        EpisodeRecord(-1)
