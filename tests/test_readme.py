"""The README's environment example is real code: it runs and passes Gymnasium's check_env."""

from __future__ import annotations

import re
from pathlib import Path

import gymnasium
from gymnasium.utils.env_checker import check_env

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_environment_example_runs_and_passes_check_env():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    example = next(b for b in blocks if "class EchoEnv(TextEnv)" in b)
    namespace: dict = {}
    try:
        exec(compile(example, "README.md", "exec"), namespace)
        env = gymnasium.make("agentrl/Echo-v0")
        obs, _ = env.reset(seed=1)
        word = obs[0]["content"].removeprefix("Say ").rstrip(".")
        _, reward, terminated, truncated, info = env.step(word)
        assert (reward, terminated, truncated, info["rewards"]) == (1.0, True, False, {"correct": 1.0})
        _, _ = env.reset(seed=1)
        assert env.step("banana")[1] == 0.0
        check_env(env.unwrapped)
        env.close()
    finally:
        gymnasium.registry.pop("agentrl/Echo-v0", None)


async def test_readme_workflow_example_plays_an_episode(tiny_server, tiny_model_dir):
    """The README's one-file workflow, against a real agentrl serve on the tiny model."""
    from agentrl.api import TrajectoryStatus
    from agentrl.client.remote_engine import RemoteEngine

    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    example = next(b for b in blocks if "class ArithChatWorkflow" in b)
    namespace: dict = {}
    exec(compile(example, "README.md", "exec"), namespace)
    workflow = namespace["ArithChatWorkflow"](tiny_model_dir)
    async with RemoteEngine(tiny_server.url) as engine:
        [t] = await workflow.arun_episode(engine, {"question": "What is 12+30+5?", "answer": "47"})
        [bad] = await workflow.arun_episode(engine, {"question": "What is 1+1?"})  # no answer: failed data
    assert t.status is TrajectoryStatus.OK and t.reward in (0.0, 1.0) and 0 < t.num_sampled <= 16
    assert bad.status is TrajectoryStatus.ENV_ERROR and "answer" in bad.error
