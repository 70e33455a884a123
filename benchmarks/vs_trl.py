"""TRL's ``GRPOTrainer`` (and its experimental ``AsyncGRPOTrainer``) against ``agentrl train
examples/arith_grpo.yaml`` (the demo), on the same recipe, the same cores and the same held-out
evaluator, in one or more of TRL's configurations (``--trl-configs``, comma-separated):

- ``plain``: generation by the trainer's own model (``model.generate``), in ``.venv-trl`` (``make trl``);
- ``vllm-server``: ``use_vllm=True, vllm_mode="server"``: a vLLM server (vLLM's OpenAI server in dev
  mode, as ``trl vllm-serve`` starts it) samples, the trainer pushes its weights after each step;
- ``vllm-colocate``: ``use_vllm=True, vllm_mode="colocate"``: vLLM's ``LLM`` in the trainer's process;
- ``vllm-async``: ``trl.experimental.async_grpo.AsyncGRPOTrainer`` with the same vLLM server: a
  spawned rollout process generates ahead (TRL's defaults: up to 4 steps stale, 1,024 requests in
  flight) while the trainer trains, and the trainer pushes its weights after each step.

The vLLM ones run in ``.venv-trl-vllm`` (``make trl-vllm``: vLLM's CPU build 0.32, TRL 1.16,
transformers < 5.20, the same CPU torch), and on a CPU only with shims kept in this benchmark
(``benchmarks/trl_vllm.py``, never in agentrl), each of them stated there in full:

1. the weight sync goes through a file and vLLM's ``reload_weights`` (TRL's is vLLM's NCCL
   weight-transfer engine, CUDA only; colocate mode's per-tensor ``load_weights`` fails on vLLM's
   CPU GEMM layers);
2. the reload is agentrl's vLLM worker extension's (``agentrl/client/vllm_worker``, unchanged), which
   also rebuilds the CPU kernel of the tied output layer (vLLM's CPU build keeps the embedding it
   loaded with);
3. vLLM serves in float32 (``dtype="auto"`` serves the float32 model in 16 bits on a CPU), eager;
4. the server binds 127.0.0.1 and takes a key on every route (agentrl's key middleware), which TRL's
   client is given.

``vllm-async`` takes 1-4 (its sync through ``weight_transfer=``) and more, stated in full in
``benchmarks/trl_async.py``: the FLOPS lookup off (it asks CUDA), a plain-PyTorch tree attention
for the FA3 kernel (CUDA only), a ``response_template`` for the demo's chat template, the key on the
spawned rollout process's session (TRL's rollout loop subclassed, the key in an environment
variable the child inherits), and the rollout's requests without their per-request seed (vLLM's CPU
build cannot recompute a seeded request the sync's pause preempted).

With GRPOTrainer and vLLM, TRL's importance-sampling correction (its default) scores every sampled
token with the trainer's model after each sync; the largest |trainer - sampler| log-probability of
each step is printed every 10 steps, reported (``logp_gap_max``), and a step above
``LOGP_TOLERANCE`` fails the run: a sampler that is not serving the trainer's weights is not
measured. AsyncGRPOTrainer's samples are up to 4 syncs old, so its ratio is no such check; there a
probe (``trl_async.FileTransfer.probe``: fresh samples from the server, scored by the trainer's
model through TRL's own packing) measures the gap after the first sync and after the last one,
against the same tolerance.

The recipe is the demo's: the committed tiny model, the prompts of ``envs.arith:training_rows(seed)``
(TRL gets them as conversational prompts, ``[{"role": "user", "content": question}]``, rendered by
the model's chat template like agentrl's env workflow does), the reward of ``agentrl/Arith-v0``
(TRL's reward function resets and steps ``envs.arith.ArithEnv`` on each completion), 16 prompts x
16 samples per optimizer step, T = 1, 12 new tokens, AdamW lr 2e-5 with betas (0.9, 0.99) and a
cosine to 2e-6, no KL, float32. agentrl runs as the demo does (``placement: auto``: on a CPU,
decoupled — the server and the trainer rank at once, a thread each), without its evaluations
every 10 steps (``eval.every_steps=0``) so that its steps are timed alone; TRL runs in one process with 2 torch threads, in ``.venv-trl`` (``make trl``).

Three runs, one after another (never two at once):

1. agentrl, ``--steps`` steps (80). Its training time: the sum of ``perf/step_s`` in
   ``metrics.jsonl`` (from the first step's start to the last one's end; not the model load, the
   servers' start or the evaluations before and after).
2. TRL, ``--steps`` steps with the cosine over 80 steps, as the demo's recipe — for reference.
3. TRL in equal minutes: stopped (at the step boundary nearest) when its training time reaches
   agentrl's. Its cosine runs over the steps it is expected to make in that time (from run 2's
   median step time), so that its learning rate decays to 2e-6 within the budget as the demo's does.

With ``--seeds N`` runs 1 and 3 are made for each of the seeds 0 .. N-1 (both sides draw their
prompt order, and TRL its sampling, from it; run 2 only for seed 0): one run's held-out figure
moves by a few points with the seed (agentrl's asynchronous runs also with timing), so a claim about
the gains needs several. The JSON then holds the means, each seed's figures (``per_seed``) and the
paired difference of the gains (agentrl's minus TRL's) with its 95% interval (Student's t).

TRL's training time runs from ``on_train_begin`` to the last ``on_step_end`` (not the model load
or the save; for AsyncGRPOTrainer from after TRL's own ``on_train_begin``, which spawns the rollout
process and makes the first sync, to after the last step's sync). Every checkpoint is evaluated by the same evaluator, ``agentrl eval`` with the demo's
``eval`` section (``envs.arith:eval_rows``, ``--eval-limit`` problems (1,000), greedy, 12 new
tokens): agentrl's final weights (``RUN_DIR/weights/vNNNNNN``), the base model (``*_eval_before``)
and each TRL run's ``save_pretrained`` output. The run's own ``eval_before``/``eval_after`` (the
same evaluator, inside ``agentrl train``) are reported beside them. Last line: one JSON object with
``agentrl_steps_per_min``, ``trl_steps_per_min`` (run 3), ``ratio_steps_per_min`` (agentrl / TRL;
above 1: agentrl is faster) and the held-out pass@1 before and after for both, in equal minutes;
the median step times (``*_step_s_median``) beside them say how much a busy machine moved the totals
(measure with nothing else running: TRL's 2-thread process slows down most when its cores are shared).
With several configurations every TRL run above is made for each, one after another, against the
same agentrl runs; the top-level ``trl_*`` figures and ``ratio_steps_per_min`` are the fastest
configuration's (by steps per minute in equal minutes; ``trl_config`` names it),
``ratio_steps_per_min_vs_plain`` is agentrl's against ``plain``, and ``by_trl_config`` holds each
configuration's figures. A vLLM configuration's step time includes its weight sync (TRL syncs
before each generation), not the server's or the engine's start.

    make trl trl-vllm && .venv/bin/python benchmarks/vs_trl.py [--steps 80] [--eval-limit 1000] \
        [--trl-threads 2] [--seeds 1] [--trl-configs plain,vllm-server,vllm-colocate,vllm-async]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "arith_grpo.yaml"
AGENTRL = ROOT / ".venv" / "bin" / "agentrl"
TRL_PYTHON = ROOT / ".venv-trl" / "bin" / "python"
TRL_VLLM_PYTHON = ROOT / ".venv-trl-vllm" / "bin" / "python"
TRL_CONFIGS = ("plain", "vllm-server", "vllm-colocate", "vllm-async")
# the largest |trainer - sampler| log-probability of a sampled token a run accepts (both float32)
LOGP_TOLERANCE = 1e-3
SCHEDULE_STEPS = 80  # the demo's trainer.total_steps: its cosine reaches lr * 0.1 there
# Student's t at 97.5% by degrees of freedom (index; the last entry stands for 10 and more)
T95 = (math.inf, 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)

# The demo's recipe, for TRL (examples/arith_grpo.yaml holds agentrl's side of it).
RECIPE = {"prompts_per_step": 16, "group_size": 16, "temperature": 1.0, "max_new_tokens": 12, "lr": 2e-5,
          "min_lr_ratio": 0.1, "betas": (0.9, 0.99)}


def say(msg: str) -> None:
    print(f"[vs_trl {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run_logged(cmd: list[str], log: Path, show: re.Pattern[str] | None,
               env: dict[str, str] | None = None) -> str:
    """Run ``cmd`` with stdout and stderr into ``log``; lines matching ``show`` are echoed.
    Returns the last line that is a JSON object (what every command here ends with)."""
    last = ""
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                                env=env)
        assert proc.stdout is not None
        for line in proc.stdout:
            f.write(line)
            f.flush()
            line = line.rstrip("\n")
            if line.startswith("{"):
                last = line
            if show is not None and show.search(line):
                print(f"    {line}", flush=True)
        rc = proc.wait()
    if rc != 0 or not last:
        tail = "".join(log.read_text().splitlines(keepends=True)[-30:])
        sys.exit(f"vs_trl: {' '.join(cmd)} failed (exit {rc}); the end of {log}:\n{tail}")
    return last


def held_out(model: Path | str, out: Path, limit: int) -> float:
    """pass@1 of ``model`` by ``agentrl eval`` with the demo's eval section (greedy, 12 new tokens)."""
    cmd = [str(AGENTRL), "eval", str(CONFIG), f"model={model}", f"run_dir={out}", f"eval.limit={limit}",
           "--out", str(out / "eval")]
    report = json.loads(run_logged(cmd, out.with_suffix(".log"), None))
    return float(report["pass@1"])


