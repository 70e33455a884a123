"""Asynchronous vs synchronous RL: trained trajectories per second with η = 4 over η = 0.

The workload is agentic: ``bench/SlowTool-v0`` (``benchmarks/slow_tool_env.py``) episodes make
3 tool calls each, every call waiting a log-normal time (mean 1.0 s, median 0.88 s, p95 ~2 s)
— the case where generation and training should overlap. Both runs are the real thing:
``agentrl train`` (launcher, ``agentrl serve``, torchrun, the rollout executor, weight
publishing every step) on the tiny model with the same config except
``trainer.max_staleness`` (η). With η = 0 the executor admits one batch and waits for the
trainer (synchronous RL, same code); with η = 4 up to 5 batches run ahead of it.

Both run ``placement: decoupled`` (generation and training at once, as AReaL lays them out);
a third run, η = 4 with ``placement: colocated`` (generation paused for each train step, each
phase with every core), is measured beside them.

Measured per run, from its ``metrics.jsonl``: trained trajectories per second over steps
2..N (the first step's start-up excluded), the mean fraction of each step's wall time the
trainer waited for data, and the mean fraction the generator had no episode running.

Last line: one JSON object with ``"ratio"`` (decoupled η = 4 over η = 0) and
``"ratio_colocated"`` (colocated η = 4 over decoupled η = 0). Usage::

    .venv/bin/python benchmarks/async_rl.py [--steps 8] [--batch-size 4] [--group-size 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(eta: int, args: argparse.Namespace, out: Path, placement: str = "decoupled") -> dict:
    run_dir = out / f"eta{eta}-{placement}"
    overrides = [
        f"run_dir={run_dir}", f"steps={args.steps}", "max_minutes=null", f"trainer.max_staleness={eta}",
        f"placement={placement}",
        "rollout.dataset=slow_tool_env:rows", "rollout.workflow_args.env_id=bench/SlowTool-v0",
        f"rollout.batch_size={args.batch_size}", f"rollout.group_size={args.group_size}",
        "rollout.sampling.max_new_tokens=12", "rollout.max_concurrent=1024", "eval.dataset=null",
        "checkpoint.every_steps=0", "logging.trajectories_per_step=0", "logging.tensorboard=false",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "benchmarks"),
                                                                     os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([str(Path(sys.executable).parent / "agentrl"), "train", "examples/arith_grpo.yaml",
                           *overrides], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        sys.exit(f"the η={eta} {placement} run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "perf/step_s" in r]
    timed = steps[1:]
    seconds = sum(r["perf/step_s"] for r in timed)
    trajectories = sum(r["rollout/trajectories"] for r in timed)
    return {
        "eta": eta, "placement": placement, "steps": len(steps), "trajectories_per_s": trajectories / seconds, "seconds": seconds,
        "trainer_idle_fraction": sum(r["perf/trainer_idle_fraction"] for r in timed) / len(timed),
        "generator_idle_fraction": sum(r["perf/generator_idle_fraction"] for r in timed) / len(timed),
        "staleness_max": max(r["batch/staleness_max"] for r in timed),
        "train_s_mean": sum(r["perf/train_s"] for r in timed) / len(timed),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=4, help="groups per step")
    p.add_argument("--group-size", type=int, default=4)
    args = p.parse_args()
    if args.steps < 2:
        sys.exit("--steps must be >= 2 (the first step is not timed)")
    with tempfile.TemporaryDirectory(prefix="async-rl-") as tmp:
        sync = run(0, args, Path(tmp))
        print(json.dumps(sync), flush=True)
        asyn = run(4, args, Path(tmp))
        print(json.dumps(asyn), flush=True)
        colocated = run(4, args, Path(tmp), "colocated")
        print(json.dumps(colocated), flush=True)
    print(json.dumps({
        "workload": "bench/SlowTool-v0: 3 tool calls per episode, log-normal latency mean 1.0 s",
        "episodes_per_step": args.batch_size * args.group_size, "steps": args.steps,
        "eta0_trajectories_per_s": round(sync["trajectories_per_s"], 3),
        "eta4_trajectories_per_s": round(asyn["trajectories_per_s"], 3),
        "eta0_trainer_idle": round(sync["trainer_idle_fraction"], 3),
        "eta4_trainer_idle": round(asyn["trainer_idle_fraction"], 3),
        "eta0_generator_idle": round(sync["generator_idle_fraction"], 3),
        "eta4_generator_idle": round(asyn["generator_idle_fraction"], 3),
        "eta4_staleness_max": asyn["staleness_max"],
        "colocated_eta4_trajectories_per_s": round(colocated["trajectories_per_s"], 3),
        "ratio": round(asyn["trajectories_per_s"] / sync["trajectories_per_s"], 3),
        "ratio_colocated": round(colocated["trajectories_per_s"] / sync["trajectories_per_s"], 3),
    }))


if __name__ == "__main__":
    main()
