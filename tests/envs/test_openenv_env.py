"""An OpenEnv ``Environment`` this test defines, served by OpenEnv's own ``create_app`` on 127.0.0.1 and
named ``openenv:http://127.0.0.1:PORT`` (or ``openenv:module:Class`` in process): checked, played by the
tiny model through a real ``agentrl serve``, and trained on with ``agentrl train``.

The bug story: an adapter that drops the server's reward or ``done`` (episodes that never end,
or that end with the adapter's guess at a score).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agentrl.api import SamplingParams, TrajectoryStatus
from agentrl.client.remote_engine import RemoteEngine
from agentrl.env.checks import check_text_env
from agentrl.process.services import free_port
from agentrl.rollout.conversation import sampled_spans
from workflows.env import EnvWorkflow

ROOT = Path(__file__).resolve().parents[2]
AGENTRL = str(Path(sys.executable).parent / "agentrl")
SUM_ENV = '''
import random
from openenv.core.env_server import Action, Environment, Observation, State, create_app


class SumAction(Action):
    message: str


class SumObservation(Observation):
    prompt: str = ""


class SumEnv(Environment[SumAction, SumObservation, State]):
    """a+b+c, answered in \\\\boxed{}: reward 1 when right, done after one reply."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state, self.answer = State(step_count=0), 0

    def reset(self, seed=None, episode_id=None, **kwargs):
        rng = random.Random(seed)
        a, b, c = (rng.randrange(10, 100) for _ in range(3))
        self.answer, self._state = a + b + c, State(episode_id=episode_id, step_count=0)
        return SumObservation(prompt=f"What is {a}+{b}+{c}?")

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        return SumObservation(done=True, reward=float(f"\\\\boxed{{{self.answer}}}" in action.message))

    @property
    def state(self):
        return self._state


app = create_app(SumEnv, SumAction, SumObservation, env_name="sum", max_concurrent_envs=64)
'''


@pytest.fixture(scope="module")
def sum_server(tmp_path_factory):
    """The test's Environment behind OpenEnv's server (uvicorn), on 127.0.0.1."""
    folder = tmp_path_factory.mktemp("openenv")
    (folder / "sum_env.py").write_text(SUM_ENV)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "sum_env:app", "--host", "127.0.0.1", "--port",
                             str(port)], cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-2000:]
            time.sleep(0.2)
        yield url, folder
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_envs_check_passes_on_the_server_and_on_the_class(sum_server, monkeypatch):
    url, folder = sum_server
    r = subprocess.run([AGENTRL, "envs", "check", f"openenv:{url}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith(f"openenv:{url}: ok"), r.stdout + r.stderr
    monkeypatch.syspath_prepend(str(folder))
    assert check_text_env("openenv:sum_env:SumEnv") == []


async def test_episodes_through_a_real_server_carry_the_envs_reward(sum_server, tiny_server, tiny_model_dir):
    url, _ = sum_server
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


def test_a_short_train_on_an_openenv_server(sum_server, tmp_path):
    url, _ = sum_server
    config = {
        "model": str(ROOT / "examples" / "tiny-model"), "run_dir": str(tmp_path / "run"), "steps": 2,
        "max_minutes": None, "world_size": 1, "threads": 1, "inference": {"num_servers": 1, "threads": 1},
        "rollout": {"workflow": "workflows.env:EnvWorkflow", "workflow_args": {"env_id": f"openenv:{url}"},
                    "dataset": "envs.interop.openenv_env:train_rows", "group_size": 4, "batch_size": 2,
                    "sampling": {"temperature": 1.0, "max_new_tokens": 12}},
        "eval": {"dataset": "envs.interop.openenv_env:eval_rows", "limit": 8,
                 "sampling": {"temperature": 0.0, "max_new_tokens": 12}},
        "checkpoint": {"every_steps": 0}, "logging": {"tensorboard": False, "trajectories_per_step": 2},
    }
    (tmp_path / "oe.yaml").write_text(json.dumps(config))
    out = subprocess.run([AGENTRL, "train", str(tmp_path / "oe.yaml")], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["counters"]["episodes_failed"] == 0, summary
    assert summary["eval_after"] is not None