def run_agentrl(tmp: Path, args: argparse.Namespace, seed: int) -> dict:
    run_dir = tmp / f"agentrl_seed{seed}"
    log = tmp / f"agentrl_seed{seed}.log"
    say(f"agentrl train {CONFIG.relative_to(ROOT)} seed={seed} steps={args.steps} eval.every_steps=0 "
        f"eval.limit={args.eval_limit} (log {log})")
    summary = json.loads(run_logged(
        [str(AGENTRL), "train", str(CONFIG), f"run_dir={run_dir}", f"seed={seed}", f"steps={args.steps}",
         "eval.every_steps=0", f"eval.limit={args.eval_limit}"],
        log, re.compile(r"^(eval |stopping|step +\d*0 )")))
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    step_s = [r["perf/step_s"] for r in records if "perf/step_s" in r]
    steps = int(summary["steps"])
    assert len(step_s) == steps, (len(step_s), steps)
    weights = run_dir / "weights" / f"v{steps:06d}"
    train_s = sum(step_s)
    return {"steps": steps, "train_s": train_s, "step_s": step_s, "summary_minutes": summary["minutes"],
            "eval_before_in_run": summary["eval_before"], "eval_after_in_run": summary["eval_after"],
            "weights": str(weights) if weights.is_dir() else None}


