"""`agentrl train examples/distill_arith.yaml`, on-policy distillation from a teacher server
(trainer.distill), in its loss mode: the shared tiny ``agentrl serve`` is the teacher, the run's own
server the student (the same weights at step 1). The math: tests/trainer/test_distill.py; the teacher's request: tests/rollout/test_teacher.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AGENTRL = Path(sys.executable).parent / "agentrl"


def test_a_run_distills_from_a_teacher_server(tiny_server, tmp_path):
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [str(AGENTRL), "train", "examples/distill_arith.yaml", f"run_dir={run_dir}", "steps=2", "eval.dataset=null",
         "rollout.batch_size=2", "rollout.group_size=4", "max_minutes=null", "logging.trajectories_per_step=0",
         "logging.tensorboard=false", "logging.record=true", f"trainer.distill.teacher.url={tiny_server.url}",
         "trainer.distill.mode=loss"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    # step 1: the student's weights are the teacher's, so the engine's and the teacher's log-probabilities agree
    assert abs(steps[0]["batch/distill_reverse_kl"]) < 1e-3
    assert abs(steps[0]["train/distill/reverse_kl"]) < 1e-3
    assert all(r["teacher/failed"] == 0 and r["teacher/scored"] >= 8 * r["step"] for r in steps)
    # the teacher's row is recorded with each trained trajectory
    recorded = [json.loads(line) for line in (run_dir / "record" / "step_000001.jsonl").read_text().splitlines()]
    assert recorded and all(len(t["teacher_logprobs"]) == len(t["input_ids"]) for t in recorded)
