"""How ``agentrl serve`` should apply a LoRA adapter: merged into a staging copy of the weights
on each update, or added at run time to the rows of the requests that name it.

What is measured, in this process on the engine's own ``Decoder`` (no HTTP), for a peft adapter
of ``--rank`` on all seven projections of the model (the ~100 M-parameter random Qwen2 of
``benchmarks/weight_sync.py``, or the tiny demo model):

  * update: ``prepare_weights(adapter_dir)`` (read, check and merge into a staging copy: what
    ``/update_weights_from_disk`` does with an adapter) against ``load_adapter(adapter_dir)``
    (read, check and lay out for run time: what ``/load_lora_adapter`` does);
  * decode: one step of ``--rows`` decode rows at position ``--position``, with no adapter (=
    the cost of serving merged weights), with the adapter on every row, and on half the rows
    (a batch mixing the base model and the adapter, which merged weights cannot serve at all);
  * prefill: one step of 4 prompts of ``--prompt`` tokens, the same three ways.

Medians of ``--repeats`` after one warm-up round, the variants taking turns, one thread. Last line: one JSON object;
``decode_overhead_all`` = decode with the adapter on every row ÷ without (1.10: 10 % slower).
Usage::

    .venv/bin/python benchmarks/lora_serving.py [--model qwen2-100m|tiny] [--rank 16] [--rows 16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from weight_sync import model_dir_for  # noqa: E402 (the benchmark beside this one)

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(model_dir: Path, out: Path, rank: int) -> Path:
    """A peft adapter with random, non-zero A and B (the cost does not depend on the values)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS,
                                     init_lora_weights=False)).save_pretrained(out)
    return out


def median_s(fns: dict, repeats: int) -> dict[str, float]:
    """Each function's median time, the functions taking turns (all see the same machine load)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(repeats + 1):  # the first round warms up
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if i:
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2-100m", help="qwen2-100m, tiny, or an HF checkpoint directory")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--rows", type=int, default=16, help="decode rows per step")
    ap.add_argument("--position", type=int, default=200, help="the decode rows' position (keys attended to)")
    ap.add_argument("--prompt", type=int, default=128, help="tokens of each of the 4 prefill rows")
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    torch.set_num_threads(1)

    from agentrl.inference.decoder import Decoder, Step

    with tempfile.TemporaryDirectory(prefix="agentrl-lora-serving-") as tmp:
        work = Path(tmp)
        model_dir = model_dir_for(args.model, work)
        adapter_dir = make_adapter(model_dir, work / "adapter", args.rank)
        decoder = Decoder(model_dir, num_slots=max(args.rows, 4), max_len=max(args.position, args.prompt) + 8)
        update = median_s({"merge": lambda: decoder.discard(decoder.prepare_weights(adapter_dir)),
                           "load": lambda: decoder.load_adapter(adapter_dir, "a")}, args.repeats)
        lora = decoder.load_adapter(adapter_dir, "a")
        g = torch.Generator().manual_seed(0)
        vocab = decoder.spec.vocab_size
        decode = [(int(t), args.position) for t in torch.randint(0, vocab, (args.rows,), generator=g)]
        prefill = [(slot, 0, torch.randint(0, vocab, (args.prompt,), generator=g).tolist()) for slot in range(4)]
        half = args.rows // 2
        runs = {
            "decode_base": Step(decode, []),
            "decode_all": Step(decode, [], lora=[lora] * args.rows),
            "decode_half": Step(decode, [], lora=[lora] * half + [None] * (args.rows - half)),
            "prefill_base": Step([], prefill),
            "prefill_all": Step([], prefill, lora=[lora] * 4),
            "prefill_half": Step([], prefill, lora=[lora, None, lora, None]),
        }
        times = median_s({name: lambda step=step: decoder.forward(step) for name, step in runs.items()}, args.repeats)
    print(json.dumps({
        "benchmark": "lora_serving", "model": args.model, "rank": args.rank, "rows": args.rows,
        "position": args.position, "prompt": args.prompt, "repeats": args.repeats,
        "update_merge_s": round(update["merge"], 4), "update_load_s": round(update["load"], 4),
        **{f"{name}_ms": round(1000 * t, 2) for name, t in times.items()},
        "decode_overhead_all": round(times["decode_all"] / times["decode_base"], 3),
        "decode_overhead_half": round(times["decode_half"] / times["decode_base"], 3),
        "prefill_overhead_all": round(times["prefill_all"] / times["prefill_base"], 3),
        "prefill_overhead_half": round(times["prefill_half"] / times["prefill_base"], 3),
    }), flush=True)


if __name__ == "__main__":
    main()
