"""The ``agentrl`` command line: one subcommand per ``<name>_command.py`` module of this package
(other modules hold what several commands share).

    envs_command.py     ``agentrl envs``: the registered environments; ``envs check ID``
    eval_command.py     ``agentrl eval``: pass@1 and pass@k of a workflow, without training
    gateway_command.py  ``agentrl gateway``: the OpenAI-compatible gateway that records episodes
    model_command.py    ``agentrl model``: build the tiny model, evaluate a model, merge a LoRA adapter
    replay_command.py   ``agentrl replay``: a run's recorded episodes scored again
    sandbox_command.py  ``agentrl sandbox``: run a file in a sandbox, or serve a backend over HTTP
    serve_command.py    ``agentrl serve``: the inference server on a checkpoint
    tasks_command.py    ``agentrl tasks``: repository tasks made from a local repository; the oracle
    service_command.py  ``agentrl service``: the trainer as a service (the Tinker API)
    sft_command.py      ``agentrl sft``: supervised fine-tuning
    train_command.py    ``agentrl train``: the asynchronous RL loop from one YAML config
    view_command.py     ``agentrl view``: a run in a browser, or exported as one HTML file
    run_setup.py        what train and sft share: CONFIG and overrides, --resume, --help-config
    __main__.py         ``python -m agentrl.cli`` is ``agentrl``

Each command module defines ``register(subparsers)``, which adds its parser and sets
``func`` (a callable taking the parsed args and returning an exit code). Command modules
import only the standard library at top level and load heavy parts (torch, servers)
inside ``func``, so ``agentrl --help`` stays fast.

Errors agentrl raises on purpose (``AgentRLError``) end the command with one line on
stderr and exit code 2; nothing else is swallowed.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from agentrl.errors import AgentRLError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentrl",
        description="Asynchronous RL for multi-turn LLM agents.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not info.name.endswith("_command"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # A command's trailing positionals (CONFIG and key=value overrides) may also come after its
    # flags: argparse leaves those over, and they join the positionals in the order typed.
    trailing = next((name for name in ("items", "overrides") if isinstance(getattr(args, name, None), list)), None)
    if extra and trailing and not any(e.startswith("-") for e in extra):
        getattr(args, trailing).extend(extra)
    elif extra:
        parser.parse_args(argv)  # the same words again: argparse's own error for what it cannot take
    func = getattr(args, "func", None)
    if func is None:
        # `agentrl` or `agentrl GROUP` without a subcommand: show the relevant help.
        (getattr(args, "group_parser", None) or parser).print_help()
        return 2
    try:
        return int(func(args) or 0)
    except AgentRLError as e:
        print(f"agentrl {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


