"""A newcomer's task, end to end through the command line alone (issue 31, "Done when").

A user writes a task in a directory of their own — nothing of it in the agentrl repository, no
PYTHONPATH — as the README says: one module that subclasses ``TextEnv``, registers its id with
``gymnasium.register`` at import, and gives a dataset function; and a YAML that names them by
``module:ns/Name-vN`` and ``module:function``. Then, from that directory, as subprocesses of the
``agentrl`` console script: ``agentrl envs check``, ``agentrl train`` (two tiny steps on the
committed tiny model) and ``agentrl eval``. The module and the YAML are the README's own
(``my_task.py``, ``my_task.yaml``), so the README's path to "my own task trains" is this test.
Before issue 31 the check answered ``no environment 'journey/Guess-v0'`` and the run ``module
'guess' not found``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .test_readme import readme_env_module, readme_run_config

ROOT = Path(__file__).resolve().parents[1]
AGENTRL = str(Path(sys.executable).parent / "agentrl")

QUICK = ["steps=2", "rollout.group_size=4", "rollout.batch_size=2", "eval.limit=6", "checkpoint.every_steps=0",
         "logging.tensorboard=false", "logging.trajectories_per_step=2"]
"""The README's run, made short for the suite (its model is given as a path in this checkout)."""


def test_the_readmes_task_written_outside_the_repo_is_checked_trained_and_evaluated_by_the_cli(tmp_path):
    (tmp_path / "my_task.py").write_text(readme_env_module())
    (tmp_path / "my_task.yaml").write_text(readme_run_config())
    model = f"model={ROOT / 'examples' / 'tiny-model'}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as a user's shell: only the directory

    def agentrl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([AGENTRL, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=timeout)

    check = agentrl("envs", "check", "my_task:mine/Add-v0")
    assert check.returncode == 0 and check.stdout.strip().endswith("mine/Add-v0: ok"), \
        check.stdout + check.stderr

    train = agentrl("train", "my_task.yaml", model, *QUICK, timeout=600)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    summary = json.loads(train.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["counters"]["episodes_failed"] == 0, summary
    assert summary["eval_before"] is not None and summary["eval_after"] is not None
    run_dir = tmp_path / "runs" / "my_task"  # relative to the user's directory
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["rollout/trajectories"] == 2 * 4 and r["rollout/failed"] == 0 for r in steps), steps
    sampled = json.loads((run_dir / "trajectories" / "step_000001.jsonl").read_text().splitlines()[0])
    assert "What is " in "".join(sampled["tokens"])  # the user's env spoke, not another

    out = tmp_path / "my-eval"
    evaluated = agentrl("eval", "my_task.yaml", "--out", str(out), "--k", "2", model, *QUICK,
                        "eval.sampling.temperature=1.0")
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    report = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert report["problems"] == 6 and report["failed_episodes"] == 0 and 0.0 <= report["pass@2"] <= 1.0, report
    problems = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert sorted(p["index"] for p in problems) == list(range(6)) and all(p["k"] == 2 for p in problems)
    assert {tuple(sorted(p["row"])) for p in problems} == {("a", "b")}  # the user's rows
