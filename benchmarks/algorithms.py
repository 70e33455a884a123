"""The objectives and advantages of docs/guides/algorithms.md, each trained on an example's recipe.

``--task arith`` (the default): every variant is ``agentrl train examples/arith_grpo.yaml`` (the
committed tiny model on ``agentrl/Arith-v0``, 16 prompts x 16 samples a step). ``--task feedback``,
the multi-turn one: ``agentrl train examples/feedback.yaml`` (``agentrl/ArithRetry-v0``: a wrong sum
gets "Too low. The answer ends in 6." and a second answer, 16 prompts x 8 episodes a step) from its
SFT stage's model (``agentrl sft examples/feedback_sft.yaml``, run once into the runs directory and
shared by every variant and seed). Each variant with the same steps, seed and held-out
evaluation (the example's ``eval`` section: greedy pass@1 — feedback: success at the last answer —
on ``--eval-limit`` problems of ``envs.arith:eval_rows``, before and after, inside the run) and ``--mini-batches`` optimizer
steps per batch (4; the demo takes 1, where π_θ = π_prox at the only update, so no ratio is ever
clipped and cispo's gradient is decoupled PPO's), changed only by its overrides:

    decoupled_ppo   the demo as it is (the baseline)
    gspo            loss.kind=gspo, seq-mean-token-mean, the paper's clip 3e-4 / 4e-4
    cispo           loss.kind=cispo, no lower clip (eps_low 0.99), eps_high 0.28
    dr_grpo         advantages.std_normalize=false, loss.aggregation=seq-mean-token-sum
    rloo            advantages.kind=rloo
    reinforce_pp    advantages.kind=reinforce_pp
    tis             loss.mismatch.mode=tis (token level, C = 2)
    gae             advantages.kind=gae, λ 0.95, batch-normalized: a value model trained beside the
                    policy (its learning rate 2e-5)
    turn            (feedback only) advantages.kind=turn with EnvWorkflow's turn_states (GiGPO's
                    step groups); on one-turn episodes it is group_norm, so arith leaves it out

Runs go one after another (never two at once), each with ``--seeds`` seeds (0 .. N-1). Per
variant: the held-out gain (after - before, points of pass@1; mean over seeds and each seed's),
steps per minute of training time (the sum of ``perf/step_s``), the mean share of clipped
tokens (``train/clip_frac``), of tokens masked by the behaviour-weight cap or the mismatch
correction, and the behaviour–trainer gap: mean |log π_prox/π_behav| over all loss tokens (policy
lag included) and over the fresh ones alone (the engine–trainer mismatch). A markdown table goes
to stderr; the last line is one JSON object with every variant's figures and ``ratio_gain`` and
``ratio_steps_per_min`` against the baseline measured in the same invocation. Two seeds move a
tiny model's held-out figure by a few points: read a difference smaller than the spread of the
seeds as none.

    .venv/bin/python benchmarks/algorithms.py [--task arith|feedback] [--steps 80] [--mini-batches 4] [--seeds 2]
                                              [--eval-limit 1000] [--only gspo,rloo] [--runs-dir DIR]
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
TASKS: dict[str, tuple[str, str | None]] = {
    "arith": ("examples/arith_grpo.yaml", None),
    "feedback": ("examples/feedback.yaml", "examples/feedback_sft.yaml"),
}
"""--task: (the RL config, the SFT stage whose model it starts from, if any)."""

VARIANTS: dict[str, list[str]] = {
    "decoupled_ppo": [],
    "gspo": ["trainer.loss.kind=gspo", "trainer.loss.aggregation=seq-mean-token-mean",
             "trainer.loss.eps_low=3e-4", "trainer.loss.eps_high=4e-4"],
    "cispo": ["trainer.loss.kind=cispo", "trainer.loss.eps_low=0.99", "trainer.loss.eps_high=0.28"],
    "dr_grpo": ["trainer.advantages.std_normalize=false", "trainer.loss.aggregation=seq-mean-token-sum"],
    "rloo": ["trainer.advantages.kind=rloo"],
    "reinforce_pp": ["trainer.advantages.kind=reinforce_pp"],
    "tis": ["trainer.loss.mismatch.mode=tis"],
    "gae": ["trainer.advantages.kind=gae", "trainer.advantages.lam=0.95", "trainer.advantages.batch_normalize=true",
            "trainer.critic.lr=2e-5"],
    "turn": ["trainer.advantages.kind=turn", "rollout.workflow_args.turn_states=true"],
}
MULTI_TURN_ONLY = {"turn"}
BASELINE = "decoupled_ppo"


def mean_of(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return statistics.fmean(values) if values else None


def sft_stage(runs_dir: Path, task: str) -> list[str]:
    """The overrides that start a ``task`` run from its SFT stage's model (run once, then reused)."""
    sft = TASKS[task][1]
    if sft is None:
        return []
    run_dir = runs_dir / f"{task}-sft"
    if not (run_dir / "model" / "config.json").is_file():
        if run_dir.exists():
            raise SystemExit(f"{run_dir} holds an unfinished SFT stage; remove it or give another --runs-dir")
        out = subprocess.run([str(AGENTRL), "sft", sft, f"run_dir={run_dir}"], cwd=ROOT, capture_output=True, text=True,
                             timeout=3600)
        if out.returncode != 0:
            raise SystemExit(f"the SFT stage of {task} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return [f"model={run_dir / 'model'}"]


def run_variant(runs_dir: Path, name: str, seed: int, args: argparse.Namespace, start: list[str]) -> dict:
    """Train one variant (or reuse its finished run in ``runs_dir``) and read its figures; ``start``:
    the overrides of the task's starting model."""
    run_dir = runs_dir / f"{args.task}-{name}-seed{seed}"
    if not finished(run_dir, args.steps):
        if run_dir.exists():
            raise SystemExit(f"{run_dir} holds an unfinished run; remove it or give another --runs-dir")
        cmd = [str(AGENTRL), "train", TASKS[args.task][0], *start, f"run_dir={run_dir}", f"seed={seed}",
               f"steps={args.steps}",
               f"trainer.total_steps={args.steps * args.mini_batches}",
               f"trainer.num_mini_batches={args.mini_batches}", "max_minutes=null", "eval.every_steps=0",
               f"eval.limit={args.eval_limit}", "checkpoint.every_steps=0", "logging.tensorboard=false",
               "logging.trajectories_per_step=0", *VARIANTS[name]]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
        if out.returncode != 0:
            raise SystemExit(f"{name} seed {seed} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return read_run(run_dir)


def finished(run_dir: Path, steps: int) -> bool:
    """A run of ``steps`` steps whose evaluation after the last step is in its metrics."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return False
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return any(r.get("step") == steps and "eval/pass@1" in r for r in rows)


def read_run(run_dir: Path) -> dict:
    """The figures of a finished run, from its ``metrics.jsonl``."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in rows if "eval/pass@1" in r]
    before, after = evals[0]["eval/pass@1"], evals[-1]["eval/pass@1"]
    step_s = [r["perf/step_s"] for r in rows if "perf/step_s" in r]
    masked = [(r.get("train/capped_frac", 0.0) or 0.0) + (r.get("train/mismatch/masked_frac", 0.0) or 0.0)
              for r in rows if "train/loss" in r]
    return {
        "gain": 100.0 * (after - before), "eval_before": before, "eval_after": after,
        "steps_per_min": 60.0 * len(step_s) / sum(step_s) if step_s else None,
        "clip_frac": mean_of(rows, "train/clip_frac"),
        "masked_frac": statistics.fmean(masked) if masked else None,
        "approx_kl": mean_of(rows, "train/approx_kl"),
        "gap": mean_of(rows, "train/mismatch/log_ratio_abs_mean"),
        "fresh_gap": mean_of(rows, "train/mismatch/fresh_log_ratio_abs_mean"),
    }


def aggregate(runs: list[dict]) -> dict:
    out: dict = {"per_seed_gain": [round(r["gain"], 2) for r in runs]}
    for key in ("gain", "steps_per_min", "clip_frac", "masked_frac", "approx_kl", "gap", "fresh_gap"):
        values = [r[key] for r in runs if r[key] is not None]
        out[key] = statistics.fmean(values) if values else None
    return out


def table(results: dict[str, dict]) -> str:
    def cell(v, fmt):
        return "–" if v is None else format(v, fmt)

    lines = ["| variant | held-out gain (points) | per seed | steps/min | clipped | masked | behaviour–trainer gap "
             "| on fresh tokens |", "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {cell(r['gain'], '+.1f')} | {', '.join(f'{g:+.1f}' for g in r['per_seed_gain'])} "
                     f"| {cell(r['steps_per_min'], '.1f')} | {cell(r['clip_frac'], '.4f')} "
                     f"| {cell(r['masked_frac'], '.4f')} | {cell(r['gap'], '.2e')} | {cell(r['fresh_gap'], '.1e')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="arith", choices=list(TASKS),
                        help="arith: single-turn (examples/arith_grpo.yaml); feedback: multi-turn (examples/feedback.yaml "
                             "after its SFT stage)")
    parser.add_argument("--steps", type=int, default=80, help="train steps of every run (the demo's 80)")
    parser.add_argument("--mini-batches", type=int, default=4, help="optimizer steps per train step, every variant")
    parser.add_argument("--seeds", type=int, default=2, help="seeds 0 .. N-1 for every variant")
    parser.add_argument("--eval-limit", type=int, default=1000, help="held-out problems evaluated before and after")
    parser.add_argument("--only", default="", help="comma-separated variants (the baseline always runs)")
    parser.add_argument("--runs-dir", default=None, help="keep the runs here (default: a temporary directory); "
                                                         "a finished run found there is read, not run again")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or [
        n for n in VARIANTS if args.task != "arith" or n not in MULTI_TURN_ONLY]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"--only: unknown variant(s) {unknown}; expected among {list(VARIANTS)}")
    names = [BASELINE] + [n for n in names if n != BASELINE]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="agentrl-algorithms-") as tmp:
        runs_dir = Path(args.runs_dir or tmp)
        start = sft_stage(runs_dir, args.task)
        for name in names:
            runs = [run_variant(runs_dir, name, seed, args, start) for seed in range(args.seeds)]
            results[name] = aggregate(runs)
            print(f"{name}: gain {results[name]['gain']:+.1f} points, per seed {results[name]['per_seed_gain']}",
                  file=sys.stderr, flush=True)
    base = results[BASELINE]
    for r in results.values():
        r["ratio_gain"] = r["gain"] / base["gain"] if base["gain"] else None
        r["ratio_steps_per_min"] = (r["steps_per_min"] / base["steps_per_min"]
                                    if r["steps_per_min"] and base["steps_per_min"] else None)
    print(table(results), file=sys.stderr)
    print(json.dumps({"benchmark": "algorithms", "task": args.task, "baseline": BASELINE, "steps": args.steps, "seeds": args.seeds,
                      "mini_batches": args.mini_batches,
                      "eval_limit": args.eval_limit, "variants": results}))


if __name__ == "__main__":
    main()
