"""The text-environment base: spaces, episode limits, rewards in info, sync and async paths,
and every registered env through gymnasium's check_env and agentrl's own checks."""

from __future__ import annotations

import asyncio
import time

import gymnasium
import pytest

import envs  # noqa: F401  (registers the agentrl/... ids)
from agentrl.env.checks import DOC_SECTIONS, check_text_env, docstring_advice, registered_ids, shipped
from agentrl.env.rewards import Reward, Rubric, fact
from agentrl.env.text_env import EpisodeLimits, Messages, Text, TextEnv, Turn
from agentrl.errors import EnvError


class CountdownEnv(TextEnv):
    """A test env: replies "done" to finish; anything else gets an echo; correct = said "done"."""

    def __init__(self, limits: EpisodeLimits, sleep_s: float = 0.0):
        super().__init__(rubric=Rubric([Reward("correct", fact("correct")), Reward("turns", fact("turn_count"), -0.1)]),
                         limits=limits)
        self.sleep_s = sleep_s

    def sample_task(self):
        return {"n": int(self.np_random.integers(100))}

    async def _start(self, task):
        return [{"role": "user", "content": f"task {task['n']}"}]

    async def _turn(self, action):
        await asyncio.sleep(self.sleep_s)
        done = action == "done"
        return Turn([] if done else [{"role": "user", "content": f"echo {action}"}], done,
                    {"correct": done, "turn_count": self._turns})


def test_text_space_accepts_any_unicode_and_samples_reproducibly():
    space = Text(max_length=20)
    assert "héllo 中文 🙂\x00" in space and "" in space
    assert "x" * 21 not in space and 5 not in space
    a, b = Text(seed=3), Text(seed=3)
    assert [a.sample() for _ in range(5)] == [b.sample() for _ in range(5)]


def test_messages_space_checks_structure():
    space = Messages()
    assert [] in space
    assert [{"role": "tool", "content": "1", "tool_call_id": "call_0", "name": "calc"}] in space
    assert [{"role": "robot", "content": "x"}] not in space
    assert [{"role": "user", "content": 3}] not in space
    assert [{"role": "user", "content": "x", "extra": 1}] not in space
    assert {"role": "user", "content": "x"} not in space
    space.seed(0)
    assert all(space.sample() in space for _ in range(20))


def test_single_reply_episode_reports_every_reward_term():
    env = CountdownEnv(EpisodeLimits(max_turns=3))
    obs, info = env.reset(seed=0)
    assert obs[0]["role"] == "user" and info == {"turn": 0}
    obs, reward, terminated, truncated, info = env.step("done")
    assert (obs, terminated, truncated) == ([], True, False)
    assert info["rewards"] == {"correct": 1.0, "turns": 1.0}
    assert reward == pytest.approx(1.0 - 0.1)
    env.close()


def test_max_turns_truncates_like_time_limit():
    env = CountdownEnv(EpisodeLimits(max_turns=2))
    env.reset(seed=0)
    first = env.step("a")
    assert first[1:4] == (0.0, False, False) and "rewards" not in first[4]
    obs, reward, terminated, truncated, info = env.step("b")
    assert (terminated, truncated, info["truncated_by"]) == (False, True, "max_turns")
    assert info["rewards"] == {"correct": 0.0, "turns": 2.0} and reward == pytest.approx(-0.2)
    with pytest.raises(EnvError, match="episode is over"):
        env.step("c")
    env.close()


def test_max_tokens_counts_the_whole_conversation():
    # "task N" is 6-7 bytes; each reply "aaaa" (4) is echoed as "echo aaaa" (9): 13 per turn
    env = CountdownEnv(EpisodeLimits(max_turns=50, max_tokens=40))
    env.reset(seed=0)
    outcomes = [env.step("aaaa") for _ in range(3)]
    assert [o[3] for o in outcomes] == [False, False, True]
    assert outcomes[-1][4]["truncated_by"] == "max_tokens"
    env.close()


def test_wall_time_limit_cancels_an_overrunning_turn():
    env = CountdownEnv(EpisodeLimits(max_turns=50, max_wall_s=3.0), sleep_s=2.0)
    env.reset(seed=0)
    assert env.step("a")[3] is False  # 2 s of 3 s used
    start = time.monotonic()
    obs, reward, terminated, truncated, info = env.step("b")  # would end at 4 s: cut at 3 s
    assert time.monotonic() - start < 1.7  # about 1 s, not the turn's 2 s
    assert (obs, terminated, truncated, info["truncated_by"]) == ([], False, True, "wall_time")
    assert info["rewards"] == {"correct": 0.0, "turns": 1.0}  # the cancelled turn measured nothing
    env.close()


