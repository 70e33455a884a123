"""The README's code is real code: its task runs and passes Gymnasium's check_env and ours, and the
guides' code runs too. The README's task also trains, from a directory of its own, in
``tests/test_journey.py`` (which takes the README's ``my_task.py`` and ``my_task.yaml`` from here)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium
from gymnasium.utils.env_checker import check_env

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDES = ROOT / "docs" / "guides"


def code_block(path: Path, language: str, marker: str) -> str:
    """The ``language`` code block of ``path`` that contains ``marker``."""
    blocks = re.findall(rf"```{language}\n(.*?)```", path.read_text(), re.DOTALL)
    return next(b for b in blocks if marker in b)


def readme_env_module() -> str:
    """The README's ``my_task.py``: the env, its registration and its rows."""
    return code_block(README, "python", "class AddEnv(TextEnv)")


def readme_run_config() -> str:
    """The README's ``my_task.yaml``."""
    return code_block(README, "yaml", "# my_task.yaml")


def test_readme_environment_example_runs_and_passes_check_env():
    namespace: dict = {}
    try:
        exec(compile(readme_env_module(), "README.md", "exec"), namespace)
        env = gymnasium.make("mine/Add-v0")
        obs, _ = env.reset(seed=1)
        a, b = (int(x) for x in re.fullmatch(r"What is (\d+)\+(\d+)\?", obs[0]["content"]).groups())
        _, reward, terminated, truncated, info = env.step(f"\\boxed{{{a + b}}}")
        assert (reward, terminated, truncated, info["rewards"]) == (1.0, True, False, {"correct": 1.0})
        _, _ = env.reset(seed=1)
        assert env.step("banana")[1] == 0.0
        row = namespace["rows"](0)[0]
        obs, _ = env.reset(options={"task": row})
        assert obs[0]["content"] == f"What is {row['a']}+{row['b']}?"
        check_env(env.unwrapped)
        env.close()
    finally:
        gymnasium.registry.pop("mine/Add-v0", None)


def test_readme_environment_written_outside_the_repo_passes_agentrl_envs_check(tmp_path):
    """Issue 31: the README's env, saved as the README says in a directory of its own, passes
    ``agentrl envs check`` by its ``module:id`` name and is listed by ``agentrl envs --import``
    (before, the check knew only agentrl/* ids and failed the README's own docstring)."""
    (tmp_path / "my_task.py").write_text(readme_env_module())
    agentrl = str(Path(sys.executable).parent / "agentrl")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    check = subprocess.run([agentrl, "envs", "check", "my_task:mine/Add-v0"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0 and "mine/Add-v0: ok" in check.stdout, check.stdout + check.stderr
    assert "ADVICE" not in check.stdout  # the README's env has every Gymnasium section
    listed = subprocess.run([agentrl, "envs", "--import", "my_task"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0 and re.search(r"^mine/Add-v0 +Add two numbers\.$", listed.stdout, re.M), listed
    assert "CartPole" not in listed.stdout  # Gymnasium's own are not listed
    missing = subprocess.run([agentrl, "envs", "check", "nowhere:mine/Add-v0"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2 and "module 'nowhere' not found" in missing.stderr
    assert "run from the directory that holds it, or add that directory to PYTHONPATH" in missing.stderr  # what to do
    assert "Traceback" not in missing.stderr


async def test_the_workflow_guides_example_plays_an_episode(tiny_server, tiny_model_dir):
    """docs/guides/workflows.md's one-file workflow, against a real agentrl serve on the tiny model."""
    from agentrl.api import TrajectoryStatus
    from agentrl.client.remote_engine import RemoteEngine

    example = code_block(GUIDES / "workflows.md", "python", "class ArithChatWorkflow")
    namespace: dict = {}
    exec(compile(example, "docs/guides/workflows.md", "exec"), namespace)
    workflow = namespace["ArithChatWorkflow"](tiny_model_dir)
    async with RemoteEngine(tiny_server.url) as engine:
        [t] = await workflow.arun_episode(engine, {"question": "What is 12+30+5?", "answer": "47"})
        [bad] = await workflow.arun_episode(engine, {"question": "What is 1+1?"})  # no answer: failed data
    assert t.status is TrajectoryStatus.OK and t.reward in (0.0, 1.0) and 0 < t.num_sampled <= 16
    assert bad.status is TrajectoryStatus.ENV_ERROR and "answer" in bad.error


def test_the_readme_answers_what_a_newcomer_had_to_find_in_the_code():
    """Issue 31's documentation findings, each answered where a newcomer reads — the README or a
    guide it links: training on agents' episodes (rollout.source gateway, a YAML for
    ExternalAgentWorkflow), the model name an agent sends, how pass@1 decides success, and what
    the tiny model can and cannot do."""
    text = README.read_text()
    linked = re.findall(r"\]\((docs/guides/[\w.-]+\.md)\)", text)
    assert linked and all((ROOT / g).is_file() for g in linked), linked
    guides = {Path(g).name: (ROOT / g).read_text() for g in linked}
    agents = next(s for s in re.split(r"\n## ", guides["external_agents.md"]) if s.startswith("Train on agents' episodes"))
    assert "rollout.source" in agents and "gateway" in agents and "ExternalAgentWorkflow" in agents
    assert "The model name an agent sends is free" in guides["external_agents.md"]
    assert "How evaluation decides success" in guides["command_line.md"] and "pass@1" in guides["command_line.md"]
    tiny = README.parent / "docs" / "tiny_model.md"
    assert "[docs/tiny_model.md](docs/tiny_model.md)" in text and tiny.is_file()
    assert "## What the model can do" in tiny.read_text() and "does not" in tiny.read_text()


def test_every_guide_is_linked_from_the_readme_and_every_link_resolves():
    """The README is the way in: each guide under docs/guides/ has its line there, and no link of
    the README, the results or a page under docs/ points at a file that is not there."""
    text = README.read_text()
    unlinked = [g.name for g in sorted(GUIDES.glob("*.md")) if f"(docs/guides/{g.name})" not in text]
    assert unlinked == [], f"guides the README does not link (add a line under '## Guides'): {unlinked}"
    for page in [README, ROOT / "benchmarks" / "RESULTS.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to {target}, which is not there"