def run_trl(tmp: Path, name: str, args: argparse.Namespace, config: str, seed: int, horizon: int,
            stop_steps: int | None, stop_s: float | None) -> dict:
    out = tmp / name
    python = TRL_PYTHON if config == "plain" else TRL_VLLM_PYTHON
    cmd = [str(python), str(Path(__file__).resolve()), "--trl-worker", "--trl-config", config, "--out", str(out),
           "--horizon", str(horizon), "--trl-threads", str(args.trl_threads), "--seed", str(seed)]
    if stop_steps is not None:
        cmd += ["--stop-steps", str(stop_steps)]
    if stop_s is not None:
        cmd += ["--stop-s", f"{stop_s:.3f}"]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.trl_threads), MKL_NUM_THREADS=str(args.trl_threads),
               TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    say(f"TRL {config} ({name}, seed {seed}): cosine over {horizon} steps, stop at "
        + (f"{stop_steps} steps" if stop_steps is not None else f"{stop_s / 60:.2f} training minutes")
        + f" (log {tmp / (name + '.log')})")
    return json.loads(run_logged(cmd, tmp / f"{name}.log", re.compile(r"^trl "), env=env))


def trl_configs(args: argparse.Namespace) -> list[str]:
    configs = [c.strip() for c in args.trl_configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in TRL_CONFIGS]
    if unknown or not configs:
        sys.exit(f"benchmarks/vs_trl.py: --trl-configs {args.trl_configs!r}: expected a comma-separated list of "
                 f"{', '.join(TRL_CONFIGS)}")
    if "plain" in configs and not TRL_PYTHON.exists():
        sys.exit("benchmarks/vs_trl.py: TRL's environment is missing; run `make trl`")
    if set(configs) - {"plain"} and not TRL_VLLM_PYTHON.exists():
        sys.exit("benchmarks/vs_trl.py: TRL's vLLM environment is missing; run `make trl-vllm`")
    return configs


