"""``agentrl sft``: supervised fine-tuning on conversations or recorded trajectories.

    agentrl sft CONFIG [key=value ...]     fine-tune config.model on config.data
    agentrl sft --help-config              every config key, its default and help

The data are JSONL files of OpenAI conversations (``{"messages": [...], "tools": [...]}``,
rendered with the model's chat template; the loss is on the assistant's tokens only), the
trajectories this project records (the gateway's ``trajectories.jsonl``, ``RUN_DIR/trajectories``,
``agentrl eval``'s ``eval.jsonl`` with ``--samples``; their own token ids and loss masks,
``min_reward`` to keep the good ones), or ``module:function``. Training uses the trainer of
``agentrl train`` (one process on CPU, or ``world_size`` ranks under torchrun). Everything goes
under run_dir: config.yaml, metrics.jsonl (train loss each step, held-out loss per evaluation),
summary.json, curves.png and model/ (an HF checkpoint: ``agentrl serve --model RUN_DIR/model``).
The last line printed is the summary as one JSON object (heldout_loss_before,
heldout_loss_after, steps, minutes, run_dir, checkpoint, ...).
"""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser("sft", help="supervised fine-tuning on conversations or recorded trajectories",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("items", nargs="*", metavar="CONFIG|key=value", help="the YAML config, then overrides")
    p.add_argument("--help-config", action="store_true", help="list every config key and exit")
    p.set_defaults(func=run)


def run(args) -> int:
    import json
    from pathlib import Path

    from agentrl.cli.train_command import split_items
    from agentrl.config import describe, load_config, save_config
    from agentrl.errors import ConfigError
    from agentrl.process.services import exit_on_signals
    from agentrl.run.run_lock import RunLock, make_dir
    from agentrl.run.sft_config import SftConfig

    if args.help_config:
        for key, tp, default, help_ in describe(SftConfig):
            print(f"{key:<44} {tp:<18} default {default!r}\n    {help_}")
        return 0
    config_path, overrides = split_items(args.items)
    if config_path is None:
        raise ConfigError("give a config file: agentrl sft CONFIG [key=value ...]")
    cfg = load_config(SftConfig, config_path, overrides)
    if not (Path(cfg.model) / "config.json").is_file():
        raise ConfigError(f"config key 'model': {cfg.model!r} is not an HF model directory (no config.json)")
    run_dir = Path(cfg.run_dir)
    if (run_dir / "metrics.jsonl").exists():
        raise ConfigError(f"run_dir {str(run_dir)!r} already holds a run (metrics.jsonl); pick another with run_dir=...")

    from transformers.utils import logging as hf_logging

    from agentrl.run.sft import load_data, run_in_process, run_under_torchrun

    hf_logging.disable_progress_bar()
    data = load_data(cfg)  # bad data fails here, as one line, before any rank starts
    make_dir(run_dir)
    with RunLock(run_dir, "agentrl sft"), exit_on_signals("agentrl sft"):
        try:
            save_config(cfg, run_dir / "config.yaml")
        except OSError as e:
            raise ConfigError(f"config key 'run_dir': cannot write into {str(run_dir)!r}: {e.strerror or e}") from e
        summary = run_in_process(cfg, run_dir, data=data) if cfg.world_size == 1 else run_under_torchrun(cfg, run_dir)
    print(json.dumps(summary), flush=True)
    return 0
