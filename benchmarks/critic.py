"""The critic's cost per train step: a ``gae`` step against the critic-free step, same batch.

What is measured: the seconds of one trainer step on the demo's batch (``benchmarks/trainer.py``'s
``demo_trajectories``: 16 prompts of ``agentrl/Arith-v0`` x 16 answers of 6-13 tokens, random
rewards), on one process (FSDP2 on one rank), in two ways:

  * ``actor`` (the baseline): ``prepare_batch`` + ``Actor.train_step``, advantages ``group_norm``;
  * ``critic``: the same with ``advantages.kind: gae`` — ``prepare_batch``, the critic's value
    pass and GAE (``Critic.assign_advantages``), ``Actor.train_step``, the value model's update
    (``Critic.train_step``): what ``agentrl train`` runs each step with a critic.

Both start from the same weights, with the same threads; after one warm-up each they alternate
``--repeats`` times (both see the same machine load) and each one's median counts. Last line:
one JSON object with ``ratio`` = critic seconds / actor seconds (the critic's cost: above 1 is
slower) and each part's median. Usage::

    .venv/bin/python benchmarks/critic.py [--threads 1] [--repeats 5] [--model examples/tiny-model]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainer import demo_trajectories  # noqa: E402 (the benchmark beside this one)

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "examples" / "tiny-model"))
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the demo's trainer: 1)")
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from agentrl.process.services import free_port

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))

    from agentrl.trainer.actor import Actor
    from agentrl.trainer.batch import prepare_batch
    from agentrl.trainer.critic import Critic
    from agentrl.trainer.trainer_config import AdvantageConfig, TrainerConfig

    trajectories = demo_trajectories(args.model, args.groups, args.group_size, args.seed)
    plain_cfg = TrainerConfig(lr=2e-5, max_staleness=2)
    gae_cfg = TrainerConfig(lr=2e-5, max_staleness=2, advantages=AdvantageConfig(kind="gae", lam=0.95))
    plain = Actor(args.model, plain_cfg)
    actor = Actor(args.model, gae_cfg)
    critic = Critic(actor, gae_cfg)
    parts: dict[str, list[float]] = {"values_gae": [], "actor_update": [], "critic_update": []}

    # every step trains on the same batch as if fresh (sampled by the step's own weights: staleness 0)
    def plain_step() -> None:
        plain.train_step(prepare_batch(trajectories, version=0, config=plain_cfg))

    def critic_step() -> None:
        t0 = time.perf_counter()
        batch = prepare_batch(trajectories, version=0, config=gae_cfg)
        critic.assign_advantages(batch)
        t1 = time.perf_counter()
        actor.train_step(batch)
        t2 = time.perf_counter()
        critic.train_step(batch)
        t3 = time.perf_counter()
        for name, dt in zip(parts, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            parts[name].append(dt)

    steps = {"actor": plain_step, "critic": critic_step}
    times: dict[str, list[float]] = {name: [] for name in steps}
    for fn in steps.values():  # warm-up
        fn()
    for values in parts.values():
        values.clear()
    for _ in range(args.repeats):
        for name, fn in steps.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    for name, t in times.items():
        print(f"{name:>7}: median {statistics.median(t):.3f} s/step ({', '.join(f'{x:.3f}' for x in t)})",
              file=sys.stderr)
    print(json.dumps({
        "benchmark": "critic", "sequences": len(trajectories), "tokens": sum(len(t) for t in trajectories),
        "threads": args.threads, "repeats": args.repeats,
        **{f"{name}_s_per_step": round(statistics.median(t), 4) for name, t in times.items()},
        **{f"critic_{name}_s": round(statistics.median(t), 4) for name, t in parts.items()},
        "ratio": round(statistics.median(times["critic"]) / statistics.median(times["actor"]), 3),
    }))


if __name__ == "__main__":
    main()