def trl_in_equal_minutes(tmp: Path, args: argparse.Namespace, config: str, seed: int, ours: dict,
                         refs: dict[str, dict]) -> dict:
    """TRL in ``config`` for agentrl's training minutes (after its reference run, the first time)."""
    if config not in refs:
        ref = run_trl(tmp, f"trl_{config}_steps", args, config, seed, SCHEDULE_STEPS, args.steps, None)
        say(f"TRL {config} ({args.steps} steps): {ref['steps']} steps in {ref['train_s'] / 60:.2f} training "
            f"minutes ({ref['train_s'] / ref['steps']:.2f} s a step)")
        ref["eval_after"] = held_out(ref["out"], tmp / f"eval_trl_{config}_steps", args.eval_limit)
        refs[config] = ref
    # its cosine's length: the steps TRL makes in agentrl's minutes at the reference run's median step time
    expected = max(1, round(ours["train_s"] / statistics.median(refs[config]["step_s"])))
    eq = run_trl(tmp, f"trl_{config}_minutes_seed{seed}", args, config, seed, expected, None, ours["train_s"])
    say(f"TRL {config} (equal minutes): {eq['steps']} steps in {eq['train_s'] / 60:.2f} training minutes "
        f"({eq['train_s'] / eq['steps']:.2f} s a step; {expected} expected)")
    eq_after = held_out(eq["out"], tmp / f"eval_trl_{config}_minutes_seed{seed}", args.eval_limit)
    say(f"seed {seed}: held-out pass@1 agentrl {ours['eval_after']:.3f}; TRL {config} equal minutes "
        f"{eq_after:.3f}; TRL {config} {refs[config]['steps']} steps (seed 0) {refs[config]['eval_after']:.3f}")
    return {"seed": seed, "ours": ours, "eq": eq, "expected": expected,
            "agentrl_eval_after": ours["eval_after"], "trl_eval_after": eq_after}


def orchestrate(args: argparse.Namespace) -> None:
    configs = trl_configs(args)
    if not AGENTRL.exists():
        sys.exit("benchmarks/vs_trl.py: .venv is missing; run `make install`")
    load_before = load_average()
    say(f"load average before: {load_before} ({os.cpu_count()} cores); TRL configurations: {', '.join(configs)}")
    if float(load_before.split()[0]) >= 0.5 * (os.cpu_count() or 1):
        say("warning: the machine is busy before we start; the figures will be noisy. TRL's one process with "
            "2 OpenMP threads suffers most when its cores are shared (a step goes from ~0.8 s to 5-10 s), "
            "so compare the *_step_s_median figures too, or run it with nothing else running")
    tmp = Path(tempfile.mkdtemp(prefix="vs_trl-", dir=args.tmp))  # kept when a run fails (its logs)
    say(f"evaluating the base model with agentrl eval ({args.eval_limit} held-out problems, greedy) ...")
    base = held_out(ROOT / "examples" / "tiny-model", tmp / "eval_base", args.eval_limit)
    refs: dict[str, dict] = {}
    runs: dict[str, list[dict]] = {c: [] for c in configs}
    for seed in range(args.seeds):
        ours = run_agentrl(tmp, args, seed)
        ours["eval_after"] = (held_out(ours["weights"], tmp / f"eval_agentrl_seed{seed}", args.eval_limit)
                              if ours["weights"] else ours["eval_after_in_run"])
        say(f"agentrl: {ours['steps']} steps in {ours['train_s'] / 60:.2f} training minutes "
            f"({ours['train_s'] / ours['steps']:.2f} s a step); held-out {base:.3f} -> {ours['eval_after']:.3f}")
        for config in configs:
            runs[config].append(trl_in_equal_minutes(tmp, args, config, seed, ours, refs))
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = load_average()
    say(f"load average after: {load_after}")
    reports = {c: report(args, base, runs[c], refs[c], load_before, load_after) for c in configs}
    print(json.dumps(against_fastest(reports)))


