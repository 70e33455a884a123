"""LoRA against full fine-tuning: what one weight update moves and how long it stops generation,
and the trainer's optimizer state.

What is measured, on one model, server and process (the ~100 M-parameter random Qwen2 of
``benchmarks/weight_sync.py``, or the tiny demo model), with the real ``Actor`` and
``WeightPublisher`` and ``trainer.weight_sync.transport: disk`` (the only transport of a LoRA
run) publishing to one real ``agentrl serve``:

  * full (baseline): an ``Actor`` without LoRA; each publish writes the HF checkpoint before the
    pause and the server loads it in the pause (``/update_weights_from_disk``);
  * lora: an ``Actor`` with ``trainer.lora`` (``--rank``, the default target modules: q, k, v,
    o, gate, up, down); each publish writes the adapter alone (peft's files), the server reads
    and merges it into a staging copy of its base weights before the pause (``deliver``), and
    the pause swaps it in.

Each actor takes one train step first (so AdamW holds its moments, and the adapter is not zero),
then the two publish ``--repeats`` times, alternating (both see the same machine load); medians
are reported. ``bytes_*``: the size of the directory one publish writes (what the servers read);
``pause_*``: ``PublishRecord.paused_s`` (pause → update → continue, the server idle);
``stage_*``/``deliver_lora_s``: the trainer's export and the server's staging, before the pause;
``optimizer_state_bytes_*``: the bytes of every tensor in AdamW's state after the step (for the
full model, the moments of every weight; for LoRA, of the adapters alone). Last line: one JSON
object; ``ratio_pause`` = full pause ÷ LoRA pause, ``ratio_bytes`` and ``ratio_optimizer_state``
likewise (> 1: LoRA moves, waits or holds less). Usage::

    .venv/bin/python benchmarks/lora.py [--model qwen2-100m|tiny] [--rank 16] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from weight_sync import model_dir_for  # noqa: E402 (the benchmark beside this one)

from agentrl.process.services import ServerProcess  # noqa: E402


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())


def optimizer_state_bytes(actor) -> int:
    total = 0
    for state in actor.optimizer.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                local = v.to_local() if hasattr(v, "to_local") else v
                total += local.numel() * local.element_size()
    return total


def one_step(actor) -> None:
    """One train step on a small random batch (the moments exist after it)."""
    from agentrl.api import Trajectory
    from agentrl.trainer.batch import prepare_batch

    g = torch.Generator().manual_seed(0)
    trajs = []
    for i in range(4):
        ids = torch.randint(0, 250, (48,), generator=g).tolist()
        trajs.append(Trajectory(input_ids=ids, loss_mask=[0] * 16 + [1] * 32, logprobs=[0.0] * 16 + [-5.5] * 32,
                                versions=[-1] * 16 + [0] * 32, reward=float(i % 2), group_id="g", episode_id=f"e{i}"))
    actor.train_step(prepare_batch(trajs, version=0, config=actor.config))


async def measure(actors: dict, model_dir: Path, url: str, work: Path, repeats: int) -> dict[str, list[float]]:
    from agentrl.client import RemoteEngine
    from agentrl.trainer.publish import DiskTransport, WeightPublisher

    times: dict[str, list[float]] = {f"{n}{k}": [] for n in actors for k in ("", "_stage", "_deliver", "_bytes")}
    async with RemoteEngine(url) as engine:
        version = 0
        for i in range(repeats + 1):  # the first round warms every path up
            for name, actor in actors.items():
                version += 1
                transport = DiskTransport(work / name, source_dir=model_dir, keep_last=1)
                record = await WeightPublisher(transport, engine).apublish(actor.model, version)
                if i:
                    times[name].append(record.paused_s)
                    times[f"{name}_stage"].append(record.stage_s)
                    times[f"{name}_deliver"].append(record.deliver_s)
                    times[f"{name}_bytes"].append(dir_bytes(Path(record.path)))
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2-100m", help="qwen2-100m, tiny, or an HF checkpoint directory")
    ap.add_argument("--rank", type=int, default=16, help="trainer.lora.rank (default 16)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)

    from agentrl.run.local_launcher import one_rank_group
    from agentrl.trainer.actor import Actor
    from agentrl.trainer.trainer_config import LoraConfig, TrainerConfig

    with tempfile.TemporaryDirectory(prefix="agentrl-lora-") as tmp:
        work = Path(tmp)
        model_dir = model_dir_for(args.model, work)
        with one_rank_group():
            actors = {"full": Actor(model_dir, TrainerConfig(lr=1e-4)),
                      "lora": Actor(model_dir, TrainerConfig(lr=1e-4, lora=LoraConfig(rank=args.rank)))}
            for actor in actors.values():
                one_step(actor)
            state = {name: optimizer_state_bytes(a) for name, a in actors.items()}
            trainable = {name: sum(p.numel() for p in a.model.parameters() if p.requires_grad)
                         for name, a in actors.items()}
            with ServerProcess(model_dir, "--context-length", "256", "--max-running-requests", "4",
                               "--weight-version", "0", startup_timeout=600) as server:
                times = asyncio.run(measure(actors, model_dir, server.url, work, args.repeats))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(json.dumps({
        "benchmark": "lora", "model": args.model, "rank": args.rank, "repeats": args.repeats,
        "trainable_parameters_full": trainable["full"], "trainable_parameters_lora": trainable["lora"],
        "bytes_full": int(med["full_bytes"]), "bytes_lora": int(med["lora_bytes"]),
        "pause_full_s": round(med["full"], 4), "pause_lora_s": round(med["lora"], 4),
        "pause_full_min_s": round(min(times["full"]), 4), "pause_lora_min_s": round(min(times["lora"]), 4),
        "stage_full_s": round(med["full_stage"], 4), "stage_lora_s": round(med["lora_stage"], 4),
        "deliver_lora_s": round(med["lora_deliver"], 4),
        "optimizer_state_bytes_full": state["full"], "optimizer_state_bytes_lora": state["lora"],
        "ratio_bytes": round(med["full_bytes"] / med["lora_bytes"], 2),
        "ratio_optimizer_state": round(state["full"] / state["lora"], 2),
        "ratio_pause": round(med["full"] / med["lora"], 3),
    }), flush=True)


if __name__ == "__main__":
    main()
