"""`agentrl train` with `inference.engine=vllm`: the launcher starts vLLM (from `make vllm`),
the loop generates, publishes each version from disk and evaluates through it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.run.local_launcher import vllm_python

from .conftest import vllm_run_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("transport", ["disk", "distributed"])
def test_a_short_run_on_vllm(transport, tiny_model_dir, tmp_path):
    """Each version goes to vLLM from disk (a checkpoint directory per version), or by broadcast
    over a gloo group of the trainer's rank 0 and vLLM's worker (agentrl's worker extension)."""
    if vllm_python(vllm_run_config(tiny_model_dir)) is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set but vLLM is not installed; `make test` runs `make vllm` first")
        pytest.skip("vLLM is not installed here; run `make vllm`")
    run_dir = tmp_path / "run"
    out = subprocess.run([str(Path(sys.executable).parent / "agentrl"), "train", "examples/arith_grpo.yaml",
                          f"run_dir={run_dir}", "inference.engine=vllm", "steps=3", "eval.limit=40",
                          "rollout.batch_size=4", "rollout.group_size=4", "max_minutes=null",
                          "checkpoint.every_steps=0", "logging.tensorboard=false",
                          f"trainer.weight_sync.transport={transport}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "inference server 0 ready at" in out.stdout and "(vllm)" in out.stdout
    formed = "weight group 'agentrl_weights' formed: trainer rank 0 and 1 server rank(s) on 1 server(s), gloo"
    assert (formed in out.stdout + out.stderr) == (transport == "distributed")
    assert (run_dir / "weights").is_dir() == (transport == "disk")  # a broadcast writes no checkpoint
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 3 and summary["counters"]["episodes_failed"] == 0
    assert summary["eval_before"] is not None and summary["eval_after"] is not None
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["perf/weight_pause_s"] > 0 for r in steps)  # each version went to vLLM
    assert max(r["batch/staleness_max"] for r in steps) >= 1  # trained on tokens of older versions, tagged by vLLM
