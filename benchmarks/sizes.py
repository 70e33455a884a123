"""Every ratio from the demo's size up to a Qwen3-0.6B-shaped model: where do the lines cross?

What is measured, for each size, both sides in the same run and on the same randomly
initialised Qwen3 checkpoint (built here with transformers' ``Qwen3Config`` and the demo's byte
tokenizer; random weights: speed does not depend on what a model knows, and ``ignore_eos`` fixes
the lengths):

  * engine (``benchmarks/engines.py``'s rounds): ``agentrl serve`` against vLLM's CPU build, both
    started at once, rounds alternating — the demo's rollout (prompts x 16 samples x 12 tokens,
    samples/s), long-tailed generations (``ignore_eos``, tokens/s), and the time to first token
    under load (a 1-token request sent while ``ttft_load`` requests of ``long_max`` tokens decode;
    seconds);
  * trainer (``benchmarks/trainer.py``'s batch and bare step): ``Actor.train_step`` (FSDP2 on
    one rank, prefix sharing, the PPO loss) against a bare PyTorch step (HF model, packed rows,
    REINFORCE loss, AdamW) on the same tokens; each side in a process of its own, one after the
    other (so each one's peak RSS is its own): sequence tokens/s and peak RSS;
  * weight publish (``benchmarks/weight_sync.py`` and ``benchmarks/lora.py``): the pause of one
    update of an idle ``agentrl serve`` from disk, over torch.distributed (delivered before the
    pause) and of a rank-16 LoRA adapter from disk; the bytes each moves.

Sizes (``--sizes``): ``1m`` (the demo's shape: hidden 128, 5 layers), ``25m``, ``100m`` and
``0.5b`` (Qwen3-0.6B's shape — hidden 1024, 28 layers, 16/8 heads of 128, MLP 3072 — with the
byte vocabulary, so 0.44 B parameters: Qwen3-0.6B's without its 151k-token embedding). The
workloads shrink as the model grows (fewer prompts, shorter outputs, a smaller training batch),
so that a 2-core machine finishes; each size's JSON line records the workload it ran.
``--quick``: the smallest workloads and one repetition (a check that everything runs).

Output: one JSON line per size on stdout (and in ``OUT/sizes.jsonl``) with ratios —
``ratio_demo``, ``ratio_long`` (agentrl serve / vLLM throughput), ``ratio_ttft`` (vLLM's time
to first token / ours), ``ratio_trainer`` (actor / bare tokens/s), ``ratio_rss`` (bare peak /
actor peak), ``ratio_publish`` (disk pause / distributed pause) — each above 1 where agentrl's
side is faster or smaller; and ``OUT/sizes.png``, each cost against parameters, log-log. Usage::

    .venv/bin/python benchmarks/sizes.py [--sizes 1m,25m,100m,0.5b] [--quick] [--threads 1] [--out DIR]
        [--reps N] [--engine-only] [--also-serve=--no-prepack-weights]

``--also-serve FLAGS`` measures a change of agentrl serve against itself and the same vLLM: a
second server with FLAGS runs in the same alternating rounds (its ratios: ``ratio_*_also``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engines import both_servers  # noqa: E402 (the benchmarks beside this one)
from engines import measure as engine_rounds  # noqa: E402
from inference import log_uniform_lengths, make_prompts  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {  # hidden, layers, query heads, key-value heads, head dim, MLP
    "1m": (128, 5, 4, 2, 32, 384),
    "25m": (512, 8, 8, 4, 64, 1536),
    "100m": (768, 14, 12, 4, 64, 2304),
    "0.5b": (1024, 28, 16, 8, 128, 3072),
}


@dataclass
class Workload:
    """What one size runs (smaller as the model grows)."""

    demo_prompts: int  # x 16 samples x 12 tokens
    long_prompts: int  # each with a log-uniform length in [16, long_max]
    long_max: int
    ttft_load: int  # requests of long_max tokens decoding while the 1-token probes run
    train_groups: int  # x train_group_size answers of 6-13 tokens
    train_group_size: int
    reps: int  # engine rounds and trainer steps (after one warm-up each)
    publish_reps: int


WORKLOADS = {
    "1m": Workload(16, 64, 128, 32, 16, 16, 3, 3),
    "25m": Workload(8, 64, 128, 32, 8, 8, 2, 2),
    "100m": Workload(4, 32, 64, 16, 4, 4, 1, 1),
    "0.5b": Workload(2, 16, 48, 8, 2, 4, 1, 1),
}
QUICK = Workload(2, 16, 128, 8, 2, 4, 1, 1)


def build_model(size: str, out: Path) -> int:
    """A randomly initialised Qwen3 of ``size`` with the demo's byte tokenizer in ``out``; its parameters."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from agentrl.model.tokenizer import END, PAD, VOCAB_SIZE, save_tokenizer, special_token_ids

    hidden, layers, heads, kv_heads, head_dim, mlp = SHAPES[size]
    ids = special_token_ids()
    config = Qwen3Config(vocab_size=(VOCAB_SIZE + 7) // 8 * 8, hidden_size=hidden, intermediate_size=mlp,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         head_dim=head_dim, max_position_embeddings=1024, tie_word_embeddings=True,
                         bos_token_id=None, eos_token_id=ids[END], pad_token_id=ids[PAD])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(str(out))
    save_tokenizer(out)
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------- engine


