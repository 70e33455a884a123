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
