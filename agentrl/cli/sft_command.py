"""``agentrl sft``: supervised fine-tuning on conversations or recorded trajectories.

    agentrl sft CONFIG [key=value ...]           fine-tune config.model on config.data
    agentrl sft --resume RUN_DIR [key=value ...]  continue a run from its last checkpoint
    agentrl sft --help-config                    every config key, its default and help

The data are JSONL files of OpenAI conversations (``{"messages": [...], "tools": [...]}``,
rendered with the model's chat template; the loss is on the assistant's tokens only), the
trajectories this project records (the gateway's ``trajectories.jsonl``, ``RUN_DIR/trajectories``,
``agentrl eval``'s ``eval.jsonl`` with ``--samples``; their own token ids and loss masks,
``min_reward`` to keep the good ones), or ``module:function``. Training uses the trainer of
``agentrl train`` (one process on CPU, or ``world_size`` ranks under torchrun). Everything goes
under run_dir: config.yaml, metrics.jsonl (train loss each step, held-out loss per evaluation),
summary.json, curves.png, model/ (an HF checkpoint: ``agentrl serve --model RUN_DIR/model``)
and checkpoints/ (resumable: every ``checkpoint.every_steps`` and at the end; ``--resume RUN_DIR
steps=N`` also trains a finished run on). The last line printed is the summary as one JSON object (heldout_loss_before,
heldout_loss_after, steps, minutes, run_dir, checkpoint, ...).
"""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser("sft", help="supervised fine-tuning on conversations or recorded trajectories",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("items", nargs="*", metavar="CONFIG|key=value", help="the YAML config, then overrides")
    p.add_argument("--resume", metavar="RUN_DIR", default=None, help="continue this run from its last checkpoint")
    p.add_argument("--help-config", action="store_true", help="list every config key and exit")
    p.set_defaults(func=run)


def run(args) -> int:
    import json
    from pathlib import Path

    from agentrl.cli.run_setup import config_help, load_run, refuse_other_outputs
    from agentrl.config import save_config
    from agentrl.errors import ConfigError
    from agentrl.process.services import exit_on_signals
    from agentrl.run.run_lock import RunLock, make_dir
    from agentrl.run.sft_config import SftConfig

    if args.help_config:
        return config_help(SftConfig)
    cfg, run_dir, _ = load_run(SftConfig, args, "agentrl sft")
    if not args.resume:
        refuse_other_outputs(run_dir, "agentrl sft")
        if (run_dir / "metrics.jsonl").exists():
            raise ConfigError(f"run_dir {str(run_dir)!r} already holds a run (metrics.jsonl); continue it with "
                              f"`agentrl sft --resume {run_dir}`, or pick another with run_dir=...")
    if not (Path(cfg.model) / "config.json").is_file():
        raise ConfigError(f"config key 'model': {cfg.model!r} is not an HF model directory (no config.json)")

    from transformers.utils import logging as hf_logging

    from agentrl.run.sft import completed_steps, load_data, num_steps, run_in_process, run_under_torchrun

    hf_logging.disable_progress_bar()
    data = load_data(cfg)  # bad data fails here, as one line, before any rank starts
    if args.resume:
        done, total = completed_steps(run_dir), num_steps(cfg, len(data[0].examples))
        if done >= total:
            raise ConfigError(f"{run_dir} is complete at step {done} of {total}; to train it on, raise steps: "
                              f"`agentrl sft --resume {run_dir} steps=N`")
        if done == 0:
            print(f"agentrl sft: {run_dir} has no complete checkpoint: --resume restarts it from step 0 in place",
                  flush=True)
    make_dir(run_dir)
    with RunLock(run_dir, "agentrl sft"), exit_on_signals("agentrl sft"):
        try:
            save_config(cfg, run_dir / "config.yaml")
        except OSError as e:
            raise ConfigError(f"config key 'run_dir': cannot write into {str(run_dir)!r}: {e.strerror or e}") from e
        resume = bool(args.resume)
        summary = (run_in_process(cfg, run_dir, data=data, resume=resume) if cfg.world_size == 1
                   else run_under_torchrun(cfg, run_dir, resume=resume))
    print(json.dumps(summary), flush=True)
    return 0
