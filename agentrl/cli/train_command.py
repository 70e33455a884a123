"""``agentrl train``: the asynchronous RL loop, from one YAML config.

    agentrl train CONFIG [key=value ...]          start a run (its run_dir holds no checkpoint)
    agentrl train --resume RUN_DIR [key=value ...]  continue a run from its last checkpoint
    agentrl train --help-config                   every config key, its default and help
    agentrl train CONFIG nnodes=N node_rank=R master_addr=A master_port=P   once per node
    agentrl train CONFIG launcher=ray [ray.address=HOST:PORT]             on a running Ray cluster

Starts the inference servers the config asks for (or uses given URLs), then the trainer
ranks under torchrun (rank 0 runs the rollout executor), and stops all of them on exit,
Ctrl-C or the failure of any one, saying which failed and why (docs/scaling.md: several
nodes, Ray, SGLang's router, Docker Compose). Everything the run writes is
under its run_dir: config.yaml, metrics.jsonl, tensorboard/, trajectories/, checkpoints/,
curves.png, summary.json, logs/, and run.lock while a run writes it (a second run into the
same run_dir is refused, naming the first; so is a run_dir holding a run with a checkpoint, unless
--resume, and one holding a gateway's recordings or the results of ``agentrl eval --out``). A run stopped before its first checkpoint restarts
from step 0 in place, rerun or resumed (``start_in``). The last line printed is the run's summary as one JSON
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


def run(args) -> int:
    import contextlib
    import json

    from agentrl.cli.run_setup import config_help, load_run, refuse_other_outputs
    from agentrl.config import save_config
    from agentrl.errors import ConfigError
    from agentrl.process.services import exit_on_signals
    from agentrl.run.local_launcher import launch
    from agentrl.run.loop import latest_checkpoint
    from agentrl.run.placement import apply_placement, apply_rollout_worker
    from agentrl.run.run_config import RunConfig, apply_deterministic, check_run_config
    from agentrl.run.run_lock import RunLock, make_dir
    from agentrl.run.run_lock import describe as describe_holder

    if args.help_config:
        return config_help(RunConfig)
    cfg, run_dir, overrides = load_run(RunConfig, args, "agentrl train")
    check_run_config(cfg)
    refuse_other_outputs(run_dir, "agentrl train")
    print(f"agentrl train: {apply_placement(cfg)}", flush=True)
    print(f"agentrl train: {apply_rollout_worker(cfg)}", flush=True)
    if (line := apply_deterministic(cfg)) is not None:
        print(f"agentrl train: {line}", flush=True)
    lead = cfg.node_rank == 0  # the other nodes' ranks read node 0's run_dir (it is shared): node 0 owns it
    make_dir(run_dir)
    with RunLock(run_dir, "agentrl train") if lead else contextlib.nullcontext() as lock:
        if lock is not None and lock.taken_over:
            print(f"agentrl train: took over the lock of {describe_holder(lock.taken_over)}, "
                  "which ended without releasing it", flush=True)
        if lead:
            start_in(run_dir, resume=bool(args.resume), has_checkpoint=latest_checkpoint(run_dir) is not None)
        try:
            if args.resume:
                with (run_dir / "resumes.jsonl").open("a") as f:
                    f.write(json.dumps({"overrides": overrides}) + "\n")
            if lead:
                save_config(cfg, run_dir / "config.yaml")
        except OSError as e:
            raise ConfigError(f"config key 'run_dir': cannot write into {str(run_dir)!r}: {e.strerror or e}") from e
        if cfg.launcher == "ray":
            from agentrl.run.ray_launcher import launch
        with exit_on_signals("agentrl train"):  # a SIGTERM stops the servers and ranks it started, too
            summary = launch(cfg, run_dir)
    print(json.dumps(summary), flush=True)
    return 1 if mostly_failed(summary, run_dir, cfg.rollout.max_failed_fraction) else 0


def mostly_failed(summary: dict, run_dir, threshold: float) -> bool:
    """Whether nearly every episode failed; if so, say how on stderr (the failure kinds counted
    in RUN_DIR/metrics.jsonl) — such a run trained on almost nothing, and a script should know."""
    import json
    import sys
    from collections import Counter

    counters = summary.get("counters") or {}
    finished, failed = counters.get("episodes_finished", 0), counters.get("episodes_failed", 0)
    if not finished or failed < threshold * finished:
        return False
    kinds: Counter = Counter()
    metrics = run_dir / "metrics.jsonl"
    for line in metrics.read_text().splitlines() if metrics.is_file() else []:
        row = json.loads(line)
        kinds.update({k.removeprefix("rollout/failed_"): v for k, v in row.items() if k.startswith("rollout/failed_")})
    how = ", ".join(f"{k} {int(v)}" for k, v in kinds.most_common(3)) or "see the trajectories"
    print(f"agentrl train: {failed} of {finished} episodes failed ({how}); the run learned from almost nothing. "
          f"The first error: {summary.get('first_error', '?')}. All of them: {run_dir}/rollout/episodes.jsonl, "
          f"`agentrl view {run_dir}`", file=sys.stderr, flush=True)
    return True


STOPPED = "stopped"
"""``RUN_DIR/stopped/<time>/``: the outputs of an attempt that ended before its first checkpoint."""


def start_in(run_dir, *, resume: bool, has_checkpoint: bool) -> None:
    """Refuse to start a new run over a run, or set aside an attempt that has nothing to resume.

    A run with a complete checkpoint is continued with ``--resume`` only. One stopped before its
    first checkpoint (Ctrl-C at step 2 of ``checkpoint.every_steps: 10``) has nothing a resume
    could restore: rerunning it, or ``--resume``, restarts it from step 0 in place, its earlier
    outputs moved to ``RUN_DIR/stopped/<time>/`` (kept for a look, never read again)."""
    import time

    from agentrl.errors import ConfigError
    from agentrl.run.run_lock import LOCK_FILE

    if has_checkpoint:
        if not resume:
            raise ConfigError(f"run_dir {str(run_dir)!r} already holds a run; continue it with "
                              f"`agentrl train --resume {run_dir}`, or pick another with run_dir=...")
        return
    stale = sorted(p for p in run_dir.iterdir() if p.name not in (STOPPED, LOCK_FILE, "config.yaml"))
    if not resume and not (run_dir / "metrics.jsonl").exists():
        return  # nothing was trained here: a new run in an existing (or empty) directory
    if not stale:
        return
    aside = run_dir / STOPPED / time.strftime("%Y%m%d-%H%M%S")
    try:
        aside.mkdir(parents=True, exist_ok=True)
        for p in stale:
            p.rename(aside / p.name)
    except OSError as e:
        raise ConfigError(f"config key 'run_dir': cannot move the stopped attempt's outputs to {aside}: "
                          f"{e.strerror or e}") from e
    how = "--resume" if resume else "a rerun"
    print(f"agentrl train: {run_dir} stopped before its first checkpoint, so there is nothing to resume: "
          f"{how} restarts it from step 0 in place (the earlier outputs are in {aside})", flush=True)