BY_CONFIG = ("trl_steps_per_min", "ratio_steps_per_min", "trl_eval_after", "trl_gain", "trl_minutes", "trl_steps",
             "trl_step_s_median", "gain_difference_mean", "gain_difference_ci95", "logp_gap_max", "vllm_version")


def against_fastest(reports: dict[str, dict]) -> dict:
    """The last line: every figure of ``report`` against the fastest TRL configuration (by steps
    per minute in equal minutes), and each configuration's own under ``by_trl_config``."""
    fastest = max(reports, key=lambda c: reports[c]["trl_steps_per_min"])
    out = {**reports[fastest], "trl_config": fastest, "trl_configs": list(reports)}
    out["by_trl_config"] = {c: {k: r[k] for k in (*BY_CONFIG, *(k for k in r if k.startswith(f"trl_{r['steps']}_")))
                                if k in r} for c, r in reports.items()}
    if "plain" in reports and fastest != "plain":
        out["ratio_steps_per_min_vs_plain"] = reports["plain"]["ratio_steps_per_min"]
    return out


def report(args: argparse.Namespace, base: float, runs: list[dict], ref: dict, load_before: str,
           load_after: str) -> dict:
    """The last line: steps per minute over every seed's training minutes, held-out figures (the
    means over the seeds) and, with several seeds, each seed's and the gains' paired difference."""
    r3 = lambda x: round(x, 3)  # noqa: E731
    per_min = lambda rs: sum(r["steps"] for r in rs) / (sum(r["train_s"] for r in rs) / 60)  # noqa: E731
    ours, eqs = [r["ours"] for r in runs], [r["eq"] for r in runs]
    ours_after = statistics.mean(r["agentrl_eval_after"] for r in runs)
    eq_after = statistics.mean(r["trl_eval_after"] for r in runs)
    out = {
        "benchmark": "vs_trl",
        "agentrl_steps_per_min": r3(per_min(ours)), "trl_steps_per_min": r3(per_min(eqs)),
        "ratio_steps_per_min": r3(per_min(ours) / per_min(eqs)),
        "agentrl_eval_before": base, "agentrl_eval_after": r3(ours_after),
        "trl_eval_before": base, "trl_eval_after": r3(eq_after),
        "agentrl_gain": r3(ours_after - base), "trl_gain": r3(eq_after - base),
        "minutes": r3(statistics.mean(r["train_s"] for r in ours) / 60),
        "trl_minutes": r3(statistics.mean(r["train_s"] for r in eqs) / 60),
        "agentrl_steps": ours[0]["steps"], "trl_steps": r3(statistics.mean(r["steps"] for r in eqs)),
        "agentrl_in_run_eval_before": ours[0]["eval_before_in_run"],
        "agentrl_in_run_eval_after": r3(statistics.mean(r["eval_after_in_run"] for r in ours)),
        "agentrl_run_minutes": r3(statistics.mean(r["summary_minutes"] for r in ours)),
        "agentrl_step_s_median": r3(statistics.median(x for r in ours for x in r["step_s"])),
        "trl_step_s_median": r3(statistics.median(x for r in eqs for x in r["step_s"])),
        f"trl_{args.steps}_steps_step_s_median": r3(statistics.median(ref["step_s"])),
        f"trl_{args.steps}_steps_per_min": r3(ref["steps"] / (ref["train_s"] / 60)),
        f"trl_{args.steps}_steps_minutes": r3(ref["train_s"] / 60),
        f"trl_{args.steps}_steps_eval_after": ref["eval_after"],
        "eval_problems": args.eval_limit, "trl_threads": args.trl_threads, "trl_version": eqs[0]["trl_version"],
        "steps": args.steps,
        "seeds": len(runs),
        "load_average_before": load_before, "load_average_after": load_after,
    }
    if "logp_gap_max" in eqs[0]:  # with vLLM: the largest sampler-trainer gap of any step (checked in the run)
        out |= {"logp_gap_max": max(r["logp_gap_max"] for r in [ref, *eqs]), "vllm_version": eqs[0]["vllm_version"]}
    if len(runs) > 1:
        diffs = [r["agentrl_eval_after"] - r["trl_eval_after"] for r in runs]
        half = T95[min(len(diffs) - 1, len(T95) - 1)] * statistics.stdev(diffs) / math.sqrt(len(diffs))
        out |= {"gain_difference_mean": r3(statistics.mean(diffs)), "gain_difference_ci95": r3(half),
                "per_seed": [{"seed": r["seed"], "agentrl_eval_after": r["agentrl_eval_after"],
                              "trl_eval_after": r["trl_eval_after"], "trl_steps": r["eq"]["steps"],
                              "agentrl_minutes": r3(r["ours"]["train_s"] / 60),
                              "agentrl_steps_per_min": r3(per_min([r["ours"]])),
                              "trl_steps_per_min": r3(per_min([r["eq"]]))} for r in runs]}
    return out