async def ttft_rounds(urls: dict[str, str], prompts: list[list[int]], load: int, busy_tokens: int,
                      reps: int) -> dict[str, dict[str, list[float]]]:
    """Each engine's median latency of a 1-token request while ``load`` requests of ``busy_tokens``
    decode, ``reps`` rounds of 4 probes, alternating between the engines; and the share of the probes
    answered while the load was still decoding (below 1: raise ``busy_tokens``)."""
    from agentrl.api import SamplingParams
    from agentrl.client import RemoteEngine

    busy = SamplingParams(max_new_tokens=busy_tokens, temperature=1.0, ignore_eos=True)
    probe = SamplingParams(max_new_tokens=1, temperature=1.0, ignore_eos=True)
    out = {name: {"ttft_s": [], "ttft_under_load": []} for name in urls}
    async with contextlib.AsyncExitStack() as stack:
        engines = {name: await stack.enter_async_context(RemoteEngine([url])) for name, url in urls.items()}
        for rep in range(reps):
            for name in (list(engines) if rep % 2 == 0 else list(engines)[::-1]):
                engine = engines[name]
                background = [asyncio.create_task(engine.generate(prompts[i % len(prompts)], busy))
                              for i in range(load)]
                await asyncio.sleep(0.05)  # the load is admitted
                latencies, loaded = [], 0
                for p in prompts[:4]:
                    t0 = time.perf_counter()
                    await engine.generate(p, probe)
                    latencies.append(time.perf_counter() - t0)
                    loaded += not all(t.done() for t in background)
                await asyncio.gather(*background)
                out[name]["ttft_s"].append(round(statistics.median(latencies), 4))
                out[name]["ttft_under_load"].append(loaded / 4)
    return out


def engine_part(model: Path, work: Workload, threads: int, also: tuple[str, ...] = ()) -> dict:
    """Both engines' rounds; with ``also``, a second ``agentrl serve`` given those flags too
    (``agentrl_also``), in the same rounds: a change measured against the same vLLM and itself."""
    from transformers import AutoTokenizer

    from agentrl.process.services import ServerProcess

    tok = AutoTokenizer.from_pretrained(model)
    demo, long = make_prompts(tok, work.demo_prompts, seed=1), make_prompts(tok, work.long_prompts, seed=2)
    lengths = log_uniform_lengths(work.long_prompts, 16, work.long_max, seed=2)
    running = max(16 * work.demo_prompts, work.ttft_load + 4)
    # KV for `running` requests of 256 tokens each, and a prefix cache of 4,096 tokens (vLLM: 1 GiB of KV):
    # at 0.5b, agentrl serve's defaults would hold 7.5 GiB of cache up front
    serve_args = ("--prefix-cache-tokens", "4096")
    with both_servers(str(model), threads, running, context_length=256, serve_args=serve_args) as urls, \
            contextlib.ExitStack() as stack:
        if also:
            urls["agentrl_also"] = stack.enter_context(ServerProcess(
                model, "--max-running-requests", str(running), "--context-length", "256", *serve_args, *also,
                threads=threads, startup_timeout=600)).url
        result = asyncio.run(engine_rounds(urls, demo, long, lengths, work.reps))
        ttft = asyncio.run(ttft_rounds(urls, long, work.ttft_load, work.long_max, work.reps))
    for name in urls:
        result[name].update(ttft[name])
    return result


