"""The README's environment example is real code: it runs and passes Gymnasium's check_env."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium
from gymnasium.utils.env_checker import check_env

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_env_module() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    return next(b for b in blocks if "class EchoEnv(TextEnv)" in b)


def test_readme_environment_example_runs_and_passes_check_env():
    namespace: dict = {}
    try:
        exec(compile(readme_env_module(), "README.md", "exec"), namespace)
        env = gymnasium.make("echo/Echo-v0")
        obs, _ = env.reset(seed=1)
        word = obs[0]["content"].removeprefix("Say ").rstrip(".")
        _, reward, terminated, truncated, info = env.step(word)
        assert (reward, terminated, truncated, info["rewards"]) == (1.0, True, False, {"correct": 1.0})
        _, _ = env.reset(seed=1)
        assert env.step("banana")[1] == 0.0
        check_env(env.unwrapped)
        env.close()
    finally:
        gymnasium.registry.pop("echo/Echo-v0", None)


def test_readme_environment_written_outside_the_repo_passes_agentrl_envs_check(tmp_path):
    """Issue 31: the README's env, saved as the README says in a directory of its own, passes
    ``agentrl envs check`` by its ``module:id`` name and is listed by ``agentrl envs --import``
    (before, the check knew only agentrl/* ids and failed the README's own docstring)."""
    (tmp_path / "echo_env.py").write_text(readme_env_module())
    agentrl = str(Path(sys.executable).parent / "agentrl")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    check = subprocess.run([agentrl, "envs", "check", "echo_env:echo/Echo-v0"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0 and "echo/Echo-v0: ok" in check.stdout, check.stdout + check.stderr
    listed = subprocess.run([agentrl, "envs", "--import", "echo_env"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0 and re.search(r"^echo/Echo-v0 +Repeat the word\.$", listed.stdout, re.M), listed
    assert "CartPole" not in listed.stdout  # Gymnasium's own are not listed
    missing = subprocess.run([agentrl, "envs", "check", "nowhere:echo/Echo-v0"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2 and "module 'nowhere' not found" in missing.stderr
    assert "run from the directory that holds it, or add that directory to PYTHONPATH" in missing.stderr  # what to do
    assert "Traceback" not in missing.stderr


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


def test_the_readme_answers_what_a_newcomer_had_to_find_in_the_code():
    """Issue 31's documentation findings, each answered where a newcomer reads: training on
    agents' episodes (rollout.source gateway, a YAML for ExternalAgentWorkflow), the model name an
    agent sends, how pass@1 decides success, and what the tiny model can and cannot do."""
    text = README.read_text()
    sections = re.split(r"\n## ", text)
    agents = next(s for s in sections if s.startswith("Train on agents' episodes"))
    assert "rollout.source" in agents and "gateway" in agents and "ExternalAgentWorkflow" in text
    assert "The model name an agent sends is free" in text
    assert "How evaluation decides success" in text and "pass@1" in text
    tiny = README.parent / "docs" / "tiny_model.md"
    assert "[docs/tiny_model.md](docs/tiny_model.md)" in text and tiny.is_file()
    assert "## What the model can do" in tiny.read_text() and "does not" in tiny.read_text()