# --------------------------------------------------------------------------- the TRL side (.venv-trl*)


def trl_worker(args: argparse.Namespace) -> None:
    """One TRL run on the demo's recipe in configuration ``args.trl_config``; the last line
    printed is a JSON object."""
    import torch

    torch.set_num_threads(args.trl_threads)
    out = Path(args.out)
    model_dir = ROOT / "examples" / "tiny-model"
    if args.trl_config == "plain":
        trl_train(args, out, model_dir, {}, None)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import trl_vllm  # the shims (benchmarks/trl_vllm.py), in .venv-trl-vllm only

    sync = trl_vllm.FileSync(model_dir, out)
    if args.trl_config == "vllm-colocate":
        trl_vllm.patch_colocate_mode(sync, args.trl_threads)
        trl_train(args, out, model_dir, {"use_vllm": True, "vllm_mode": "colocate"}, sync)
        return
    server, key, url = trl_vllm.start_server(model_dir, args.trl_threads, args.seed,
                                             out.parent / f"{out.name}_vllm_server.log")
    try:
        if args.trl_config == "vllm-async":
            trl_async_train(args, out, model_dir, url, key, sync)
        else:
            trl_vllm.patch_server_mode(key, sync)
            trl_train(args, out, model_dir, {"use_vllm": True, "vllm_mode": "server",
                                             "vllm_server_base_url": url}, sync)
    finally:
        trl_vllm.stop_server(server)


def demo_dataset(seed: int):  # noqa: ANN201 (a datasets.Dataset; datasets is in the TRL venvs only)
    """The demo's training prompts as conversational prompts, with the reward's columns."""
    from datasets import Dataset

    from envs.arith import training_rows

    return Dataset.from_list([{"prompt": [{"role": "user", "content": r["question"]}],
                               "question": r["question"], "answer": r["answer"]} for r in training_rows(seed)])


def recipe_config(config_class: type, args: argparse.Namespace, out: Path, **extra: object) -> object:
    """The demo's recipe as the arguments of TRL's ``config_class`` (GRPOConfig, AsyncGRPOConfig):
    one optimizer step per 16 prompts x 16 samples."""
    # transformers 5.20 renamed gradient_checkpointing (.venv-trl-vllm has 5.19: vLLM's pin)
    checkpointing_off = {("activation_checkpointing" if "activation_checkpointing" in config_class.__dataclass_fields__
                          else "gradient_checkpointing"): False}
    return config_class(
        output_dir=str(out / "trainer"),
        per_device_train_batch_size=RECIPE["prompts_per_step"] * RECIPE["group_size"], gradient_accumulation_steps=1,
        num_generations=RECIPE["group_size"],
        max_completion_length=RECIPE["max_new_tokens"], temperature=RECIPE["temperature"], top_p=1.0, top_k=0,
        learning_rate=RECIPE["lr"], lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": RECIPE["min_lr_ratio"]}, warmup_steps=0,
        adam_beta1=RECIPE["betas"][0], adam_beta2=RECIPE["betas"][1], weight_decay=0.0, max_grad_norm=1.0,
        max_steps=args.horizon, bf16=False, fp16=False, use_cpu=True, **checkpointing_off,
        save_strategy="no", report_to="none", logging_steps=10, disable_tqdm=True, seed=args.seed,
        dataloader_num_workers=0, **extra)


