"""The examples run: a task written in one file (`examples/custom_task.py`) trains end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_custom_task_trains_end_to_end(tmp_path):
    out = subprocess.run([sys.executable, "examples/custom_task.py", f"run_dir={tmp_path / 'run'}", "steps=2",
                          "eval.limit=30", "rollout.batch_size=4"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["counters"]["episodes_failed"] == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if r["step"] == 1 and "rollout/reward_mean" in r)
    assert step["rollout/trajectories"] == 4 * 16 and "rollout/success_rate" in step


def test_code_agent_docker_config_runs_on_the_tiny_model(tmp_path, docker_ready):
    """A smoke test of the CodeAgent + Docker config (meant for real code models): the tiny model
    writes no working code, every reward is 0, and the loop still runs a step end to end."""
    agentrl = Path(sys.executable).parent / "agentrl"
    out = subprocess.run([str(agentrl), "train", "examples/code_agent_docker.yaml", f"run_dir={tmp_path / 'run'}",
                          "steps=1", "rollout.batch_size=2", "rollout.group_size=2", "rollout.sampling.max_new_tokens=48",
                          "eval.limit=2", "eval.sampling.max_new_tokens=48", "checkpoint.every_steps=0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 1 and summary["eval_before"] == 0.0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if "rollout/trajectories" in r)
    assert step["step"] == 1 and step["rollout/trajectories"] == 4  # failed episodes (too long a prompt) count too
