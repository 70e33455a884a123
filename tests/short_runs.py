"""A short ``agentrl train`` of the tiny model, from a config the test writes: what the tests of
other ecosystems' envs and workflows share (each trains two steps through the real CLI)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from agentrl.rollout.recorded import read_rows, recorded_steps

ROOT = Path(__file__).resolve().parents[1]
AGENTRL = str(Path(sys.executable).parent / "agentrl")


def short_train(run_dir: Path, rollout: dict[str, Any], *, steps: int = 2, **keys: Any) -> dict[str, Any]:
    """Train ``steps`` steps of the tiny model, one server and one rank of one thread each, no
    checkpoints or TensorBoard, with ``rollout`` and any other top-level ``keys`` (``eval=…``) of
    the run config; the config is written beside ``run_dir``. Checks that the run ended well with
    no failed episode and returns its summary (the last line printed)."""
    config = {
        "model": str(ROOT / "examples" / "tiny-model"), "run_dir": str(run_dir), "steps": steps,
        "max_minutes": None, "world_size": 1, "threads": 1, "inference": {"num_servers": 1, "threads": 1},
        "rollout": rollout, "checkpoint": {"every_steps": 0},
        "logging": {"tensorboard": False, "trajectories_per_step": 2}, **keys,
    }
    path = run_dir.with_name(run_dir.name + ".yaml")
    path.write_text(json.dumps(config))
    out = subprocess.run([AGENTRL, "train", str(path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == steps and summary["counters"]["episodes_failed"] == 0, summary
    return summary



def recorded_trajectories(run_dir: Path) -> list[dict[str, Any]]:
    """Every trajectory the run recorded (``RUN_DIR/record/step_N.jsonl``, in step order), as dicts."""
    return [row for path in recorded_steps(run_dir) for row in read_rows(path)]
