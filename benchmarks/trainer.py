"""The trainer's step against a bare PyTorch step of the same model on the same tokens.

What is measured: sequence tokens per second of one policy update on the demo's batch — 16
prompts of ``agentrl/Arith-v0`` rendered with the model's chat template, 16 answers each of
6-13 tokens (the demo's 12-token budget), random rewards — in three ways, on one process:

  * ``actor``: ``Actor.train_step(prepare_batch(...))``, the path ``agentrl train`` takes
    (FSDP2 on one rank, packing, the decoupled PPO loss, metrics), with ``trainer.share_prefix``
    (each group's prompt once per packed row);
  * ``actor_unshared``: the same with ``trainer.share_prefix: false`` (every sequence whole);
  * ``bare`` (the baseline, the limit of a plain loop): the HF model without FSDP, the same
    whole sequences packed into rows by first-fit decreasing with the same attention
    (``sdpa_segments``), token log-probabilities, a REINFORCE loss, backward, one AdamW step.

All three train the same initial weights on the same batch with the same threads; after one
warm-up each they alternate ``--repeats`` times (so all see the same machine load) and each
one's median counts. Tokens are the batch's sequence tokens (what the user asked to train on),
whatever each way computes. Last line: one JSON object, ``ratio`` = actor / bare and
``ratio_unshared`` = actor_unshared / bare (above 1: faster than the bare loop). Usage::

    .venv/bin/python benchmarks/trainer.py [--threads 1] [--repeats 5] [--model examples/tiny-model]
                                           [--device cuda]

On a GPU (``--device cuda``) the actor computes in its automatic dtype (bfloat16 on GPUs that
have it, float32 master weights) and the bare step under autocast to the same dtype.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def demo_trajectories(model: str, groups: int, group_size: int, seed: int) -> list:
    """The demo's batch shape: ``groups`` arithmetic prompts x ``group_size`` answers."""
    from agentrl.api import NOT_SAMPLED, Trajectory
    from agentrl.rollout.renderer import ChatRenderer
    from envs.arith import training_rows

    renderer = ChatRenderer(model)
    vocab = len(renderer.tokenizer)
    rng = random.Random(seed)
    out = []
    for g, row in enumerate(training_rows(seed, n=groups)):
        prompt = renderer.encode(renderer.render([{"role": "user", "content": row["question"]}]))
        for k in range(group_size):
            answer = [rng.randrange(vocab) for _ in range(rng.randint(6, 13))]
            out.append(Trajectory(
                input_ids=prompt + answer, loss_mask=[0] * len(prompt) + [1] * len(answer),
                logprobs=[0.0] * len(prompt) + [-rng.uniform(0.1, 3.0) for _ in answer],
                versions=[NOT_SAMPLED] * len(prompt) + [0] * len(answer),
                reward=float(rng.random() < 0.3), group_id=f"g{g}", episode_id=f"g{g}-{k}"))
    return out


def bare_step(model, opt, sequences, budget: int, dtype: torch.dtype) -> None:
    from agentrl.trainer.packing import first_fit_decreasing, pack, token_logprobs

    device = next(model.parameters()).device
    n = sum(float(s["loss_mask"].sum()) for s in sequences)
    for mb in first_fit_decreasing([int(s["input_ids"].numel()) for s in sequences], budget):
        p = pack(sequences, mb)
        ids = p.input_ids.to(device)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            logits = model(input_ids=ids, position_ids=p.position_ids.to(device), use_cache=False).logits
        logp, _ = token_logprobs(logits, ids, p.sources.to(device))
        weight = (p.fields["advantages"] * p.fields["loss_mask"]).to(device)
        loss = -(logp[0] * weight).sum() / n
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "examples" / "tiny-model"))
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the demo's trainer: 1)")
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=16)
    ap.add_argument("--budget", type=int, default=4096, help="tokens per packed micro-batch (the trainer's default)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from agentrl.process.services import free_port

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))

    from transformers import AutoModelForCausalLM

    from agentrl.trainer.actor import Actor
    from agentrl.trainer.batch import prepare_batch
    from agentrl.trainer.packing import SEGMENT_ATTENTION, register_segment_attention
    from agentrl.trainer.trainer_config import TrainerConfig

    trajectories = demo_trajectories(args.model, args.groups, args.group_size, args.seed)
    tokens = sum(len(t) for t in trajectories)

    def config(share: bool) -> TrainerConfig:
        return TrainerConfig(lr=2e-5, micro_batch_tokens=args.budget, share_prefix=share, max_staleness=2)

    actors = {"actor": Actor(args.model, config(True)), "actor_unshared": Actor(args.model, config(False))}
    batch = prepare_batch(trajectories, version=0, config=config(True))
    register_segment_attention()
    dtype = actors["actor"].compute_dtype
    bare = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32,
                                                attn_implementation=SEGMENT_ATTENTION).to(args.device).train()
    opt = torch.optim.AdamW(bare.parameters(), lr=2e-5)

    def actor_step(actor: Actor):
        def step() -> None:
            batch.version = actor.version  # every step trains on a fresh batch: staleness 0
            actor.train_step(batch)
        return step

    steps = {name: actor_step(a) for name, a in actors.items()}
    steps["bare"] = lambda: bare_step(bare, opt, batch.sequences, args.budget, dtype)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for fn in steps.values():  # warm-up
        fn()
    for _ in range(args.repeats):
        for name, fn in steps.items():
            t0 = time.perf_counter()
            fn()
            if args.device == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t0)
    rate = {name: tokens / statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        print(f"{name:>15}: median {statistics.median(t):.3f} s/step ({', '.join(f'{x:.3f}' for x in t)}), "
              f"{rate[name]:.0f} tokens/s")
    print(json.dumps({
        "benchmark": "trainer", "sequences": len(trajectories), "tokens": tokens, "threads": args.threads,
        "device": args.device, "dtype": str(dtype).removeprefix("torch."),
        "budget": args.budget, "repeats": args.repeats,
        **{f"{name}_s_per_step": round(statistics.median(t), 4) for name, t in times.items()},
        **{f"{name}_tokens_per_s": round(r, 1) for name, r in rate.items()},
        "ratio": round(rate["actor"] / rate["bare"], 3),
        "ratio_unshared": round(rate["actor_unshared"] / rate["bare"], 3),
    }))


if __name__ == "__main__":
    main()
