"""SkyRL-Gym's envs, unchanged, as ``skyrl_gym/<id>``: ``gsm8k_multi_turn`` and ``text2sql`` on a sqlite
database this test writes, played by the tiny model through a real ``agentrl serve``.

The bug story: an adapter that keeps only the last step's reward of a multi-turn env whose
rewards are per turn, or that scores SQL itself instead of running SkyRL's comparison.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import gymnasium
import pytest
import skyrl_gym
from omegaconf import OmegaConf

from agentrl.api import SamplingParams, TrajectoryStatus, sampled_spans
from agentrl.client.remote_engine import RemoteEngine
from agentrl.env.checks import check_text_env
from agentrl.errors import ConfigError
from agentrl.plugins import find_env
from envs.interop.skyrl_gym_env import gsm8k_multi_turn_rows, text2sql_rows
from workflows.env import EnvWorkflow

from ..short_runs import recorded_trajectories, short_train

AGENTRL = str(Path(sys.executable).parent / "agentrl")
SAMPLING = SamplingParams(max_new_tokens=16, temperature=1.0)
QUESTIONS = [("How many planets have rings?", "SELECT COUNT(*) FROM planets WHERE rings = 1"),
             ("Which planet is largest?", "SELECT name FROM planets ORDER BY radius DESC LIMIT 1")]


@pytest.fixture
def sql_root(tmp_path):
    """SkyRL's spider layout, ROOT/spider/database/DB/DB.sqlite, with a table of planets."""
    path = tmp_path / "spider" / "database" / "solar" / "solar.sqlite"
    path.parent.mkdir(parents=True)
    with sqlite3.connect(path) as db:
        db.executescript("CREATE TABLE planets (name TEXT, radius REAL, rings INTEGER);"
                         "INSERT INTO planets VALUES ('Earth', 6371, 0), ('Jupiter', 69911, 1), ('Saturn', 58232, 1);")
    db.close()
    return tmp_path


def replies(wf, traj) -> list[str]:
    return [wf.renderer.decode(traj.input_ids[a:b], skip_special_tokens=True) for a, b in sampled_spans(traj.loss_mask)]


def test_envs_check_passes_on_sample_rows():
    r = subprocess.run([AGENTRL, "envs", "check", "skyrl_gym/gsm8k_multi_turn"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("skyrl_gym/gsm8k_multi_turn: ok"), r.stdout + r.stderr
    assert check_text_env("skyrl_gym/text2sql") == []  # on the adapter's sample database


def test_ids_without_sample_rows_and_unknown_ids_are_explained():
    with pytest.raises(ConfigError, match="did you mean 'skyrl_gym/gsm8k'"):
        find_env("skyrl_gym/gsm8kk")
    env = gymnasium.make(find_env("skyrl_gym/lcb"))
    with pytest.raises(Exception, match="no sample rows here"):
        env.reset(seed=0)
    env.close()


def test_text2sql_rewards_are_skyrls_comparison(sql_root):
    rows = text2sql_rows(QUESTIONS, db_id="solar")
    env = gymnasium.make(find_env("skyrl_gym/text2sql"), env_config={"db_path": str(sql_root)}).unwrapped
    env.reset(options={"task": rows[0]})
    obs, reward, terminated, *_ = env.step("<think>count</think><sql>SELECT COUNT(*) FROM planets</sql>")
    assert not terminated and obs[0]["role"] == "user" and "3" in obs[0]["content"]  # the query ran on our db
    _, reward, terminated, *_ = env.step("<think>ringed</think><solution>SELECT COUNT(name) FROM planets "
                                         "WHERE rings > 0</solution>")
    assert terminated and reward == 1.0
    env.reset(options={"task": rows[1]})
    assert env.step("<solution>SELECT 'Earth'</solution>")[1] == -1.0  # no <think>: SkyRL's format penalty
    with pytest.raises(Exception, match="db_path"):  # the default path of SkyRL's config is not here
        gymnasium.make(find_env("skyrl_gym/text2sql")).reset(options={"task": rows[0]})
    env.close()


async def test_gsm8k_multi_turn_through_a_real_server(tiny_server, tiny_model_dir):
    rows = [dict(r, max_turns=3) for r in gsm8k_multi_turn_rows(limit=2)]
    wf = EnvWorkflow("skyrl_gym/gsm8k_multi_turn", tiny_model_dir, SAMPLING, max_context_tokens=1024)
    async with RemoteEngine(tiny_server.url) as engine:
        for row in rows:
            trajs = await wf.arun_episode(engine, row)
            assert all(t.status == TrajectoryStatus.OK for t in trajs), [t.error for t in trajs]
            # SkyRL's own env on the same replies: the episode's reward is the sum of its turn rewards
            inner = skyrl_gym.make("gsm8k_multi_turn", env_config=OmegaConf.create({}),
                                   extras={k: v for k, v in row.items() if k not in ("prompt", "env_class")})
            inner.init(row["prompt"])
            said = [r for t in trajs for r in replies(wf, t)]
            assert 1 <= len(said) <= 3
            total = sum(inner.step(r)["reward"] for r in said)
            assert trajs[-1].reward == pytest.approx(total)


async def test_text2sql_through_a_real_server(sql_root, tiny_server, tiny_model_dir):
    wf = EnvWorkflow("skyrl_gym/text2sql", tiny_model_dir, SAMPLING, {"env_config": {"db_path": str(sql_root)}},
                     max_context_tokens=1024)
    async with RemoteEngine(tiny_server.url) as engine:
        for row in text2sql_rows(QUESTIONS, db_id="solar"):
            trajs = await wf.arun_episode(engine, dict(row, max_turns=2))
            assert all(t.status == TrajectoryStatus.OK for t in trajs), [t.error for t in trajs]
            assert trajs[-1].reward in (-1.0, 0.0, 1.0)  # SkyRL's: bad format, wrong result, right result


def test_a_short_train_on_gsm8k_multi_turn(tmp_path):
    short_train(tmp_path / "run", {
        "workflow": "workflows.env:EnvWorkflow",
        "workflow_args": {"env_id": "skyrl_gym/gsm8k_multi_turn", "env_kwargs": {"max_turns": 2},
                          "max_context_tokens": 1024},
        "dataset": "envs.interop.skyrl_gym_env:gsm8k_multi_turn_rows", "group_size": 2, "batch_size": 2,
        "sampling": {"temperature": 1.0, "max_new_tokens": 16}})
    trained = recorded_trajectories(tmp_path / "run")
    assert len(trained) >= 2 * 2 * 2  # steps x prompts x samples (a stale one is recorded too), a stream each
    assert {t["reward"] for t in trained} <= {-1.0, 0.0, 1.0}  # SkyRL's scores, summed over the turns
