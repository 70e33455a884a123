"""Rollout throughput of the demo's GRPO step: ``agentrl serve`` + ``RemoteEngine`` vs in-process ``generate``.

The workload is the demo's (``examples/grpo_arith.py``): 16 Arith-v0 problems x 16 samples at
temperature 1, at most 12 new tokens, on the tiny model. Measured, alternating step by step so
that both sides see the same machine load:

  * **engine**: the demo's own rollout (``run_episodes`` with ``workflows.env:EnvWorkflow``:
    env reset → chat template → ``RemoteEngine.generate`` → reply → env reward, one coroutine
    per sample) against a real ``agentrl serve`` process (256 slots, prefix cache on);
  * **hf**: the same 256 samples in process — one ``transformers`` ``generate`` call on the 16
    chat-templated prompts with ``num_return_sequences=16`` (``do_sample``, temperature 1, no
    top-k/top-p, the same 12-token budget, stopping at EOS), the replies decoded and scored by
    the same env.

Both sides use the same number of torch threads (default one: on a 2-core machine the server's
compute thread and the client process driving it each get a core). ``ratio`` is engine samples/s
over hf samples/s. ``--demo-steps N`` also runs the demo itself (as ``make demo`` does, with its
own thread setting) for N GRPO steps and reports its step time (rollout + train + publish, the
first step left out as warm-up).

Last line: one JSON object. Usage::

    .venv/bin/python benchmarks/rollout.py [--steps 5] [--threads 1] [--demo-steps 0]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentrl.process.services import ServerProcess, run_async

ROOT = Path(__file__).resolve().parents[1]


def load_demo():
    """``examples/grpo_arith.py`` as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("grpo_arith", ROOT / "examples" / "grpo_arith.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def problems(count: int, step: int) -> list[dict]:
    from agentrl.model.arith_data import generate_problems

    return [p.to_row() for p in generate_problems(count, seed=1000 + step)]


async def hf_rollout(model, tokenizer, envs, rows, samples: int, max_new_tokens: int) -> tuple[int, float]:
    """The same samples with ``transformers.generate`` in process; returns (samples, mean reward)."""
    import torch

    prompts = []
    for env, row in zip(envs, rows, strict=False):
        obs, _ = await env.areset(options={"task": row})
        prompts.append(tokenizer.apply_chat_template(obs, add_generation_prompt=True, tokenize=True)["input_ids"])
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=max_new_tokens, num_return_sequences=samples, pad_token_id=pad)
    replies = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    rewards = []
    for i, reply in enumerate(replies):
        env = envs[i // samples]
        await env.areset(options={"task": rows[i // samples]})
        rewards.append((await env.astep(reply))[1])
    return len(replies), sum(rewards) / len(rewards)


async def measure(url: str, model_dir: Path, args) -> dict:
    import gymnasium
    import httpx
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.api import SamplingParams
    from agentrl.client.remote_engine import RemoteEngine
    from agentrl.plugins import load_object, register_envs

    demo = load_demo()
    register_envs()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0)
    workflow = load_object("workflows.env:EnvWorkflow")("agentrl/Arith-v0", str(model_dir), sampling)
    hf_envs = [gymnasium.make("agentrl/Arith-v0").unwrapped for _ in range(args.prompts)]
    gc.freeze()  # what is loaded stays: no full GC pass over torch and transformers (either side)
    engine_s, hf_s, engine_reward, hf_reward = [], [], [], []
    async with RemoteEngine(url) as engine, httpx.AsyncClient(timeout=30) as http:
        for step in range(-1, args.steps):  # step -1 warms both sides up
            rows = problems(args.prompts, step)
            if step == 0:
                before = (await http.get(url + "/server_info")).json()["internal_states"][0]
            t0 = time.perf_counter()
            results = await demo.run_episodes(engine, workflow, rows, args.samples, f"s{step}")
            t1 = time.perf_counter()
            n, reward = await hf_rollout(hf, tokenizer, hf_envs, rows, args.samples, args.max_new_tokens)
            t2 = time.perf_counter()
            assert len(results) == n == args.prompts * args.samples, (len(results), n)
            if step >= 0:
                engine_s.append(t1 - t0)
                hf_s.append(t2 - t1)
                engine_reward.append(sum(t.reward for t in results) / len(results))
                hf_reward.append(reward)
        after = (await http.get(url + "/server_info")).json()["internal_states"][0]
    await workflow.aclose()
    for env in hf_envs:
        await env.aclose()
    keys = ("num_decode_steps", "num_prefill_calls", "prefill_seconds", "decode_seconds", "num_prompt_tokens",
            "num_cached_tokens", "num_generated_tokens")
    server = {k: round((after[k] - before[k]) / args.steps, 3) for k in keys}
    server["cache_hit_rate"] = round(server["num_cached_tokens"] / max(server["num_prompt_tokens"], 1), 4)
    samples = args.prompts * args.samples
    return {"engine_step_s": [round(t, 3) for t in engine_s], "hf_step_s": [round(t, 3) for t in hf_s],
            "engine_samples_per_s": round(samples * len(engine_s) / sum(engine_s), 1),
            "hf_samples_per_s": round(samples * len(hf_s) / sum(hf_s), 1),
            "reward_engine": round(statistics.mean(engine_reward), 4), "reward_hf": round(statistics.mean(hf_reward), 4),
            "server_per_rollout": server}


def demo_step_time(model_dir: Path, steps: int, threads: int | None) -> dict:
    """Run the demo for ``steps`` GRPO steps (its own thread setting unless ``threads``); mean
    rollout/train/publish seconds after the first."""
    out = Path(tempfile.mkdtemp(prefix="agentrl-rollout-bench-"))
    cmd = [sys.executable, str(ROOT / "examples" / "grpo_arith.py"), f"model={model_dir}", f"out={out}",
           f"steps={steps}", "eval_problems=16", *([f"threads={threads}"] if threads else [])]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"the demo failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]
    parts = {k: round(statistics.mean(row[k] for row in rows), 3) for k in ("rollout_s", "train_s", "publish_s")}
    return {**parts, "step_s": round(sum(parts.values()), 3), "steps_averaged": len(rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "examples" / "tiny-model", help="checkpoint")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both sides (default 1)")
    ap.add_argument("--steps", type=int, default=5, help="measured rollouts per side (after one warm-up)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--demo-steps", type=int, default=0, help="also time N steps of the demo itself (N >= 2)")
    ap.add_argument("--demo-threads", type=int, default=None, help="the demo's threads (default: its own)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    slots = str(max(64, args.prompts * args.samples))
    with ServerProcess(args.model, "--max-running-requests", slots, threads=args.threads,
                       startup_timeout=300) as server:
        result = run_async(measure(server.url, args.model, args))  # the event loop `agentrl train` runs
    demo = demo_step_time(args.model, args.demo_steps, args.demo_threads) if args.demo_steps >= 2 else None
    print(json.dumps({
        "mode": "rollout", "model": str(args.model), "threads": args.threads, "prompts": args.prompts,
        "samples": args.samples, "max_new_tokens": args.max_new_tokens, "steps": args.steps, **result,
        "ratio": round(result["engine_samples_per_s"] / result["hf_samples_per_s"], 3),
        "demo_step": demo, "load_average": [round(x, 2) for x in os.getloadavg()],
    }))


if __name__ == "__main__":
    main()
