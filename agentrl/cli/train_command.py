"""``agentrl train``: the asynchronous RL loop, from one YAML config.

    agentrl train CONFIG [key=value ...]          start a run (its run_dir must be new)
    agentrl train --resume RUN_DIR [key=value ...]  continue a run from its last checkpoint
    agentrl train --help-config                   every config key, its default and help
    agentrl train CONFIG nnodes=N node_rank=R master_addr=A master_port=P   once per node
    agentrl train CONFIG launcher=ray [ray.address=HOST:PORT]             on a running Ray cluster

Starts the inference servers the config asks for (or uses given URLs), then the trainer
ranks under torchrun (rank 0 runs the rollout executor), and stops all of them on exit,
Ctrl-C or the failure of any one, saying which failed and why (docs/scaling.md: several
nodes, Ray, SGLang's router, Docker Compose). Everything the run writes is
under its run_dir: config.yaml, metrics.jsonl, tensorboard/, trajectories/, checkpoints/,
curves.png, summary.json, logs/. The last line printed is the run's summary as one JSON
object (eval_before, eval_after, steps, minutes, run_dir, ...). Overrides on --resume allow
staged training (e.g. ``rollout.sampling.max_new_tokens=1024`` for the second stage).
"""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="train a policy with asynchronous RL from a YAML config",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("items", nargs="*", metavar="CONFIG|key=value", help="the YAML config, then overrides")
    p.add_argument("--resume", metavar="RUN_DIR", default=None, help="continue this run from its last checkpoint")
    p.add_argument("--help-config", action="store_true", help="list every config key and exit")
    p.set_defaults(func=run)


def split_items(items: list[str]) -> tuple[str | None, list[str]]:
    """(the config path or None, the key=value overrides)."""
    paths = [i for i in items if "=" not in i]
    if len(paths) > 1:
        from agentrl.errors import ConfigError

        raise ConfigError(f"expected one CONFIG file and key=value overrides, got several paths: {paths}")
    return (paths[0] if paths else None), [i for i in items if "=" in i]


def run(args) -> int:
    import json
    from pathlib import Path

    from agentrl.config import describe, load_config, save_config
    from agentrl.errors import ConfigError
    from agentrl.process.services import exit_on_signals
    from agentrl.run.local_launcher import launch
    from agentrl.run.loop import latest_checkpoint
    from agentrl.run.run_config import RunConfig, check_run_config

    if args.help_config:
        for key, tp, default, help_ in describe(RunConfig):
            print(f"{key:<44} {tp:<18} default {default!r}\n    {help_}")
        return 0
    config_path, overrides = split_items(args.items)
    if args.resume:
        run_dir = Path(args.resume)
        if config_path is not None:
            raise ConfigError("with --resume, give only key=value overrides (the run's config.yaml is used)")
        if latest_checkpoint(run_dir) is None:
            raise ConfigError(f"{run_dir} has no complete checkpoint to resume from (checkpoints/latest)")
        cfg = load_config(RunConfig, run_dir / "config.yaml", [*overrides, f"run_dir={run_dir}"])
        with (run_dir / "resumes.jsonl").open("a") as f:
            f.write(json.dumps({"overrides": overrides}) + "\n")
    else:
        if config_path is None:
            raise ConfigError("give a config file: agentrl train CONFIG [key=value ...] (or --resume RUN_DIR)")
        cfg = load_config(RunConfig, config_path, overrides)
        run_dir = Path(cfg.run_dir)
        if cfg.node_rank == 0 and ((run_dir / "metrics.jsonl").exists() or latest_checkpoint(run_dir) is not None):
            raise ConfigError(f"run_dir {str(run_dir)!r} already holds a run; continue it with "
                              f"`agentrl train --resume {run_dir}`, or pick another with run_dir=...")
    check_run_config(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.node_rank == 0:  # the other nodes' ranks read node 0's (run_dir is shared)
        save_config(cfg, run_dir / "config.yaml")
    if cfg.launcher == "ray":
        from agentrl.run.ray_launcher import launch
    with exit_on_signals("agentrl train"):  # a SIGTERM stops the servers and ranks it started, too
        summary = launch(cfg, run_dir)
    print(json.dumps(summary), flush=True)
    return 0
