"""Training throughput of packed vs padded micro-batches on a heavy-tailed length mix.

What is measured: real (non-padding) tokens per second of one train step — forward, token
log-probabilities, the decoupled PPO loss, backward over every micro-batch, then one AdamW
step — on the tiny model in float32 on CPU. The batch is 96 sequences whose lengths follow a
log-normal law (median 48 tokens, a few up to 1024: many short, few long, as RL rollouts are).

  * packed (agentrl): micro-batches filled to ``--budget`` tokens by first-fit decreasing,
    each one row with restarting position ids and block-diagonal causal attention
    (``agentrl.trainer.packing``; the path ``Actor.train_step`` takes);
  * padded (baseline): ``--rows`` sequences per micro-batch in arrival order, right-padded
    to the longest of them, with a 2-D padding mask — the usual data-loader layout.

The packed side's attention is ``--attn``: ``sdpa_segments`` (one causal SDPA call per packed
sequence, the actor's CPU default) or ``sdpa``/``eager`` with the explicit [T, T] block mask.
Both sides use the same initial weights, loss code, threads and data; after one warm-up step
each, packed and padded steps alternate ``--repeats`` times (so both see the same machine
load) and the fastest step of each is reported (``median_ratio`` too). Last line: one JSON
object with ``"ratio"`` = packed tokens/s ÷ padded tokens/s. Usage::

    .venv/bin/python benchmarks/packing.py [--threads 2] [--budget 1024] [--rows 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import tempfile
import time

import torch


def heavy_tailed_lengths(n: int, seed: int, median: float = 48.0, sigma: float = 1.0,
                         lo: int = 8, hi: int = 1024) -> list[int]:
    rng = random.Random(seed)
    return [max(lo, min(hi, int(rng.lognormvariate(math.log(median), sigma)))) for _ in range(n)]


def make_sequences(lengths: list[int], seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for n in lengths:
        prompt = max(1, n // 4)
        mask = torch.zeros(n)
        mask[prompt:] = 1.0
        seqs.append({
            "input_ids": torch.randint(0, 256, (n,), generator=g),
            "loss_mask": mask,
            "behaviour_logprobs": (-5.6 + 0.1 * torch.randn(n, generator=g)) * mask,
            "advantages": torch.randn(1, generator=g) * mask,
        })
    return seqs


def packed_step(model, opt, seqs, budget, total_tokens, attn):
    from agentrl.trainer.losses import policy_loss
    from agentrl.trainer.packing import first_fit_decreasing, pack, token_logprobs

    lengths = [int(s["input_ids"].numel()) for s in seqs]
    for mb in first_fit_decreasing(lengths, budget):
        p = pack(seqs, mb)
        logits = model(input_ids=p.input_ids, position_ids=p.position_ids,
                       attention_mask=p.attention_mask(attn), use_cache=False).logits
        logp, _ = token_logprobs(logits, p.input_ids, p.sources)
        f = p.fields
        loss, _ = policy_loss("decoupled_ppo", logp[0], f["behaviour_logprobs"], f["advantages"],
                              f["loss_mask"], total_loss_tokens=total_tokens, proximal_logprobs=logp[0].detach())
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def padded_step(model, opt, seqs, rows, total_tokens, pad_id):
    from agentrl.trainer.losses import policy_loss
    from agentrl.trainer.packing import pad, token_logprobs

    for start in range(0, len(seqs), rows):
        q = pad(seqs, list(range(start, min(start + rows, len(seqs)))), pad_id)
        logits = model(input_ids=q.input_ids, attention_mask=q.attention_mask, use_cache=False).logits
        logp, _ = token_logprobs(logits, q.input_ids)
        f = q.fields
        loss, _ = policy_loss("decoupled_ppo", logp, f["behaviour_logprobs"], f["advantages"],
                              f["loss_mask"], total_loss_tokens=total_tokens, proximal_logprobs=logp.detach())
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def timed_pair(a, b, repeats: int) -> tuple[list[float], list[float]]:
    """Alternate a and b (after one warm-up each) so both see the same machine load."""
    a(), b()
    ta, tb = [], []
    for _ in range(repeats):
        for fn, times in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return ta, tb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sequences", type=int, default=96)
    ap.add_argument("--budget", type=int, default=1024, help="packed: tokens per micro-batch")
    ap.add_argument("--rows", type=int, default=8, help="padded: sequences per micro-batch")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attn", default="sdpa_segments", choices=("sdpa_segments", "sdpa", "eager"),
                    help="packed side's attention: per-sequence SDPA, or SDPA/eager with the block mask")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    from agentrl.model.tinymodel import init_tiny_model
    from agentrl.trainer.packing import register_segment_attention

    register_segment_attention()
    with tempfile.TemporaryDirectory() as d:
        init_tiny_model(d, seed=0)
        packed_model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation=args.attn)
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="sdpa")
    packed_model.train()
    model.train()
    packed_opt = torch.optim.AdamW(packed_model.parameters(), lr=1e-6)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    lengths = heavy_tailed_lengths(args.sequences, args.seed)
    seqs = make_sequences(lengths, args.seed)
    real = sum(lengths)
    total_loss_tokens = float(sum(s["loss_mask"].sum() for s in seqs))
    padded_tokens = sum(len(lengths[i:i + args.rows]) * max(lengths[i:i + args.rows])
                        for i in range(0, len(lengths), args.rows))
    from agentrl.trainer.packing import first_fit_decreasing

    bins = first_fit_decreasing(lengths, args.budget)

    times_packed, times_padded = timed_pair(
        lambda: packed_step(packed_model, packed_opt, seqs, args.budget, total_loss_tokens, args.attn),
        lambda: padded_step(model, opt, seqs, args.rows, total_loss_tokens, model.config.pad_token_id),
        args.repeats)
    # the fastest of the repeats: the least disturbed by other processes on a shared machine
    t_packed, t_padded = min(times_packed), min(times_padded)
    packed_tps, padded_tps = real / t_packed, real / t_padded
    print(f"lengths: n={len(lengths)} median={statistics.median(lengths)} max={max(lengths)} real tokens={real}")
    print(f"packed: {len(bins)} micro-batches, {t_packed:.3f} s/step, {packed_tps:.0f} real tokens/s")
    print(f"padded: {math.ceil(len(lengths) / args.rows)} micro-batches, {padded_tokens} tokens incl. padding "
          f"({1 - real / padded_tokens:.0%} padding), {t_padded:.3f} s/step, {padded_tps:.0f} real tokens/s")
    print(json.dumps({
        "benchmark": "packing",
        "sequences": len(lengths), "real_tokens": real, "padded_tokens": padded_tokens,
        "packed_micro_batches": len(bins), "budget": args.budget, "rows": args.rows, "threads": args.threads,
        "attn": args.attn, "packed_s_per_step": round(t_packed, 4), "padded_s_per_step": round(t_padded, 4),
        "median_ratio": round(statistics.median(times_padded) / statistics.median(times_packed), 3),
        "packed_tokens_per_s": round(packed_tps, 1), "padded_tokens_per_s": round(padded_tps, 1),
        "ratio": round(packed_tps / padded_tps, 3),
    }))


if __name__ == "__main__":
    main()
