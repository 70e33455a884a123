"""`agentrl train` with the researcher's choices of docs/guides/algorithms.md at once: an
objective of the user's own module, the engine–trainer mismatch correction, RLOO advantages,
DAPO's overlong penalty and Dr. GRPO's aggregation (the pure functions: tests/trainer/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AGENTRL = Path(sys.executable).parent / "agentrl"

USER_LOSS = '''
    """A researcher's objective in one file: clipped PPO on π_prox, weighted by the mismatch correction."""
    import torch


    def clipped_pg(inputs, config):
        ratio = torch.exp((inputs.logprobs - inputs.proximal_logprobs) * inputs.loss_mask)
        w = inputs.behaviour_weights if inputs.behaviour_weights is not None else inputs.loss_mask
        adv = inputs.advantages
        per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - config.eps_low, 1 + config.eps_high) * adv)
        loss = (per_token * w * inputs.token_weights).sum()
        share = inputs.loss_mask.sum() / inputs.total_loss_tokens
        return loss, {"user_loss_tokens": share, "user_ratio_max": (ratio * inputs.loss_mask).max()}
'''


def test_a_user_objective_with_mismatch_correction_trains(tmp_path):
    (tmp_path / "lab_objectives.py").write_text(textwrap.dedent(USER_LOSS))
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [str(AGENTRL), "train", "examples/arith_grpo.yaml", f"run_dir={run_dir}", "steps=2", "eval.dataset=null",
         "rollout.batch_size=2", "rollout.group_size=4", "max_minutes=null", "checkpoint.every_steps=0",
         "logging.trajectories_per_step=0", "logging.tensorboard=false", "trainer.num_mini_batches=2",
         "trainer.loss.kind=lab_objectives:clipped_pg", "trainer.loss.aggregation=seq-mean-token-sum",
         "trainer.loss.mismatch.mode=mis", "trainer.loss.mismatch.upper=1.5", "trainer.loss.mismatch.lower=0.5",
         "trainer.advantages.kind=rloo", "trainer.advantages.overlong_max_tokens=8",
         "trainer.advantages.overlong_buffer_tokens=4"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        # the user's function ran on every loss token (its diagnostic sums to 1 over the micro-batches)
        assert abs(r["train/user_loss_tokens"] - 1.0) < 1e-6 and r["train/user_ratio_max"] > 0
        # the correction compared the engine's log-probabilities with the trainer's: on CPU the same
        # kernels at the same version, so a tiny gap (a stale token adds the policy's step on top)
        assert 0 <= r["train/mismatch/masked_frac"] < 0.5 and r["train/mismatch/log_ratio_abs_mean"] < 0.1
        assert r["train/mismatch/weight_std"] >= 0 and r["train/mismatch/weight_max"] <= 1.5
        # apart from staleness: the tokens the step's own weights sampled (all of step 1's, maybe none of step 2's)
        assert 0 <= r["train/mismatch/fresh_frac"] <= 1
        assert r["train/mismatch/fresh_frac"] == 0 or r["train/mismatch/fresh_log_ratio_abs_mean"] < 0.1
        assert r["train/optimizer_steps"] == 2 * r["step"]  # two mini-batches a step
        # the untrained model runs to max_new_tokens (12), past overlong_max_tokens (8): penalised
        if r["rollout/response_tokens_mean"] > 8:
            assert r["batch/adv/overlong_frac"] > 0 and r["batch/adv/overlong_penalty_mean"] < 0
    assert steps[0]["train/mismatch/fresh_frac"] == 1.0  # step 1 trains on version 0's samples only


def test_a_critic_trains_beside_the_actor_and_resumes_with_it(tmp_path):
    """advantages.kind gae: the value model trains each step, is checkpointed beside the actor, and
    --resume restores it with its optimizer (its step counter goes on; the exact restore of its
    weights and AdamW moments: tests/trainer/test_critic.py)."""
    run_dir = tmp_path / "run"
    common = ["eval.dataset=null", "rollout.batch_size=2", "rollout.group_size=2", "max_minutes=null",
              "logging.trajectories_per_step=0", "logging.tensorboard=false", "checkpoint.every_steps=1"]
    first = subprocess.run(
        [str(AGENTRL), "train", "examples/arith_grpo.yaml", f"run_dir={run_dir}", "steps=1", *common,
         "trainer.advantages.kind=gae", "trainer.advantages.lam=0.95", "trainer.critic.lr=1e-4"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert json.loads((run_dir / "checkpoints" / "step_000001" / "critic" / "meta.json").read_text())["optimizer_steps"] == 1
    resumed = subprocess.run([str(AGENTRL), "train", "--resume", str(run_dir), "steps=2"],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resumed from step_000001" in resumed.stdout
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["train/critic/optimizer_steps"] == r["step"]  # step 2's counter went on from the checkpoint's
        assert r["train/critic/value_loss"] >= 0 and 0 <= r["train/critic/value_clip_frac"] <= 1
        assert r["train/critic/lr"] == 1e-4 and r["perf/critic_update_s"] > 0
        assert r["train/optimizer_steps"] == r["step"]
