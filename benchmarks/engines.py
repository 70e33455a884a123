"""``agentrl serve`` against vLLM (its CPU build, ``make vllm``), both driven through ``RemoteEngine``.

Same model, same torch threads, same sampling (T = 1). Both servers run at once but only one
generates at a time (an idle one waits on its queue), and the rounds alternate between them —
A then B, then B then A — so that a change in the machine's load between the start and the end
of the run falls on both alike (one engine's rounds all before the other's skewed the ratio on
a shared machine). Two workloads:

* ``demo``: the demo's rollout — 16 prompts x n = 16 samples x 12 new tokens, as
  ``generate_group`` calls started together; measured in samples per second.
* ``long``: ``benchmarks/inference.py``'s long-tailed one — 256 prompts, each with its own
  output length drawn log-uniformly in [16, 256], ``ignore_eos``, at most 64 in flight;
  measured in generated tokens per second.

Each is run ``--reps`` times after a warm-up; the median counts. Last line: one JSON object
with ``ratio_demo`` and ``ratio_long`` (agentrl serve / vLLM; above 1: agentrl serve is faster).

    .venv/bin/python benchmarks/engines.py [--model DIR] [--threads 1] [--reps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inference import log_uniform_lengths, make_prompts  # noqa: E402

from agentrl.api import SamplingParams  # noqa: E402
from agentrl.client import RemoteEngine  # noqa: E402
from agentrl.config import load_config  # noqa: E402
from agentrl.process.services import ServerProcess, free_port, stop_process  # noqa: E402
from agentrl.run.local_launcher import ensure_server_key, vllm_command, vllm_python, wait_healthy  # noqa: E402
from agentrl.run.run_config import RunConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


async def demo_round(engine: RemoteEngine, prompts: list[list[int]]) -> float:
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0)
    t0 = time.perf_counter()
    groups = await asyncio.gather(*(engine.generate_group(p, sampling, 16) for p in prompts))
    wall = time.perf_counter() - t0
    assert sum(len(g) for g in groups) == 16 * len(prompts)
    return 16 * len(prompts) / wall


async def long_round(engine: RemoteEngine, prompts: list[list[int]], lengths: list[int]) -> float:
    gate = asyncio.Semaphore(64)

    async def one(p: list[int], n: int) -> None:
        async with gate:
            out = await engine.generate(p, SamplingParams(max_new_tokens=n, temperature=1.0, ignore_eos=True))
        assert len(out.tokens) == n, (len(out.tokens), n)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(p, n) for p, n in zip(prompts, lengths, strict=True)))
    return sum(lengths) / (time.perf_counter() - t0)


async def measure(urls: dict[str, str], demo_prompts, long_prompts, lengths, reps: int) -> dict[str, dict]:
    """Each engine's demo and long rounds, ``reps`` of each, alternating between the engines."""
    results = {name: {"demo_samples_per_s": [], "long_tokens_per_s": []} for name in urls}
    async with contextlib.AsyncExitStack() as stack:
        engines = {name: await stack.enter_async_context(RemoteEngine([url])) for name, url in urls.items()}
        for engine in engines.values():  # warm-up
            await demo_round(engine, demo_prompts[:4])
            await long_round(engine, long_prompts[:16], lengths[:16])
        for rep in range(reps):
            order = list(engines) if rep % 2 == 0 else list(engines)[::-1]
            for name in order:
                results[name]["demo_samples_per_s"].append(round(await demo_round(engines[name], demo_prompts), 1))
            for name in order:
                results[name]["long_tokens_per_s"].append(
                    round(await long_round(engines[name], long_prompts, lengths), 1))
        for name, engine in engines.items():
            results[name]["api"] = type(engine._backend).__name__  # the backend auto detected
    return results


@contextlib.contextmanager
def both_servers(model: str, threads: int, max_running: int = 256, context_length: int | None = None,
                 serve_args: tuple[str, ...] = ()) -> Iterator[dict[str, str]]:
    """``agentrl serve`` (with ``serve_args`` too) and vLLM's CPU server on ``model``, each with ``threads``
    torch threads and one key (both servers and the clients take it), at most ``context_length`` tokens a
    request (default: each engine's): yields their URLs by name, stops both after."""
    limit = ([] if context_length is None else [f"inference.extra_args=[--max-model-len,{context_length}]"])
    cfg = load_config(RunConfig, None, [f"model={model}", "inference.engine=vllm", f"inference.threads={threads}",
                                        f"inference.max_running_requests={max_running}", *limit])
    if vllm_python(cfg) is None:
        sys.exit("benchmarks: vLLM is not installed; run `make vllm`")
    port = free_port()
    cmd, env = vllm_command(cfg, "127.0.0.1", port, 0, ensure_server_key())
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        ours = [] if context_length is None else ["--context-length", str(context_length)]
        with ServerProcess(model, "--max-running-requests", str(max_running), *ours, *serve_args, threads=threads,
                           startup_timeout=600) as server:
            wait_healthy(f"http://127.0.0.1:{port}", proc, 600, Path(log.name), route="/health")
            yield {"agentrl": server.url, "vllm": f"http://127.0.0.1:{port}"}
    finally:
        stop_process(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "examples" / "tiny-model"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    demo_prompts, long_prompts = make_prompts(tok, 16, seed=1), make_prompts(tok, 256, seed=2)
    lengths = log_uniform_lengths(256, 16, 256, seed=2)

    print(f"agentrl serve and vLLM ({args.threads} thread(s) each) ...", file=sys.stderr, flush=True)
    with both_servers(args.model, args.threads) as urls:
        results = asyncio.run(measure(urls, demo_prompts, long_prompts, lengths, args.reps))
    ours, theirs = results["agentrl"], results["vllm"]
    print(f"  agentrl serve: {ours}\n  vLLM: {theirs}", file=sys.stderr, flush=True)
    med = statistics.median
    print(json.dumps({
        "benchmark": "engines", "threads": args.threads, "reps": args.reps,
        "ratio_demo": round(med(ours["demo_samples_per_s"]) / med(theirs["demo_samples_per_s"]), 3),
        "ratio_long": round(med(ours["long_tokens_per_s"]) / med(theirs["long_tokens_per_s"]), 3),
        "agentrl": ours, "vllm": theirs,
    }))


if __name__ == "__main__":
    main()