# --------------------------------------------------------------------------- trainer (child processes)


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def trainer_side(side: str, model: str, work: Workload, threads: int) -> dict:
    """One side's tokens/s and peak RSS: ``actor`` (``Actor.train_step``) or ``bare`` (a plain step)."""
    import torch
    from trainer import bare_step, demo_trajectories

    from agentrl.run.local_launcher import one_rank_group
    from agentrl.trainer.batch import prepare_batch
    from agentrl.trainer.trainer_config import TrainerConfig

    torch.set_num_threads(threads)
    trajectories = demo_trajectories(model, work.train_groups, work.train_group_size, seed=0)
    config = TrainerConfig(lr=2e-5, share_prefix=True, max_staleness=2)
    batch = prepare_batch(trajectories, version=0, config=config)
    with one_rank_group():
        if side == "actor":
            from agentrl.trainer.actor import Actor

            actor = Actor(model, config)

            def step() -> None:
                batch.version = actor.version  # a fresh batch every step: staleness 0
                actor.train_step(batch)
        else:
            from transformers import AutoModelForCausalLM

            from agentrl.trainer.packing import SEGMENT_ATTENTION, register_segment_attention

            register_segment_attention()
            bare = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32,
                                                        attn_implementation=SEGMENT_ATTENTION).train()
            opt = torch.optim.AdamW(bare.parameters(), lr=2e-5)

            def step() -> None:
                bare_step(bare, opt, batch.sequences, config.micro_batch_tokens, torch.float32)
        step()  # warm-up
        times = []
        for _ in range(work.reps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
    tokens = sum(len(t) for t in trajectories)
    return {"tokens": tokens, "s_per_step": [round(t, 3) for t in times],
            "tokens_per_s": round(tokens / statistics.median(times), 1), "peak_rss_bytes": peak_rss_bytes()}


# --------------------------------------------------------------------------- publish (a child process)


def publish_part(model_dir: str, work: Workload) -> dict:
    """Pauses and bytes of a full update from disk and over torch.distributed, and of a LoRA adapter."""
    import torch
    import torch.distributed as dist
    from lora import measure as lora_publishes
    from lora import one_step
    from transformers import AutoModelForCausalLM
    from weight_sync import measure as full_publishes
    from weight_sync import model_size

    from agentrl.process.services import ServerProcess
    from agentrl.run.local_launcher import one_rank_group
    from agentrl.trainer.actor import Actor
    from agentrl.trainer.trainer_config import LoraConfig, TrainerConfig

    torch.set_num_threads(1)
    model_dir_p = Path(model_dir)
    med = statistics.median
    with tempfile.TemporaryDirectory(prefix="agentrl-sizes-") as tmp, one_rank_group():
        dist.init_process_group("gloo", rank=0, world_size=1)
        with ServerProcess(model_dir_p, "--context-length", "256", "--max-running-requests", "4",
                           "--weight-version", "0", startup_timeout=600) as server:
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            _, nbytes = model_size(model)
            full = asyncio.run(full_publishes(model, model_dir_p, server.url, Path(tmp), work.publish_reps, True))
            del model
            gc.collect()
            actor = Actor(model_dir_p, TrainerConfig(lr=1e-4, lora=LoraConfig(rank=16)))
            one_step(actor)
            lora = asyncio.run(lora_publishes({"lora": actor}, model_dir_p, server.url, Path(tmp) / "lora",
                                              work.publish_reps))
    return {"disk_pause_s": round(med(full["disk"]), 4), "distributed_pause_s": round(med(full["distributed"]), 4),
            "distributed_deliver_s": round(med(full["distributed_deliver"]), 4),
            "lora_pause_s": round(med(lora["lora"]), 4), "lora_deliver_s": round(med(lora["lora_deliver"]), 4),
            "bytes_full": nbytes, "bytes_lora": int(med(lora["lora_bytes"]))}


def child(part: str, model: Path, work: Workload, threads: int) -> dict:
    """``part`` of one size in a fresh process (its own peak RSS, its memory returned after)."""
    cmd = [sys.executable, __file__, "--child", part, "--model", str(model), "--threads", str(threads),
           "--workload", json.dumps(asdict(work))]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


# --------------------------------------------------------------------------- one size, the plot


def engine_ratios(engine: dict, ours: str = "agentrl") -> dict:
    """``ratio_demo``, ``ratio_long`` and ``ratio_ttft`` of the engine ``ours`` against vLLM."""
    med, a, v = statistics.median, engine[ours], engine["vllm"]
    return {"ratio_demo": round(med(a["demo_samples_per_s"]) / med(v["demo_samples_per_s"]), 3),
            "ratio_long": round(med(a["long_tokens_per_s"]) / med(v["long_tokens_per_s"]), 3),
            "ratio_ttft": round(med(v["ttft_s"]) / med(a["ttft_s"]), 3)}


def one_size(size: str, work: Workload, threads: int, tmp: Path, quick: bool, also: tuple[str, ...] = (),
             engine_only: bool = False) -> dict:
    model = tmp / size
    params = build_model(size, model)
    print(f"{size}: {params / 1e6:.1f} M parameters; engines ...", file=sys.stderr, flush=True)
    engine = engine_part(model, work, threads, also)
    row = {"benchmark": "sizes", "size": size, "parameters": params, "threads": threads, "quick": quick,
           "workload": asdict(work), **engine_ratios(engine)}
    if also:
        row |= {"also_serve": list(also), **{f"{k}_also": v for k, v in engine_ratios(engine, "agentrl_also").items()}}
    if engine_only:
        return {**row, "engine": engine}
    print(f"{size}: trainer ...", file=sys.stderr, flush=True)
    trainer = {side: child(f"trainer-{side}", model, work, threads) for side in ("actor", "bare")}
    print(f"{size}: publish ...", file=sys.stderr, flush=True)
    publish = child("publish", model, work, threads)
    return {
        **row,
        "ratio_trainer": round(trainer["actor"]["tokens_per_s"] / trainer["bare"]["tokens_per_s"], 3),
        "ratio_rss": round(trainer["bare"]["peak_rss_bytes"] / trainer["actor"]["peak_rss_bytes"], 3),
        "ratio_publish": round(publish["disk_pause_s"] / publish["distributed_pause_s"], 3),
        "engine": engine, "trainer": trainer, "publish": publish,
    }


def plot(rows: list[dict], path: Path) -> None:
    """Four log-log panels of cost against parameters, one line per side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = statistics.median
    x = [r["parameters"] for r in rows]
    panels = {
        "rollout: seconds per demo sample": {
            e: [1 / med(r["engine"][e]["demo_samples_per_s"]) for r in rows] for e in ("agentrl", "vllm")},
        "generation: ms per long token": {
            e: [1e3 / med(r["engine"][e]["long_tokens_per_s"]) for r in rows] for e in ("agentrl", "vllm")},
        "time to first token under load (s)": {e: [med(r["engine"][e]["ttft_s"]) for r in rows]
                                               for e in ("agentrl", "vllm")},
        "train step: ms per token; publish pause (s)": {
            **{f"train {s}": [1e3 / r["trainer"][s]["tokens_per_s"] for r in rows] for s in ("actor", "bare")},
            **{f"publish {k}": [r["publish"][f"{k}_pause_s"] for r in rows] for k in ("disk", "distributed", "lora")}},
    }
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (title, lines) in zip(axes.flat, panels.items(), strict=True):
        for label, y in lines.items():
            ax.plot(x, y, marker="o", label=label)
        ax.set(xscale="log", yscale="log", title=title, xlabel="parameters")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# --------------------------------------------------------------------------- the loop at one size


LOOP_OVERRIDES = (  # a few steps of the demo's recipe that fit 2 cores: small groups, LoRA, recomputed activations,
    # and a server cache sized to the run (agentrl serve's defaults hold 7.5 GiB of KV up front at 0.5b)
    "rollout.batch_size=4", "rollout.group_size=4", "inference.max_running_requests=16", "eval.dataset=null",
    "inference.extra_args=[--context-length,256,--prefix-cache-tokens,1024]",
    "checkpoint.every_steps=0", "trainer.lora.rank=16", "trainer.lr=1e-4", "trainer.gradient_checkpointing=true",
    "max_minutes=30")


def process_name(proc) -> str:
    """A process's first words (the programs' names, then their first arguments) and its pid."""
    words = [Path(c).name if c.startswith("/") else c for c in proc.cmdline()[:4]]
    return f"{' '.join(words)[:80]} ({proc.pid})"


def loop_part(size: str, steps: int, out: Path, tmp: Path) -> dict:
    """``agentrl train`` on the demo recipe with a random ``size`` model for ``steps`` steps; each
    process's peak RSS (``VmHWM``, read every half second) and the largest sum of them at one time."""
    import psutil

    model = tmp / size
    params = build_model(size, model)
    cmd = [str(Path(sys.executable).parent / "agentrl"), "train", str(ROOT / "examples" / "arith_grpo.yaml"),
           f"model={model}", f"run_dir={out / f'loop-{size}'}", f"steps={steps}", f"trainer.total_steps={steps}",
           *LOOP_OVERRIDES]
    peaks: dict[str, int] = {}
    total = 0
    t0 = time.perf_counter()
    with open(out / f"loop-{size}.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            now = 0
            for p in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error, OSError):
                    rss, name = p.memory_info().rss, process_name(p)
                    hwm = next((int(line.split()[1]) * 1024 for line in open(f"/proc/{p.pid}/status")
                                if line.startswith("VmHWM")), 0)  # none once it has exited
                    peaks[name], now = max(peaks.get(name, 0), hwm), now + rss
            total = max(total, now)
            time.sleep(0.5)
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"benchmarks/sizes.py: agentrl train exited {proc.returncode}; see {out / f'loop-{size}.log'}")
    summary = json.loads((out / f"loop-{size}" / "summary.json").read_text())
    return {"benchmark": "sizes_loop", "size": size, "parameters": params, "steps": steps, "wall_s": round(wall, 1),
            "overrides": list(LOOP_OVERRIDES), "peak_rss_bytes": peaks, "peak_total_rss_bytes": total,
            "summary": {k: v for k, v in summary.items() if not isinstance(v, (dict, list))}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--quick", action="store_true", help="the smallest workloads, one repetition")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each engine and trainer (default 1)")
    ap.add_argument("--out", type=Path, default=None, help="where sizes.jsonl and sizes.png go "
                                                             "(default runs/sizes/<UTC time>)")
    ap.add_argument("--loop", type=int, metavar="STEPS", help="instead: `agentrl train` the demo recipe with the "
                    "first of --sizes for STEPS steps (LoRA, recomputed activations) and report each process's peak RSS")
    ap.add_argument("--plot", nargs="+", type=Path, metavar="JSONL", help="instead: plot the rows of earlier runs' "
                    "sizes.jsonl files (sizes measured in separate runs) into OUT/sizes.png")
    ap.add_argument("--also-serve", default="", metavar="FLAGS", help="a second agentrl serve with these flags "
                    "added (e.g. --also-serve=--no-prepack-weights) in the same engine rounds: its ratios as ratio_*_also")
    ap.add_argument("--reps", type=int, help="engine rounds and trainer steps (default: the size's workload's)")
    ap.add_argument("--engine-only", action="store_true", help="the engines alone (no trainer, publish or plot)")
    ap.add_argument("--child", choices=("trainer-actor", "trainer-bare", "publish"), help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        work = Workload(**json.loads(args.workload))
        if args.child == "publish":
            print(json.dumps(publish_part(args.model, work)))
        else:
            print(json.dumps(trainer_side(args.child.removeprefix("trainer-"), args.model, work, args.threads)))
        return
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SHAPES]
    if unknown or not sizes:
        sys.exit(f"benchmarks/sizes.py: --sizes takes a comma-separated list of {', '.join(SHAPES)}; got {args.sizes!r}")
    out = args.out or ROOT / "runs" / "sizes" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)
    if args.plot:
        rows = [json.loads(line) for f in args.plot for line in f.read_text().splitlines() if line.strip()]
        plot(sorted(rows, key=lambda r: r["parameters"]), out / "sizes.png")
        print(f"wrote {out / 'sizes.png'}", file=sys.stderr)
        return
    rows = []
    from agentrl.process.services import exit_on_signals

    with exit_on_signals("benchmarks/sizes.py"), tempfile.TemporaryDirectory(prefix="agentrl-sizes-") as tmp:
        if args.loop:
            print(json.dumps(loop_part(sizes[0], args.loop, out, Path(tmp))), flush=True)
            return
        for size in sizes:
            work = QUICK if args.quick else WORKLOADS[size]
            if args.reps:
                work = replace(work, reps=args.reps)
            row = one_size(size, work, args.threads, Path(tmp), args.quick, tuple(shlex.split(args.also_serve)),
                           args.engine_only)
            rows.append(row)
            with open(out / "sizes.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    if not args.engine_only:
        plot(rows, out / "sizes.png")
    print(f"wrote {out / 'sizes.jsonl'}" + ("" if args.engine_only else f" and {out / 'sizes.png'}"), file=sys.stderr)


if __name__ == "__main__":
    main()
