"""``agentrl tasks``: make repository tasks from a local Python repository, and check a task set.

    agentrl tasks generate PATH --out DIR [--seed 0] [--max-candidates 200] [--include PREFIX] ...
    agentrl tasks oracle DATASET [--concurrency 2] [--limit N]

``generate`` makes SWE-bench-format instances (and Harbor task directories) from the repository
at PATH the way SWE-smith does, offline: bugs put in by swesmith's procedural rewrites, kept
when some tests fail and the rest pass, each validated by the env's grading (gold resolves,
empty does not); see ``envs/repo/generate.py``. It prints the summary as one JSON line.
``oracle`` plays every task of DATASET (a JSONL of instances or a folder of Harbor task dirs)
with a scripted agent that applies the gold patch through agentrl/Repo-v0's tools and submits
(``envs/repo/oracle.py``); it prints the report as one JSON line and exits 1 unless all resolve.
Both need Docker and ``agentrl[repo]``.
"""

from __future__ import annotations

import argparse

CONFIG = "envs.repo.generate_config:GenerateConfig"
"""By import path: the core never imports ``envs`` by name."""


def register(subparsers) -> None:
    from agentrl.config import add_arguments
    from agentrl.errors import ConfigError
    from agentrl.plugins import load_object

    p = subparsers.add_parser("tasks", help="make SWE-bench and Harbor tasks from a repository",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(group_parser=p)
    sub = p.add_subparsers(dest="tasks_command", metavar="{generate,oracle}")
    g = sub.add_parser("generate", help="SWE-bench instances and Harbor task dirs from the repository at PATH")
    try:
        config_cls = load_object(CONFIG)
    except ConfigError as e:  # an install without the env packages (the sandbox service's image): said when run
        g.set_defaults(func=lambda args, why=str(e): missing(why))
    else:
        add_arguments(g, config_cls)
        g.set_defaults(func=generate)
    o = sub.add_parser("oracle", help="apply every task's gold patch through the env's tools; report the resolve rate")
    o.add_argument("dataset", metavar="DATASET", help="a JSONL/Parquet of SWE-bench rows, or a folder of Harbor task dirs")
    o.add_argument("--concurrency", type=int, default=2, help="episodes at once (default 2)")
    o.add_argument("--limit", type=int, default=0, help="only the first N tasks (default: all)")
    o.set_defaults(func=oracle)


def missing(why: str) -> int:
    from agentrl.errors import ConfigError

    raise ConfigError(f"agentrl tasks generate needs agentrl's envs package and the repo extra "
                      f"(pip install -e '.[repo]' in a checkout): {why}")


def generate(args) -> int:
    import json

    from agentrl.config import from_args
    from agentrl.plugins import load_object

    summary = load_object("envs.repo.generate:main")(from_args(load_object(CONFIG), args))
    print(json.dumps(summary))
    return 0


def oracle(args) -> int:
    import asyncio
    import json

    from agentrl.errors import ConfigError
    from agentrl.plugins import load_object

    if args.concurrency < 1 or args.limit < 0:
        raise ConfigError(f"--concurrency must be >= 1 and --limit >= 0, got {args.concurrency}, {args.limit}")
    report = asyncio.run(load_object("envs.repo.oracle:run_oracle")(args.dataset, args.concurrency, args.limit))
    print(json.dumps(report))
    return 0 if report["instances"] and report["resolve_rate"] == 1.0 else 1
