"""``agentrl model``: build the tiny demo model, evaluate any saved model on arithmetic, or merge
a LoRA adapter into its base model.

    agentrl model tiny --out DIR [--config FILE.yaml] [key=value ...]
    agentrl model eval DIR [--problems N] [--seed S] [--tool-problems N]
    agentrl model merge RUN_DIR/checkpoints/step_N --out DIR [--base MODEL_DIR] [--dtype bfloat16]

``tiny`` trains the demo model (``agentrl.model.tinymodel.TinyModelConfig`` lists every key; the
defaults build the committed ``examples/tiny-model``), then prints its held-out accuracy.
``eval`` prints the greedy accuracy on held-out ``a+b+c`` problems as a line, then one JSON
line with every figure. ``merge`` writes a plain Hugging Face checkpoint (base + adapter, merged by
peft) that transformers, ``agentrl serve`` and SGLang load; it takes an adapter directory, a LoRA
checkpoint or a LoRA run directory (its latest checkpoint), and the base the adapter names.
"""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser("model", help="build the tiny demo model; evaluate a model on arithmetic",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="model_command", metavar="SUBCOMMAND")
    p.set_defaults(group_parser=p)

    tiny = sub.add_parser("tiny", help="train the tiny demo model (a few minutes on 2 CPU cores)")
    tiny.add_argument("--out", required=True, help="output directory (created; files are overwritten)")
    tiny.add_argument("--config", default=None, help="YAML file of TinyModelConfig keys")
    tiny.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. sft_steps=20")
    tiny.add_argument("--no-progress", action="store_true", help="no progress bar")
    tiny.set_defaults(func=run_tiny)

    ev = sub.add_parser("eval", help="greedy accuracy of a saved model on held-out arithmetic")
    ev.add_argument("model_dir", metavar="DIR", help="Hugging Face model directory")
    ev.add_argument("--problems", type=int, default=1000, help="held-out a+b+c problems (default 1000)")
    ev.add_argument("--seed", type=int, default=0, help="seed of the problems (default 0)")
    ev.add_argument("--tool-problems", type=int, default=0,
                    help="also ask this many with the calculator tool offered (default 0)")
    ev.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    ev.set_defaults(func=run_eval)

    merge = sub.add_parser("merge", help="merge a LoRA run's adapter into its base model: an HF checkpoint")
    merge.add_argument("adapter", metavar="PATH", help="an adapter directory, a LoRA checkpoint "
                                                      "(RUN_DIR/checkpoints/step_N) or a LoRA run directory")
    merge.add_argument("--out", required=True, help="output directory (new or empty; never the adapter, the "
                                                    "base or a parent of either)")
    merge.add_argument("--force", action="store_true", help="replace a non-empty --out directory")
    merge.add_argument("--base", default=None, help="the base model directory (default: the adapter's "
                                                    "base_model_name_or_path, the run's model)")
    merge.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                       help="dtype of the merged weights (default float32)")
    merge.set_defaults(func=run_merge)


def run_tiny(args) -> int:
    import json

    from agentrl.config import load_config
    from agentrl.model.tinymodel import BUILD_INFO, TinyModelConfig, build_tiny_model

    cfg = load_config(TinyModelConfig, args.config, args.overrides)
    info = build_tiny_model(cfg, args.out, progress=not args.no_progress)
    line = f"held-out a+b+c greedy accuracy {info['accuracy']:.3f} on {info['eval_problems']} problems"
    if "tool_call_rate" in info:
        line += (f"; with the calculator: {info['tool_call_rate']:.3f} well-formed calls, "
                 f"{info['tool_accuracy']:.3f} right answers")
    print(line)
    print(f"wrote {args.out} in {info['seconds']:.0f} s ({info['steps_per_second']:.2f} steps/s); "
          f"figures in {args.out}/{BUILD_INFO}")
    print(json.dumps({k: v for k, v in info.items() if k != "config"}))
    return 0


def run_eval(args) -> int:
    import json

    from agentrl.errors import ConfigError
    from agentrl.model.tinymodel import evaluate_model_dir

    for name in ("problems", "threads"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.tool_problems < 0:
        raise ConfigError(f"--tool-problems must be >= 0, got {args.tool_problems}")
    info = evaluate_model_dir(args.model_dir, problems=args.problems, seed=args.seed,
                              tool_problems=args.tool_problems, threads=args.threads)
    print(f"held-out a+b+c greedy accuracy {info['accuracy']:.3f} on {args.problems} problems (seed {args.seed})")
    print(json.dumps({"model": str(args.model_dir), **info}))
    return 0


def run_merge(args) -> int:
    import torch

    from agentrl.trainer.lora import find_adapter, merge_adapter

    adapter = find_adapter(args.adapter)
    out = merge_adapter(adapter, args.out, base_dir=args.base, dtype=getattr(torch, args.dtype),
                         force=args.force)
    print(f"wrote {out}: the adapter {adapter} merged into its base model")
    return 0
