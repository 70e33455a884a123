"""How long generation stops for one weight update: from disk vs over torch.distributed.

What is measured: ``PublishRecord.paused_s`` of the real ``WeightPublisher`` — the time from
``before_pause`` to the end of ``/continue_generation``, i.e. while generation is stopped by
one update — publishing to one real ``agentrl serve`` process, with the transports of
``agentrl.trainer.publish`` taking turns on the same model, server and process:

  * disk (baseline): the trainer writes an HF checkpoint *before* the pause (staging, not
    counted), then pause → ``/update_weights_from_disk`` (the server reads, checks and lays out
    every tensor) → continue;
  * distributed (what ``agentrl train`` does against ``agentrl serve``): the trainer gathers the
    state dict into memory (and flattens it into SGLang's ``flattened_bucket``; ``--no-flatten``:
    one broadcast per tensor), then *delivers* it while the server may generate —
    ``/update_weights_from_distributed`` per bucket with ``agentrl_stage_only`` while rank 0
    broadcasts it over a gloo group with the server (received, checked, laid out into a staging
    copy) — and only then pause → ``/agentrl/commit_staged_weights`` (the swap) → continue;
  * distributed in the pause (for reference: SGLang's protocol, what a real SGLang server
    gets): pause → every bucket → continue.

All stage outside the pause, so the ratio compares only what generation waits for. On one
machine the server reads the checkpoint back from the page cache the trainer's write just
filled (a memory copy); the broadcast crosses loopback TCP — neither is a network.
The trainer here is one process with a 1-rank gloo default group (what ``agentrl train`` runs
with ``world_size: 1``) holding the model in float32 on CPU; the server runs with one thread
and is idle (no requests to abort), so the pause is the transfer and the swap alone. Each
transport publishes ``--repeats`` times, alternating (both see the same machine load); the
median of each is reported, with its fastest.

Models: ``tiny`` (the committed demo model, examples/tiny-model, 1.0 M parameters) or
``qwen2-100m`` (a randomly initialised Qwen2 of ~100 M parameters — hidden 1024, 8 layers, 16
heads, 4 key/value heads, MLP 3200, tied embeddings — built here with transformers'
``Qwen2Config``, with the tiny model's tokenizer). Last line: one JSON object with
``"ratio"`` = disk pause ÷ distributed pause (> 1: the broadcast stops generation for less),
the pauses in seconds (``distributed_in_pause_s``: the reference's), the delivery's seconds,
the model's parameters and bytes, and ``"publish_ratio"``: disk (staging + pause) ÷
distributed (staging + delivery + pause), what the trainer waits for before its next step.
Usage::

    .venv/bin/python benchmarks/weight_sync.py [--model tiny|qwen2-100m] [--repeats 5] [--no-flatten]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path

import torch

from agentrl.process.services import ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "tiny-model"


def build_qwen2_100m(out: Path) -> Path:
    """A randomly initialised ~100 M-parameter Qwen2 checkpoint with the tiny model's tokenizer."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=264, hidden_size=1024, intermediate_size=3200, num_hidden_layers=8,
                         num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=1024,
                         tie_word_embeddings=True, eos_token_id=257, pad_token_id=256, bos_token_id=None)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(str(out))
    for f in TINY.iterdir():
        if f.name.startswith(("tokenizer", "chat_template", "generation_config")):
            shutil.copy2(f, out / f.name)
    return out


def model_dir_for(name: str, work: Path) -> Path:
    """``--model``: ``tiny`` (the committed demo model), ``qwen2-100m`` (built in ``work``) or a directory."""
    if name == "tiny":
        return TINY
    if name == "qwen2-100m":
        return build_qwen2_100m(work / "qwen2-100m")
    return Path(name)


def model_size(model: torch.nn.Module) -> tuple[int, int]:
    """Parameters and bytes of the weights a publish sends (shared tensors once)."""
    seen = {p.data_ptr(): p for p in model.parameters()}
    return sum(p.numel() for p in seen.values()), sum(p.numel() * p.element_size() for p in seen.values())


async def measure(model, model_dir: Path, url: str, work: Path, repeats: int, flatten: bool) -> dict[str, list[float]]:
    from agentrl.client import RemoteEngine
    from agentrl.trainer.publish import DiskTransport, DistributedTransport, WeightPublisher

    disk = DiskTransport(work / "weights", source_dir=model_dir, keep_last=1)
    broadcast = DistributedTransport(master_address="127.0.0.1", backend="gloo", flatten=flatten)
    in_pause = DistributedTransport(master_address="127.0.0.1", backend="gloo", flatten=flatten, overlap=False,
                                    group_name="agentrl_weights_in_pause")
    transports = (("disk", disk), ("distributed", broadcast), ("distributed_in_pause", in_pause))
    times: dict[str, list[float]] = {f"{n}{k}": [] for n, _ in transports for k in ("", "_stage", "_deliver")}
    async with RemoteEngine(url) as engine:
        version = 0
        for i in range(repeats + 1):  # the first round warms every path up (the groups are formed there)
            for name, transport in transports:
                version += 1
                record = await WeightPublisher(transport, engine).apublish(model, version)
                if i:
                    times[name].append(record.paused_s)
                    times[f"{name}_stage"].append(record.stage_s)
                    times[f"{name}_deliver"].append(record.deliver_s)
        assert broadcast.staging and not in_pause.staging, "the distributed transport did not overlap"
        await broadcast.close(engine)
        await in_pause.close(engine)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="tiny, qwen2-100m, or an HF checkpoint directory")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-flatten", action="store_true", help="one broadcast per tensor (received straight into "
                    "place) instead of SGLang's flattened_bucket")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory(prefix="agentrl-weight-sync-") as tmp:
        work = Path(tmp)
        model_dir = model_dir_for(args.model, work)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
        try:
            model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
            params, nbytes = model_size(model)
            with ServerProcess(model_dir, "--context-length", "256", "--max-running-requests", "4",
                               "--weight-version", "0", startup_timeout=600) as server:
                times = asyncio.run(measure(model, model_dir, server.url, work, args.repeats, not args.no_flatten))
        finally:
            dist.destroy_process_group()
    med = {k: statistics.median(v) for k, v in times.items()}
    disk_s, dist_s = med["disk"], med["distributed"]
    print(json.dumps({
        "benchmark": "weight_sync", "model": args.model, "parameters": params, "bytes": nbytes,
        "repeats": args.repeats, "flattened_bucket": not args.no_flatten,
        "disk_pause_s": round(disk_s, 4), "distributed_pause_s": round(dist_s, 4),
        "disk_pause_min_s": round(min(times["disk"]), 4), "distributed_pause_min_s": round(min(times["distributed"]), 4),
        "distributed_in_pause_s": round(med["distributed_in_pause"], 4),
        "disk_stage_s": round(med["disk_stage"], 4), "distributed_stage_s": round(med["distributed_stage"], 4),
        "distributed_deliver_s": round(med["distributed_deliver"], 4),
        # the trainer waits for the whole publish (staging and delivery too) before its next step
        "publish_ratio": round((disk_s + med["disk_stage"])
                               / (dist_s + med["distributed_stage"] + med["distributed_deliver"]), 3),
        "ratio": round(disk_s / dist_s, 3),
    }), flush=True)


if __name__ == "__main__":
    main()
