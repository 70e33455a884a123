"""What the commands that make a run share before they start it: ``agentrl train``, ``agentrl sft``
(and ``agentrl eval`` for its items).

What it is: ``config_help`` (``--help-config``), ``split_items`` (CONFIG then ``key=value``
overrides), ``load_run`` (a new run from CONFIG, or ``--resume RUN_DIR`` from the run's own
config.yaml) and ``refuse_other_outputs`` (a run_dir holding another command's files). What it
is not: the checks of one command's config or the run itself (``agentrl.run``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def config_help(cls: type) -> int:
    """Print every key of the config ``cls``, its type, default and help (``--help-config``)."""
    from agentrl.config import describe

    for key, tp, default, help_ in describe(cls):
        print(f"{key:<44} {tp:<18} default {default!r}\n    {help_}")
    return 0


def split_items(items: list[str]) -> tuple[str | None, list[str]]:
    """(the config path or None, the key=value overrides)."""
    paths = [i for i in items if "=" not in i]
    if len(paths) > 1:
        from agentrl.errors import ConfigError

        raise ConfigError(f"expected one CONFIG file and key=value overrides, got several paths: {paths}")
    return (paths[0] if paths else None), [i for i in items if "=" in i]


def load_run(cls: type, args: Any, command: str) -> tuple[Any, Path, list[str]]:
    """(the config, the run_dir, the overrides) of ``command CONFIG [key=value ...]`` or
    ``command --resume RUN_DIR [key=value ...]`` (the run's config.yaml, then the overrides)."""
    from agentrl.config import load_config
    from agentrl.errors import ConfigError

    config_path, overrides = split_items(args.items)
    if args.resume:
        run_dir = Path(args.resume)
        if config_path is not None:
            raise ConfigError("with --resume, give only key=value overrides (the run's config.yaml is used)")
        if not (run_dir / "config.yaml").is_file():
            raise ConfigError(f"{run_dir} holds no run to resume (no config.yaml, no complete checkpoint); "
                              f"start one with `{command} CONFIG run_dir=...`")
        return load_config(cls, run_dir / "config.yaml", [*overrides, f"run_dir={run_dir}"]), run_dir, overrides
    if config_path is None:
        raise ConfigError(f"give a config file: {command} CONFIG [key=value ...] (or --resume RUN_DIR)")
    cfg = load_config(cls, config_path, overrides)
    return cfg, Path(cfg.run_dir), overrides


def refuse_other_outputs(run_dir: str | Path, command: str) -> None:
    """Refuse a run_dir that is a file, or holds another command's outputs, not a run: a gateway's recordings
    (``agentrl gateway --out DIR`` writes ``DIR/trajectories.jsonl``) or an evaluation's results
    (``agentrl eval --out DIR``: ``DIR/eval.jsonl`` and the rest). A run's files would mix with them."""
    from agentrl.errors import ConfigError
    from agentrl.rollout.evaluate import RESULTS, SETTINGS, SUMMARY
    from agentrl.rollout.gateway import RECORDINGS

    if Path(run_dir).exists() and not Path(run_dir).is_dir():
        raise ConfigError(f"config key 'run_dir': {str(run_dir)!r} is a file, not a directory; pick another path")
    recordings = Path(run_dir) / RECORDINGS
    if recordings.is_file():
        raise ConfigError(f"config key 'run_dir': {str(run_dir)!r} holds a gateway's recordings ({recordings}, "
                          f"written by `agentrl gateway --out`), not a run; give {command} another run_dir=... "
                          f"(to fine-tune on those episodes: `agentrl sft CONFIG data={recordings}`)")
    results = [name for name in (RESULTS, SETTINGS, SUMMARY) if (Path(run_dir) / name).is_file()]
    if results:
        raise ConfigError(f"config key 'run_dir': {str(run_dir)!r} holds the results of `agentrl eval --out` "
                          f"({', '.join(results)}), not a run; give {command} another run_dir=... "
                          f"(to look at them: `agentrl view {run_dir}`)")
