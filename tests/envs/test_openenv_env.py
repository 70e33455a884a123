"""An OpenEnv ``Environment`` this test defines, served by OpenEnv's own ``create_app`` on 127.0.0.1 and
named ``openenv:http://127.0.0.1:PORT`` (or ``openenv:module:Class`` in process): checked, played by the
tiny model through a real ``agentrl serve``, and trained on with ``agentrl train``.

The bug story: an adapter that drops the server's reward or ``done`` (episodes that never end,
or that end with the adapter's guess at a score).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from agentrl.api import SamplingParams, TrajectoryStatus, sampled_spans
from agentrl.client.remote_engine import RemoteEngine
from agentrl.env.checks import check_text_env
from workflows.env import EnvWorkflow

from ..short_runs import short_train

ROOT = Path(__file__).resolve().parents[2]
AGENTRL = str(Path(sys.executable).parent / "agentrl")


def test_envs_check_passes_on_the_server_and_on_the_class(openenv_sum_server, monkeypatch):
    url, folder = openenv_sum_server
    r = subprocess.run([AGENTRL, "envs", "check", f"openenv:{url}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith(f"openenv:{url}: ok"), r.stdout + r.stderr
    monkeypatch.syspath_prepend(str(folder))
    assert check_text_env("openenv:sum_env:SumEnv") == []


async def test_episodes_through_a_real_server_carry_the_envs_reward(openenv_sum_server, tiny_server, tiny_model_dir):
    url, _ = openenv_sum_server
    wf = EnvWorkflow(f"openenv:{url}", tiny_model_dir, SamplingParams(max_new_tokens=12, temperature=1.0))
    async with RemoteEngine(tiny_server.url) as engine:
        for seed in range(6):
            (traj,) = await wf.arun_episode(engine, {"seed": seed})
            assert traj.status == TrajectoryStatus.OK, traj.error
            text = wf.renderer.decode(traj.input_ids)
            a, b, c = map(int, re.search(r"What is (\d+)\+(\d+)\+(\d+)\?", text).groups())
            (start, end), = sampled_spans(traj.loss_mask)
            reply = wf.renderer.decode(traj.input_ids[start:end], skip_special_tokens=True)
            assert traj.reward == float(f"\\boxed{{{a + b + c}}}" in reply)
    await wf.aclose()


def test_a_short_train_on_an_openenv_server(openenv_sum_server, tmp_path):
    url, _ = openenv_sum_server
    summary = short_train(tmp_path / "run", {
        "workflow": "workflows.env:EnvWorkflow", "workflow_args": {"env_id": f"openenv:{url}"},
        "dataset": "envs.interop.openenv_env:train_rows", "group_size": 4, "batch_size": 2,
        "sampling": {"temperature": 1.0, "max_new_tokens": 12}},
        eval={"dataset": "envs.interop.openenv_env:eval_rows", "limit": 8,
              "sampling": {"temperature": 0.0, "max_new_tokens": 12}})
    assert summary["eval_after"] is not None


def test_a_server_of_one_session_is_checked_and_played_within_its_capacity(tmp_path):
    """Issue 49: OpenEnv's ``create_app`` serves one session unless the environment declares more,
    and ``agentrl envs check openenv:URL`` left a session open (on the sync API's idle loop) while
    it opened the next: CAPACITY_REACHED. Now each session is closed on the loop that opened it,
    and an episode whose server is full waits for a session instead of failing."""
    import asyncio

    from envs.interop.openenv_env import OpenEnvEnv

    from ..conftest import OPENENV_SUM_ENV, openenv_server

    (tmp_path / "one_env.py").write_text(OPENENV_SUM_ENV.replace("SUPPORTS_CONCURRENT_SESSIONS = True",
                                                                 "SUPPORTS_CONCURRENT_SESSIONS = False").replace(
        ", max_concurrent_envs=64)", ")"))  # OpenEnv's default: one session
    with openenv_server(tmp_path, "one_env") as url:
        assert check_text_env(f"openenv:{url}") == []

        async def play(seed: int) -> float:
            env = OpenEnvEnv(url, timeout_s=30)
            try:
                messages, _ = await env.areset(seed=seed)
                a, b, c = map(int, re.search(r"What is (\d+)\+(\d+)\+(\d+)\?", messages[0]["content"]).groups())
                await asyncio.sleep(0.2)  # holds the server's one session a while
                return (await env.astep(f"\\boxed{{{a + b + c}}}"))[1]
            finally:
                await env.aclose()

        async def both():
            return await asyncio.gather(play(1), play(2), play(3))

        assert asyncio.run(both()) == [1.0, 1.0, 1.0]  # three episodes, one at a time