def trl_train(args: argparse.Namespace, out: Path, model_dir: Path, vllm_args: dict, sync: object) -> None:
    """``GRPOTrainer``: plain, or with ``vllm_args`` (server or colocate mode)."""
    import asyncio

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from envs.arith import ArithEnv

    env = ArithEnv()  # what agentrl/Arith-v0 makes, with the demo's (default) arguments

    async def score(completions: list, questions: list[str], answers: list) -> list[float]:
        rewards = []
        for completion, question, answer in zip(completions, questions, answers, strict=True):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            await env.areset(options={"task": {"question": question, "answer": answer}})
            rewards.append((await env.astep(text))[1])
        return rewards

    def arith_reward(prompts, completions, question, answer, **_: object) -> list[float]:
        return asyncio.run(score(completions, question, answer))

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    # trained once per generation batch (μ = 1), no KL
    config = recipe_config(GRPOConfig, args, out, steps_per_generation=1, num_iterations=1, beta=0.0, **vllm_args)
    clock = make_clock(args)
    trainer = GRPOTrainer(model=model, reward_funcs=arith_reward, args=config, train_dataset=demo_dataset(args.seed),
                          processing_class=tokenizer, callbacks=[clock])
    if vllm_args:
        import trl_vllm

        clock.logp_gap = lambda: trl_vllm.logp_gap(trainer)
    train_and_report(args, out, trainer, tokenizer, clock,
                     lambda: {"syncs": sync.syncs, "sync_write_s": round(sync.seconds, 3)} if sync else {})


def trl_async_train(args: argparse.Namespace, out: Path, model_dir: Path, url: str, key: str, sync: object) -> None:
    """``AsyncGRPOTrainer`` with the vLLM server at ``url``, with the shims of benchmarks/trl_async.py."""
    import trl_async
    from transformers import AutoTokenizer
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    trl_async.patch(key)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tokenizer.response_template = trl_async.RESPONSE_TEMPLATE
    dataset = demo_dataset(args.seed)
    probe_ids = tokenizer.apply_chat_template(dataset[0]["prompt"], add_generation_prompt=True, return_dict=False)
    transfer = trl_async.FileTransfer(url, key, sync, str(model_dir), probe_ids)
    # TRL's asynchronous defaults kept (max_staleness 4, in-flight requests 4 steps' samples); a fixed
    # count of samples per micro-batch (token_budget 0) instead of a budget read from the server
    config = recipe_config(AsyncGRPOConfig, args, out, vllm_server_base_url=url, token_budget=0, dtype="float32")
    trainer = AsyncGRPOTrainer(model=str(model_dir), reward_funcs=trl_async.arith_reward, args=config,
                               train_dataset=dataset, processing_class=tokenizer, weight_transfer=transfer)
    transfer.trainer = trainer
    clock = make_clock(args)
    # after TRL's own callbacks: the clock starts once the rollout process runs and the first sync is
    # done, and the sync after each step is that step's
    trainer.add_callback(clock)

    def checked() -> dict:
        """The probe after the last sync (the trainer's final weights), the check of every probe."""
        transfer.gaps.append(transfer.probe())
        gap = max(transfer.gaps)
        if not gap <= LOGP_TOLERANCE:
            sys.exit(f"vs_trl: the sampler's and the trainer's log-probabilities differ by up to {gap:.3g} after a "
                     f"sync (tolerance {LOGP_TOLERANCE:g}); the shims in benchmarks/trl_async.py do not hold")
        print(f"trl probes after the first and the last sync: max |trainer - sampler| logprob "
              f"{', '.join(f'{g:.2e}' for g in transfer.gaps)}", flush=True)
        return {"syncs": sync.syncs, "sync_write_s": round(sync.seconds, 3), "logp_gap_max": gap,
                "logp_gaps_probed": transfer.gaps}

    train_and_report(args, out, trainer, tokenizer, clock, checked)


def train_and_report(args: argparse.Namespace, out: Path, trainer: object, tokenizer: object, clock: object,
                     extra: Callable[[], dict]) -> None:
    """Train, save the model beside the tokenizer, print the run's JSON line."""
    import torch
    import trl
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    torch.set_num_threads(args.trl_threads)
    trainer.train()
    train_s = sum(clock.step_s)
    trainer.save_model(str(out))
    tokenizer.save_pretrained(str(out))
    print(f"trl done: {clock.steps} steps in {train_s / 60:.2f} training minutes", flush=True)
    result = {"steps": clock.steps, "train_s": train_s, "horizon": args.horizon, "out": str(out),
              "last_reward": clock.reward, "trl_version": trl.__version__, "trl_config": args.trl_config,
              "torch_threads": torch.get_num_threads(), "step_s": [round(x, 3) for x in clock.step_s]}
    if args.trl_config != "plain":
        import vllm

        result |= {"vllm_version": vllm.__version__, **extra()}
        if clock.logp_gaps:  # checked at every step (GRPOTrainer's own metric)
            result["logp_gap_max"] = max(clock.logp_gaps)
    print(json.dumps(result))


