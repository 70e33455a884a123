"""A verifiers taskset (``verifiers:<taskset>``, defined by this test with verifiers' own classes) played by
verifiers' own harness and runtime in its own environment (``.venv-verifiers``), the model reached
through an agentrl gateway session backed by a real ``agentrl serve``.

The bug stories: a harness whose model calls bypass the gateway (no exact tokens to train on), and a
reward that is not the taskset's rubric.
"""

from __future__ import annotations

import pytest

from agentrl.api import TrajectoryStatus, sampled_spans
from agentrl.client.remote_engine import RemoteEngine
from agentrl.errors import ConfigError
from workflows.verifiers_harness import VerifiersWorkflow

from ..short_runs import recorded_trajectories, short_train

SUM_TASKSET = '''
import random

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: int


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        replies = [m.content for m in trace.messages if m.role == "assistant"]
        return float(bool(replies) and f"\\\\boxed{{{self.data.answer}}}" in replies[-1])


class SumConfig(vf.TasksetConfig):
    num_tasks: int = 4


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self):
        tasks = []
        for i in range(self.config.num_tasks):
            rng = random.Random(i)
            a, b, c = (rng.randrange(10, 100) for _ in range(3))
            tasks.append(SumTask(SumData(prompt=f"What is {a}+{b}+{c}?", answer=a + b + c), self.config.task))
        return tasks


__all__ = ["SumTaskset"]
'''


async def test_a_taskset_through_its_harness_and_the_gateway(tiny_server, tiny_model_dir, tmp_path, monkeypatch):
    (tmp_path / "sum_taskset.py").write_text(SUM_TASKSET)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    wf = VerifiersWorkflow("verifiers:sum_taskset", tiny_model_dir, timeout_s=240, context_length=1024)
    try:
        async with RemoteEngine(tiny_server.url) as engine:
            for index in range(2):
                trajs = await wf.arun_episode(engine, {"index": index})
                assert [t.status for t in trajs] == [TrajectoryStatus.OK], [t.error for t in trajs]
                (traj,) = trajs
                text = wf.renderer.decode(traj.input_ids)
                assert "What is " in text  # the taskset's prompt, as the gateway rendered it
                (start, end), = sampled_spans(traj.loss_mask)
                reply = wf.renderer.decode(traj.input_ids[start:end], skip_special_tokens=True)
                a, b, c = map(int, text.split("What is ")[1].split("?")[0].split("+"))
                assert traj.reward == float(f"\\boxed{{{a + b + c}}}" in reply)  # the rubric's, on the exact reply
            (failed,) = await wf.arun_episode(engine, {"index": 99})  # no such task: a failed episode, as data
            assert failed.status == TrajectoryStatus.ENV_ERROR and "no task 99" in failed.error
    finally:
        await wf.aclose()


def test_a_missing_verifiers_environment_says_how_to_build_it(tiny_model_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTRL_VERIFIERS_PYTHON", str(tmp_path / "nowhere" / "python"))
    with pytest.raises(ConfigError, match="make verifiers"):
        VerifiersWorkflow("verifiers:sum_taskset", tiny_model_dir)
    from agentrl.plugins import find_env

    with pytest.raises(ConfigError, match="workflows.verifiers_harness:VerifiersWorkflow"):  # not an env id
        find_env("verifiers:sum_taskset")


async def test_verifiers_own_openenv_taskset_through_the_gateway(openenv_sum_server, tiny_server, tiny_model_dir):
    """verifiers' shipped ``openenv`` taskset (its OpenEnv 0.4 client, in its venv) against an OpenEnv 0.10
    server: the taskset's own reward (``openenv_reward``, the server's) on the trajectory."""
    url, _ = openenv_sum_server
    taskset = {"id": "openenv", "base_url": url, "resets": [{"seed": 0}, {"seed": 1}]}
    wf = VerifiersWorkflow("verifiers:openenv", tiny_model_dir, env_config={"taskset": taskset}, timeout_s=240,
                           context_length=1024)
    try:
        async with RemoteEngine(tiny_server.url) as engine:
            for index in range(2):
                trajs = await wf.arun_episode(engine, {"index": index})
                assert [t.status for t in trajs] == [TrajectoryStatus.OK], [t.error for t in trajs]
                text = wf.renderer.decode(trajs[0].input_ids)
                a, b, c = map(int, text.split("What is ")[1].split("?")[0].split("+"))
                (start, end), = sampled_spans(trajs[0].loss_mask)
                reply = wf.renderer.decode(trajs[0].input_ids[start:end], skip_special_tokens=True)
                assert trajs[0].reward == float(f"\\boxed{{{a + b + c}}}" in reply)
    finally:
        await wf.aclose()


@pytest.mark.slow
def test_a_short_train_on_a_verifiers_taskset(openenv_sum_server, tmp_path):
    import json

    url, _ = openenv_sum_server
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"index": i}) + "\n" for i in range(4)))
    taskset = {"id": "openenv", "base_url": url, "resets": [{"seed": s} for s in range(4)]}
    short_train(tmp_path / "run", {
        "workflow": "workflows.verifiers_harness:VerifiersWorkflow",
        "workflow_args": {"taskset": "verifiers:openenv", "env_config": {"taskset": taskset},
                          "context_length": 1024, "timeout_s": 240},
        "dataset": str(tmp_path / "rows.jsonl"), "group_size": 2, "batch_size": 1,
        "max_concurrent": 2})  # every verifiers episode starts its harness program: a few at a time
    trained = recorded_trajectories(tmp_path / "run")
    assert len(trained) >= 2 * 1 * 2 and all(t["status"] == "ok" for t in trained)  # steps x prompts x samples
    assert {t["reward"] for t in trained} <= {0.0, 1.0}  # the taskset rubric's reward reached the trainer