def test_misuse_is_a_clear_error():
    env = CountdownEnv(EpisodeLimits(max_turns=2))
    with pytest.raises(EnvError, match="before reset"):
        env.step("x")
    with pytest.raises(EnvError, match="accept only 'task'"):
        env.reset(options={"tasks": {}})
    with pytest.raises(EnvError, match="must be a dataset row"):
        env.reset(options={"task": "a string"})
    env.reset(options={"task": {"n": 5}})
    with pytest.raises(EnvError, match="reply as a str"):
        env.step(["not", "text"])
    env.close()


async def test_async_path_matches_sync_and_runs_concurrently():
    env = CountdownEnv(EpisodeLimits(max_turns=3))
    sync_obs = env.reset(seed=7)[0]
    sync_step = env.step("x")
    env.close()
    envs_ = [CountdownEnv(EpisodeLimits(max_turns=3), sleep_s=0.2) for _ in range(5)]
    assert (await envs_[0].areset(seed=7))[0] == sync_obs
    for e in envs_[1:]:
        await e.areset(seed=7)
    start = time.monotonic()
    steps = await asyncio.gather(*(e.astep("x") for e in envs_))
    assert time.monotonic() - start < 0.9  # five 0.2 s turns overlapped on one loop (1 s in series)
    assert all(s == sync_step for s in steps)


def test_render_ansi_shows_the_conversation():
    env = CountdownEnv(EpisodeLimits(max_turns=3))
    env.render_mode = "ansi"
    env.reset(options={"task": {"n": 1}})
    env.step("hi")
    assert env.render() == "[user] task 1\n[assistant] hi\n[user] echo hi\n"
    env.close()


# --------------------------------------------------------------------------- registered envs

EXPECTED_IDS = ["agentrl/Arith-v0", "agentrl/ArithRetry-v0", "agentrl/Code-v0", "agentrl/CodeAgent-v0", "agentrl/Math-v1",
                "agentrl/MathRetry-v1", "agentrl/ToolUse-v0"]
"""The envs with default tasks; agentrl/Repo-v0 needs task images and a dataset, and passes the
same check in tests/envs/test_repo.py."""


def test_every_env_is_registered():
    assert registered_ids() == sorted([*EXPECTED_IDS, "agentrl/Repo-v0"])


@pytest.mark.parametrize("env_id", EXPECTED_IDS)
def test_check_env_and_agentrl_checks(env_id):
    assert check_text_env(env_id) == []


@pytest.mark.parametrize("env_id", EXPECTED_IDS)
def test_seeded_determinism_of_tasks_and_steps(env_id):
    a, b = gymnasium.make(env_id), gymnasium.make(env_id)
    try:
        for seed in (0, 11):
            assert a.reset(seed=seed) == b.reset(seed=seed)
            assert a.step("\\boxed{3}") == b.step("\\boxed{3}")
        assert a.reset(seed=0)[0] != a.reset(seed=1)[0]
    finally:
        a.close()
        b.close()


class NoDocsEnv(CountdownEnv):
    """A countdown env whose docstring lacks Gymnasium's sections."""

    def __init__(self, render_mode=None):
        super().__init__(EpisodeLimits(max_turns=2))


def test_missing_docstring_sections_fail_our_envs_and_advise_a_users():
    """Issue 43: the envs shipped in envs/ are held to Gymnasium's docstring sections; a user's env
    (this one lives in a test module) passes without them and gets the same finding as advice."""
    gymnasium.register("agentrl/TestNoDocs-v0", entry_point=NoDocsEnv)
    try:
        strict = check_text_env("agentrl/TestNoDocs-v0", docstring_sections=True)
        default = check_text_env("agentrl/TestNoDocs-v0")
        advice = docstring_advice("agentrl/TestNoDocs-v0")
        assert not shipped("agentrl/TestNoDocs-v0") and shipped("agentrl/Arith-v0")
    finally:
        del gymnasium.registry["agentrl/TestNoDocs-v0"]
    assert len(strict) == 1 and "docstring lacks" in strict[0]
    assert all(s in strict[0] for s in DOC_SECTIONS)
    assert default == [] and advice == strict
