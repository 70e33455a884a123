"""`rollout.source=RUN_DIR/record`: a run trains off-policy on another run's recorded steps (their
tokens, behaviour logprobs and versions as recorded), so loss variants compare on identical data —
and the recorded run's own config reproduces its losses (on the shared short run, tests/conftest.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.run.run_config import RunConfig, check_run_config

ROOT = Path(__file__).resolve().parents[2]
AGENTRL = Path(sys.executable).parent / "agentrl"
SMALL = ["eval.dataset=null", "rollout.batch_size=4", "rollout.group_size=4", "max_minutes=null",
         "checkpoint.every_steps=0", "logging.trajectories_per_step=0", "logging.tensorboard=false"]


def train_steps(run_dir: Path, *args: str) -> list[dict]:
    out = subprocess.run([str(AGENTRL), "train", "examples/arith_grpo.yaml", f"run_dir={run_dir}", *SMALL, *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "nothing generated" in out.stdout
    return steps(run_dir)


def steps(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "train/loss" in r]


DATA = ("rollout/reward_mean", "rollout/response_tokens_mean", "batch/staleness_max", "batch/num_kept")


def test_the_recorded_steps_train_as_they_did(trained_run, tmp_path):
    """The recorded run's own trainer config on its record gives its losses and gradient norms
    step by step: the batches, their tokens, behaviour logprobs and versions are the recorded
    ones (a loss variant, ``trainer.loss.*=...``, then trains on exactly these batches)."""
    run_dir, _ = trained_run
    recorded = steps(run_dir)
    same = train_steps(tmp_path / "same", f"rollout.source={run_dir / 'record'}", "steps=3")
    shown = [(r["train/loss"], r["train/grad_norm"]) for r in (*recorded, *same)]
    for a, b in zip(recorded, same, strict=True):
        assert [a[k] for k in DATA] == [b[k] for k in DATA], shown  # the same batches
        assert b["train/loss"] == pytest.approx(a["train/loss"], abs=1e-6), shown
        assert b["train/grad_norm"] == pytest.approx(a["train/grad_norm"], rel=1e-6), shown
        assert b["train/behaviour_weight_mean"] == pytest.approx(a["train/behaviour_weight_mean"], abs=1e-6)
    assert max(r["batch/staleness_max"] for r in same) == 2  # versions as recorded: η = 2's ages


def test_a_record_that_cannot_be_this_runs_batches_is_refused(trained_run, tmp_path):
    run_dir, _ = trained_run

    def check(*overrides: str) -> None:
        cfg = load_config(RunConfig, ROOT / "examples/arith_grpo.yaml",
                          [f"run_dir={tmp_path / 'new'}", *SMALL, *overrides])
        check_run_config(cfg)

    check(f"rollout.source={run_dir}", "steps=3")
    with pytest.raises(ConfigError, match="config key 'steps': 4 steps, but .* holds 3 recorded steps"):
        check(f"rollout.source={run_dir}", "steps=4")
    with pytest.raises(ConfigError, match="config key 'rollout.batch_size': 2 groups a step, but .* holds 4"):
        check(f"rollout.source={run_dir}", "steps=3", "rollout.batch_size=2")
    with pytest.raises(ConfigError, match="'rollout.source': 'workflw' is not workflow or gateway, and as a path"):
        check("rollout.source=workflw")
    with pytest.raises(ConfigError, match="holds no recorded steps"):
        check(f"rollout.source={tmp_path}")
