"""GRPO on arithmetic with every real part of agentrl, synchronously: `make demo`'s algorithm, for reading.

    python examples/grpo_arith.py [--config FILE.yaml] [key=value ...]

What it runs, top to bottom:
  1. an ``agentrl serve`` process on the tiny demo model (the inference server, SGLang's API);
  2. a one-rank FSDP2 ``Actor`` on the same weights (the trainer);
  3. a greedy evaluation on the evaluation pool (``arith_data``'s ``split="eval"``): each
     episode is ``agentrl/Arith-v0`` played by ``workflows.env:EnvWorkflow`` through
     ``RemoteEngine`` (chat template → tokens → ``/generate`` → reply → env reward);
  4. ``steps`` rounds of: ``prompts × samples`` episodes on the next ``prompts`` rows of
     ``envs.arith:training_rows`` (the RL pool, never the evaluation pool) in the order
     ``agentrl train`` visits them (``RowSource``), at temperature 1 (every token keeps the
     server's logprob and policy version; with ``sampling_seed``, each call its own seed, as
     ``agentrl train`` with ``rollout.sampling.seed``) → ``prepare_batch`` (group-relative advantages) → ``Actor.train_step`` (the
     decoupled PPO loss) → ``WeightPublisher`` (save → pause → update → continue) so the
     next round samples from the new policy; every ``eval_every`` steps the evaluation again;
  5. the evaluation again; metrics to ``OUT/metrics.jsonl``, a plot to ``OUT/demo.png``, the
     resolved config to ``OUT/config.yaml``, and a JSON summary as the last line.

What it is not: the asynchronous loop (generation here waits for training, i.e. staleness
η = 0; `agentrl train examples/arith_grpo.yaml`, which `make demo` runs, overlaps them). With
the same rows, seeds and trainer settings, `agentrl train` at ``trainer.max_staleness=0``
gives this loop's losses, rewards and weights step by step (tests/run/test_sync_equivalence.py).

The recipe: 16 prompts × 16 samples, at most 12 new tokens, temperature 1, reward 1 for the
right boxed answer, (r − mean)/std advantages, PPO clip 0.2, no KL, AdamW lr 2e-5 with
betas (0.9, 0.99) decayed along a cosine to 2e-6 over the 40 steps, gradient clip 1.0.

Why these numbers (measured on 1,000 problems): almost every wrong answer of the tiny model
is off in the units digit only, and the mean error of that digit is one stiff direction of
the weights. An Adam step moves it by about 0.6 per 2e-5 of lr (a random perturbation of
the same size moves nothing), so at lr 5e-5 or more it swings from step to step, and greedy
accuracy with it (the previous demo model at 5e-5, evaluated after every step: 22% → 28% →
19% → 19% → 23% ...),
while the sampled reward, an average over the digits the model hesitates between, barely
notices. At 1e-5 to 2e-5 the offset is gone in 10-20 steps and stays near 0, and then
the probability of the right answer keeps rising (0.17 → 0.28 in 40 steps); the cosine
decay keeps the last steps from shaking the offset again. Dropping groups whose rewards
are all equal changes nothing here (with Adam and one mini-batch it only rescales the
loss); temperature 0.7, groups of 8 × 32 prompts and lr 3e-5 did no better.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from agentrl.config import option

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class DemoConfig:
    model: str = option(str(ROOT / "examples" / "tiny-model"), help="HF model directory to train")
    out: str = option(str(ROOT / "runs" / "demo"), help="output directory (metrics, plot, weights)")
    steps: int = option(40, ge=1, help="policy updates")
    prompts: int = option(16, ge=1, help="prompts per step (from the RL pool, never the evaluation pool)")
    samples: int = option(16, ge=2, help="samples per prompt (a GRPO group)")
    max_new_tokens: int = option(12, ge=1, help="answer budget in tokens")
    temperature: float = option(1.0, gt=0, help="sampling temperature of the rollouts (evaluation is greedy)")
    top_p: float = option(1.0, gt=0, le=1, help="nucleus sampling of the rollouts")
    lr: float = option(2e-5, gt=0, help="AdamW peak learning rate")
    warmup_steps: int = option(0, ge=0, help="steps of linear lr warmup from 0")
    min_lr_ratio: float = option(0.1, ge=0, le=1, help="cosine decay over `steps` to lr * this (1: constant lr)")
    clip: float = option(0.2, gt=0, lt=1, help="PPO ratio clip (both sides)")
    kl_coef: float = option(0.0, ge=0, help="k3 KL penalty against the initial model (0: none)")
    filter_groups: bool = option(False, help="drop groups whose samples all got the same reward before the loss")
    eval_problems: int = option(1000, ge=1, help="problems of the evaluation pool, evaluated greedily before and after")
    eval_every: int = option(10, ge=0, help="also evaluate every this many steps (0: only before and after)")
    eval_seed: int = option(0, help="seed of the evaluation problems (the same set whatever `seed` is)")
    seed: int = option(0, help="seed of the RL problems' order (agentrl train's RowSource over "
                                "envs.arith:training_rows) and of the trainer")
    sampling_seed: int | None = option(None, help="seed the rollouts: call c of sample k of row i samples with "
                                                  "agentrl.rollout.seeds.call_seed(sampling_seed, i, k, c), as "
                                                  "agentrl train with rollout.sampling.seed (null: unseeded)")
    max_running_requests: int = option(0, ge=0, help="the server's cap on requests decoded together (0: a "
                                       "step's samples all at once); 1 makes its logprobs independent of timing")
    threads: int = option(2, ge=1, help="torch threads for the server and for the trainer, each (they take "
                          "turns in this synchronous loop, so each may use both cores of a 2-core machine)")


async def run_episodes(engine, workflow, rows, repeats: int, tag: str, first_index: int = 0):
    """``repeats`` episodes of each row, all at once; row ``rows[j]`` is row ``first_index + j`` of
    the run's order, its group ``{tag}-{index}`` and its episodes ``{tag}-{index}:{k}`` (the
    executor's names), each sampling with its own seeds when the workflow's sampling is seeded."""
    from agentrl.api import Trajectory, TrajectoryStatus
    from agentrl.rollout.seeds import SeededClient

    async def one(i: int, k: int, row: dict) -> list[Trajectory]:
        trajectories = (await workflow.arun_episode(SeededClient(engine, i, k), row)
                        or [Trajectory.failed(TrajectoryStatus.ENV_ERROR)])
        for t in trajectories:
            t.group_id, t.episode_id = f"{tag}-{i}", f"{tag}-{i}:{k}"
        return trajectories

    episodes = await asyncio.gather(*(one(first_index + j, k, row) for j, row in enumerate(rows)
                                      for k in range(repeats)))
    return [t for trajectories in episodes for t in trajectories]


def append_jsonl(path: Path, row: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


def plot(metrics: list[dict], evals: list[tuple[int, float]], path: Path) -> None:
    from agentrl.plugins import import_optional

    matplotlib = import_optional("matplotlib", extra="plots", purpose="the demo's plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in metrics]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(steps, [m["reward_mean"] for m in metrics], marker=".", label="sampled reward (rollouts)")
    ax1.plot([s for s, _ in evals], [a for _, a in evals], marker="o", color="green",
             label=f"greedy accuracy, evaluation pool ({evals[0][1]:.3f} -> {evals[-1][1]:.3f})")
    ax1.set_xlabel("step")
    ax1.set_ylabel("reward")
    ax1.legend(fontsize=8)
    ax1.set_title("Arith-v0: reward per step")
    ax2.plot(steps, [m.get("loss", 0.0) for m in metrics], label="loss")
    ax2.plot(steps, [m.get("entropy", 0.0) for m in metrics], label="entropy")
    ax2.set_xlabel("step")
    ax2.legend(fontsize=8)
    ax2.set_title("trainer")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def informative_groups(trajectories: list) -> list:
    """The trajectories of groups whose rewards differ (an all-equal group has zero advantages
    and would only dilute the token mean); all of them when no group differs."""
    rewards: dict[str, set[float]] = {}
    for t in trajectories:
        rewards.setdefault(t.group_id, set()).add(t.reward)
    kept = [t for t in trajectories if len(rewards[t.group_id]) > 1]
    return kept or trajectories


async def main_async(cfg: DemoConfig) -> dict:
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from transformers.utils import logging as hf_logging

    from agentrl.api import SamplingParams
    from agentrl.client.remote_engine import RemoteEngine
    from agentrl.model.arith_data import generate_problems
    from agentrl.plugins import load_object
    from agentrl.process.services import ServerProcess, free_port
    from agentrl.rollout.executor import RowSource
    from agentrl.trainer.actor import Actor
    from agentrl.trainer.batch import prepare_batch
    from agentrl.trainer.publish import DiskTransport, WeightPublisher
    from agentrl.trainer.trainer_config import LossConfig, TrainerConfig

    console = Console()
    hf_logging.disable_progress_bar()  # our own progress bar is the one to read
    out = Path(cfg.out)
    torch.set_num_threads(cfg.threads)
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))

    eval_rows = [p.to_row() for p in generate_problems(cfg.eval_problems, seed=cfg.eval_seed, split="eval")]
    workflow = load_object("workflows.env:EnvWorkflow")
    greedy = workflow("agentrl/Arith-v0", cfg.model, SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=0.0))
    sample = workflow("agentrl/Arith-v0", cfg.model, SamplingParams(max_new_tokens=cfg.max_new_tokens,
                                                                     temperature=cfg.temperature, top_p=cfg.top_p,
                                                                     seed=cfg.sampling_seed))
    training_rows = RowSource(load_object("envs.arith:training_rows")(cfg.seed), seed=cfg.seed)  # train's order

    console.print(f"[bold]agentrl demo[/]: GRPO on agentrl/Arith-v0 with {cfg.model}")
    running = cfg.max_running_requests or max(64, cfg.prompts * cfg.samples)
    with ServerProcess(cfg.model, "--weight-version", "0", "--max-running-requests", str(running),
                       threads=cfg.threads) as server:
        console.print(f"inference server ready at {server.url}")
        trainer_cfg = TrainerConfig(lr=cfg.lr, betas=[0.9, 0.99], warmup_steps=cfg.warmup_steps,
                                    total_steps=max(1, cfg.steps - cfg.warmup_steps), min_lr_ratio=cfg.min_lr_ratio,
                                    grad_clip=1.0, dtype="float32", seed=cfg.seed,
                                    loss=LossConfig(eps_low=cfg.clip, eps_high=cfg.clip, kl_coef=cfg.kl_coef))
        actor = Actor(cfg.model, trainer_cfg)
        gc.freeze()  # torch, transformers and the models live to the end: keep them out of full GC passes
        async with RemoteEngine(server.url, version=0) as engine:
            publisher = WeightPublisher(DiskTransport(out / "weights", source_dir=cfg.model, keep_last=1), engine)

            async def evaluate(label: str) -> float:
                results = await run_episodes(engine, greedy, eval_rows, 1, f"eval-{label}")
                acc = sum(t.reward for t in results) / len(results)
                console.print(f"greedy accuracy {label}: [bold]{acc:.3f}[/] on {len(results)} evaluation problems")
                return acc

            before = await evaluate("before")
            evals = [(0, before)]
            metrics: list[dict] = []
            t_start = time.perf_counter()
            with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                          TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                          TextColumn("{task.fields[status]}"), console=console) as progress:
                bar = progress.add_task("GRPO steps", total=cfg.steps, status="")
                for step in range(cfg.steps):
                    t0 = time.perf_counter()
                    first = step * cfg.prompts  # the rows agentrl train admits for this step at η = 0
                    rows = [training_rows[first + j] for j in range(cfg.prompts)]
                    results = await run_episodes(engine, sample, rows, cfg.samples, out.name, first)
                    t1 = time.perf_counter()
                    batch = prepare_batch(informative_groups(results) if cfg.filter_groups else results,
                                          version=actor.version, config=trainer_cfg)
                    stats = await asyncio.to_thread(actor.train_step, batch)
                    t2 = time.perf_counter()
                    record = await publisher.apublish(actor.model, actor.version)
                    reward = sum(t.reward for t in results) / len(results)
                    row = {"step": step + 1, "version": actor.version, "reward_mean": reward, "rollout_s": t1 - t0,
                           "train_s": t2 - t1, "publish_s": record.stage_s + record.paused_s,
                           "client_version": engine.version, "groups_trained": batch.stats.get("adv/num_groups", 0.0),
                           "frac_groups_zero_std": batch.stats.get("adv/frac_groups_zero_std", 0.0),
                           **{k: v for k, v in stats.items()
                              if k in ("loss", "entropy", "grad_norm", "clip_frac", "kl_ref", "lr")}}
                    if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
                        row["eval_accuracy"] = await evaluate(f"at step {step + 1}")
                        evals.append((step + 1, row["eval_accuracy"]))
                    metrics.append(row)
                    append_jsonl(out / "metrics.jsonl", row)
                    progress.update(bar, advance=1, status=f"reward {reward:.3f}  v{engine.version}")
            after = await evaluate("after")
            evals.append((cfg.steps, after))
    await greedy.aclose()
    await sample.aclose()
    plot(metrics, evals, out / "demo.png")
    summary = {"accuracy_before": before, "accuracy_after": after, "delta": after - before,
               "eval_problems": len(eval_rows), "steps": cfg.steps,
               "final_version": metrics[-1]["version"] if metrics else 0,
               "train_seconds": round(time.perf_counter() - t_start, 1), "out": str(out)}
    console.print(f"wrote {out / 'metrics.jsonl'}, {out / 'demo.png'}")
    return summary


def main(argv: list[str] | None = None) -> int:
    from agentrl.config import load_config, save_config
    from agentrl.errors import AgentRLError

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None, help="YAML file of DemoConfig keys")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(DemoConfig, args.config, args.overrides)
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.jsonl").unlink(missing_ok=True)
        save_config(cfg, out / "config.yaml")
        summary = asyncio.run(main_async(cfg))
    except AgentRLError as e:
        print(f"grpo_arith: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