def make_clock(args: argparse.Namespace) -> object:
    """A TrainerCallback: training time (first step's start to the last one's end), the stop rules
    and, with GRPOTrainer's vLLM modes, the check of the largest gap between the sampler's and the
    trainer's log-probabilities at each step (``logp_gap``, set once the trainer exists)."""
    import torch
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.t0 = self.last = 0.0
            self.steps = 0
            self.step_s: list[float] = []
            self.reward = math.nan
            self.logp_gaps: list[float] = []
            self.logp_gap: Callable[[], float | None] | None = None

        def on_train_begin(self, targs, state, control, **_):  # noqa: ANN001
            self.t0 = self.last = time.perf_counter()
            print(f"trl training ({args.trl_config}): {torch.get_num_threads()} torch threads, "
                  f"cosine over {state.max_steps} steps", flush=True)

        def on_step_end(self, targs, state, control, **_):  # noqa: ANN001
            now = time.perf_counter()
            self.step_s.append(now - self.last)
            self.last = now
            self.steps = state.global_step
            if self.logp_gap is not None:
                self.check_logprobs()
            elapsed = sum(self.step_s)
            if args.stop_steps is not None and self.steps >= args.stop_steps:
                control.should_training_stop = True
            # equal minutes: stop at the step boundary nearest the budget
            if args.stop_s is not None and elapsed + 0.5 * elapsed / self.steps >= args.stop_s:
                control.should_training_stop = True

        def check_logprobs(self) -> None:
            gap = self.logp_gap()
            if gap is None:
                sys.exit(f"vs_trl: no log-probability gap recorded at step {self.steps}: the sampler's and the "
                         "trainer's log-probabilities cannot be compared")
            self.logp_gaps.append(gap)
            if self.steps == 1 or self.steps % 10 == 0:
                print(f"trl step {self.steps:>4}  max |trainer - sampler| logprob {gap:.2e}", flush=True)
            if not gap <= LOGP_TOLERANCE:
                sys.exit(f"vs_trl: after the weight sync before step {self.steps} the sampler's and the trainer's "
                         f"log-probabilities differ by up to {gap:.3g} (tolerance {LOGP_TOLERANCE:g}): the sampler "
                         "is not serving the trainer's weights; the shims in benchmarks/trl_vllm.py do not hold")

        def on_log(self, targs, state, control, logs=None, **_):  # noqa: ANN001
            logs = logs or {}
            self.reward = logs.get("reward", self.reward)
            if "reward" in logs:
                lr = f"  lr {logs['learning_rate']:.2e}" if "learning_rate" in logs else ""
                print(f"trl step {state.global_step:>4}  reward {logs['reward']:.3f}{lr}"
                      f"  [{sum(self.step_s) / 60:.2f} min]", flush=True)

    return Clock()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=80, help="agentrl's steps, and TRL's in its reference run")
    ap.add_argument("--eval-limit", type=int, default=1000, help="held-out problems (envs.arith:eval_rows)")
    ap.add_argument("--trl-threads", type=int, default=2, help="torch threads of the TRL process")
    ap.add_argument("--tmp", default=None, help="parent of the temporary directory (default: the system's)")
    ap.add_argument("--seeds", type=int, default=1, help="runs of each side, with seeds 0 .. N-1 (see above)")
    ap.add_argument("--trl-configs", default="plain",
                    help=f"TRL configurations to run, comma-separated: {', '.join(TRL_CONFIGS)} (see above)")
    ap.add_argument("--keep", action="store_true", help="keep the runs' directory (logs, checkpoints)")
    ap.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--horizon", type=int, default=SCHEDULE_STEPS, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--stop-steps", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--stop-s", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--trl-config", default="plain", choices=TRL_CONFIGS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trl_worker:
        trl_worker(args)
    else:
        orchestrate(args)


if __name__ == "__main__":
    main()
