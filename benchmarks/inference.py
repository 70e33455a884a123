"""Inference throughput of ``agentrl serve`` vs ``transformers.generate``, and interruption cost.

Default mode: 256 chat prompts on the tiny model, each with its own output length drawn
log-uniformly between 16 and 256 new tokens (RL outputs are long-tailed), enforced with
``ignore_eos``; temperature 1 for both sides. Measured: useful generated tokens per second of
a real ``agentrl serve`` process (at most 64 requests running at once) driven through
``RemoteEngine``, against ``transformers``' ``generate`` on the same model and prompts in
static batches of 64 (each batch runs until its longest request is done; tokens past a
request's own length do not count). Both sides use the same number of torch threads; the
default is one, so that on a 2-core machine the server's compute thread and the client process
driving it each have a core (``--threads 2`` gives both sides two and makes them share).

``--interrupt``: 64 requests of 400 tokens in flight while the client publishes 5 weight
updates (pause -> update_weights_from_disk -> resume, alternating two checkpoints); reports
how many requests completed, tokens lost (must be 0) and the pause-to-resume time.

Last line: one JSON object. Usage::

    .venv/bin/python benchmarks/inference.py [--model DIR] [--threads 1] [--interrupt]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

from agentrl.process.services import ServerProcess

ROOT = Path(__file__).resolve().parents[1]


def make_prompts(tokenizer, n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        q = f"What is {rng.randint(0, 99)}+{rng.randint(0, 99)}+{rng.randint(0, 99)}?"
        text = tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                             tokenize=False)
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    return prompts


def log_uniform_lengths(n: int, lo: int, hi: int, seed: int) -> list[int]:
    rng = random.Random(seed + 1)
    return [int(round(math.exp(rng.uniform(math.log(lo), math.log(hi))))) for _ in range(n)]


async def run_engine(url: str, prompts, lengths, concurrency: int = 64) -> tuple[float, dict]:
    import httpx

    from agentrl.api import SamplingParams
    from agentrl.client.remote_engine import RemoteEngine

    gate = asyncio.Semaphore(concurrency)
    async with RemoteEngine([url], timeout=600) as engine:
        async def one(p, n):
            async with gate:
                out = await engine.generate(p, SamplingParams(max_new_tokens=n, temperature=1.0, ignore_eos=True))
            assert len(out.tokens) == n, (len(out.tokens), n)

        await asyncio.gather(*(one(p, n) for p, n in zip(prompts[:8], lengths[:8], strict=True)))  # warm-up
        async with httpx.AsyncClient(timeout=30) as http:
            before = (await http.get(url + "/server_info")).json()["internal_states"][0]
            t0 = time.perf_counter()
            await asyncio.gather(*(one(p, n) for p, n in zip(prompts, lengths, strict=True)))
            wall = time.perf_counter() - t0
            after = (await http.get(url + "/server_info")).json()["internal_states"][0]
        keys = ("num_decode_steps", "num_prefill_calls", "prefill_seconds", "decode_seconds")
        return wall, {k: round(after[k] - before[k], 3) for k in keys}


def run_hf(model_dir: Path, prompts, lengths, batch: int = 64) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0

    def generate(ps, ns) -> None:
        width = max(len(p) for p in ps)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in ps])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps])
        steps = max(ns)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0,
                                 top_k=0, max_new_tokens=steps, min_new_tokens=steps, pad_token_id=pad)
        assert out.shape[1] == width + steps

    generate(prompts[:8], [16] * 8)  # warm-up
    t0 = time.perf_counter()
    for i in range(0, len(prompts), batch):
        generate(prompts[i : i + batch], lengths[i : i + batch])
    return time.perf_counter() - t0


async def run_interrupt(url: str, prompts, ckpts: list[Path], updates: int, new_tokens: int) -> dict:
    from agentrl.api import SamplingParams
    from agentrl.client.remote_engine import RemoteEngine

    async with RemoteEngine([url], timeout=600) as engine:
        sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True)
        jobs = [asyncio.create_task(engine.generate(p, sampling)) for p in prompts]
        pauses, phases = [], []
        for v in range(1, updates + 1):
            await asyncio.sleep(0.5)
            t0 = time.perf_counter()
            await engine.pause()
            t1 = time.perf_counter()
            await engine.update_weights(str(ckpts[v % 2]), v)
            t2 = time.perf_counter()
            await engine.resume()
            t3 = time.perf_counter()
            pauses.append(t3 - t0)
            phases.append((t1 - t0, t2 - t1, t3 - t2))
        outs = await asyncio.gather(*jobs)
    complete = [o for o in outs if o.finish_reason == "length" and len(o.tokens) == new_tokens]
    monotone = all(o.versions == sorted(o.versions) for o in outs)
    return {
        "mode": "interrupt", "requests": len(prompts), "completed": len(complete),
        "tokens_lost": sum(new_tokens - len(o.tokens) for o in outs), "updates": updates,
        "versions_monotone": monotone, "max_versions_in_one_request": max(len(set(o.versions)) for o in outs),
        "resumes": engine.stats["resumes"], "pause_to_resume_s": round(sum(pauses) / len(pauses), 4),
        "pause_to_resume_max_s": round(max(pauses), 4),
        "mean_pause_s": round(sum(p[0] for p in phases) / updates, 4),
        "mean_update_s": round(sum(p[1] for p in phases) / updates, 4),
        "mean_continue_s": round(sum(p[2] for p in phases) / updates, 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "examples" / "tiny-model",
                    help="checkpoint (default examples/tiny-model; an untrained tiny model if absent)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both sides (default 1)")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--interrupt", action="store_true", help="measure interruption instead of throughput")
    args = ap.parse_args()

    import torch
    from transformers import AutoTokenizer

    from agentrl.model.tinymodel import init_tiny_model

    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="agentrl-bench-"))
    model = args.model
    if not (model / "config.json").is_file():
        print(f"{model} not found: using an untrained tiny model", file=sys.stderr)
        model = tmp / "untrained"
        init_tiny_model(model, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = make_prompts(tokenizer, args.prompts, args.seed)

    if args.interrupt:
        other = tmp / "other"
        init_tiny_model(other, seed=1)
        with ServerProcess(model, "--max-running-requests", "64", "--weight-version", "0",
                           threads=args.threads, startup_timeout=300) as server:
            result = asyncio.run(run_interrupt(server.url, prompts[:64], [model, other], updates=5, new_tokens=400))
        result.update({"model": str(model), "threads": args.threads})
        print(json.dumps(result))
        return

    lengths = log_uniform_lengths(args.prompts, 16, 256, args.seed)
    useful = sum(lengths)
    with ServerProcess(model, "--max-running-requests", "64", threads=args.threads, startup_timeout=300) as server:
        engine_s, engine_stats = asyncio.run(run_engine(server.url, prompts, lengths))
    hf_s = run_hf(model, prompts, lengths)
    engine_tps, hf_tps = useful / engine_s, useful / hf_s
    print(json.dumps({
        "mode": "throughput", "model": str(model), "threads": args.threads, "prompts": args.prompts,
        "useful_tokens": useful, "engine_wall_s": round(engine_s, 3), "hf_wall_s": round(hf_s, 3),
        "engine_tokens_per_s": round(engine_tps, 1), "hf_tokens_per_s": round(hf_tps, 1),
        "ratio": round(engine_tps / hf_tps, 3), "engine": engine_stats,
    }))


if __name__ == "__main__":
    main()
