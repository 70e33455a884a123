"""What deterministic mode costs: the demo's training run with ``deterministic: true`` against the default.

The demo's config (``examples/arith_grpo.yaml``: 16 prompts x 16 samples, η = 2, one server
and one trainer rank of one thread each) for ``--steps`` steps, without evaluation, run in
turns: default, deterministic, default, ... (``--reps`` each, so drift in the machine's load
falls on both). A run's step time is the median of its ``perf/step_s`` after the first two
steps (start-up). Last line: one JSON object with ``default_step_s``, ``deterministic_step_s``
(medians over the reps) and ``ratio_step_time`` (deterministic / default; above 1: slower).

    .venv/bin/python benchmarks/deterministic.py [--steps 20] [--reps 2] [-- key=value ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AGENTRL = Path(sys.executable).parent / "agentrl"


def step_time(run_dir: Path, steps: int, extra: list[str]) -> float:
    cmd = [str(AGENTRL), "train", "examples/arith_grpo.yaml", f"run_dir={run_dir}", f"steps={steps}",
           "eval.dataset=null", "max_minutes=null", "checkpoint.every_steps=0", "logging.tensorboard=false", *extra]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    times = [r["perf/step_s"] for r in rows if "perf/step_s" in r][2:]
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("overrides", nargs="*", help="more key=value for both runs")
    args = parser.parse_args()
    results: dict[str, list[float]] = {"default": [], "deterministic": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for mode, extra in (("default", []), ("deterministic", ["deterministic=true"])):
                s = step_time(Path(tmp) / f"{mode}-{rep}", args.steps, [*extra, *args.overrides])
                results[mode].append(s)
                print(f"{mode} rep {rep}: median step {s:.3f} s", file=sys.stderr, flush=True)
    default, deterministic = statistics.median(results["default"]), statistics.median(results["deterministic"])
    print(json.dumps({"steps": args.steps, "reps": args.reps, "default_step_s": round(default, 4),
                      "deterministic_step_s": round(deterministic, 4),
                      "ratio_step_time": round(deterministic / default, 3),
                      "runs": {k: [round(v, 4) for v in vs] for k, vs in results.items()}}))


if __name__ == "__main__":
    main()
