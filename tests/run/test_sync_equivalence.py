"""η = 0 is synchronous RL: `agentrl train` with trainer.max_staleness=0 gives, step by step, the
losses, rewards and gradient norms of the synchronous reference loop examples/grpo_arith.py, and the
same weights after the last step (to 1e-6) — the asynchronous machinery (executor, admission,
episode log, records, publishing in the loop) does not change the algorithm.

Both draw the same rows (envs.arith:training_rows in RowSource's order: at η = 0 step s trains on
rows sB..(s+1)B-1) and sample every call with its own seed (agentrl.rollout.seeds), one torch
thread a side, the same trainer settings (lr schedule over the 5 steps). Each side's server decodes one
request at a time (max_running_requests 1): the float sums of a decode step depend on which requests
share it, so with timing deciding that, the behaviour logprobs (and through the PPO weights the
gradients) differed in the 7th digit in some runs and not in others."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AGENTRL = Path(sys.executable).parent / "agentrl"
STEPS, PROMPTS, SAMPLES = 5, 4, 4


def weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_eta_zero_trains_as_the_synchronous_loop(tmp_path):
    sync_dir, async_dir = tmp_path / "sync" / "run", tmp_path / "async" / "run"  # one name: the same group ids
    sync = subprocess.run([sys.executable, str(ROOT / "examples" / "grpo_arith.py"), f"out={sync_dir}",
                           f"steps={STEPS}", f"prompts={PROMPTS}", f"samples={SAMPLES}", "sampling_seed=7",
                           "threads=1", "eval_problems=1", "eval_every=0", "max_running_requests=1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert sync.returncode == 0, sync.stdout[-3000:] + sync.stderr[-3000:]
    out = subprocess.run([str(AGENTRL), "train", "examples/arith_grpo.yaml", f"run_dir={async_dir}",
                          f"steps={STEPS}", f"trainer.total_steps={STEPS}", "trainer.max_staleness=0",
                          f"rollout.batch_size={PROMPTS}", f"rollout.group_size={SAMPLES}",
                          "rollout.sampling.seed=7", "inference.max_running_requests=1", "eval.dataset=null", "max_minutes=null",
                          "checkpoint.every_steps=0", "logging.trajectories_per_step=0",
                          "logging.tensorboard=false"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    ref = [json.loads(line) for line in (sync_dir / "metrics.jsonl").read_text().splitlines()]
    got = [r for r in map(json.loads, (async_dir / "metrics.jsonl").read_text().splitlines()) if "train/loss" in r]
    pairs = [("reward_mean", "rollout/reward_mean"), ("loss", "train/loss"), ("grad_norm", "train/grad_norm"),
             ("entropy", "train/entropy")]
    shown = [[(a[k], b[j]) for k, j in pairs] for a, b in zip(ref, got, strict=True)]
    assert [r["step"] for r in got] == list(range(1, STEPS + 1)), shown
    assert all(b["batch/staleness_max"] == 0 for b in got)
    diffs = {}
    for a, b in zip(ref, got, strict=True):
        for k, j in pairs:
            diffs[k] = max(diffs.get(k, 0.0), abs(a[k] - b[j]))
    w_sync, w_async = weights(sync_dir / "weights" / f"v{STEPS:06d}"), weights(async_dir / "weights" / f"v{STEPS:06d}")
    assert w_sync.keys() == w_async.keys()
    diffs["weights"] = max(float((w_sync[k] - w_async[k]).abs().max()) for k in w_sync)
    print("largest differences:", json.dumps(diffs))
    assert all(d <= 1e-6 for d in diffs.values()), (diffs, shown)
    initial = weights(ROOT / "examples" / "tiny-model")  # and training moved them (not an empty comparison)
    assert max(float((w_sync[k] - initial[k]).abs().max()) for k in w_sync) > 1e-5
