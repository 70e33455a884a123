"""``agentrl envs``: list the registered environments; ``agentrl envs check ID``: check one.

The check is ``agentrl.env.checks.check_text_env`` (Gymnasium's ``check_env`` with its
warnings turned into failures, then agentrl's own checks).
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("envs", help="list the registered agentrl/... environments, or check one",
                                   description="List the registered environments (one line each).")
    parser.set_defaults(func=list_envs)
    sub = parser.add_subparsers(dest="envs_command", metavar="ACTION")
    check = sub.add_parser("check", help="run gymnasium's check_env and agentrl's checks on one environment")
    check.add_argument("env_id", help="an id such as agentrl/Math-v1")
    check.add_argument("--kwargs", default="{}", help="JSON object of keyword arguments for gymnasium.make")
    check.set_defaults(func=check_cmd)


def list_envs(args: argparse.Namespace) -> int:
    from agentrl.env.checks import registered_ids, summary

    ids = registered_ids()
    width = max(map(len, ids), default=0)
    for env_id in ids:
        print(f"{env_id:<{width}}  {summary(env_id)}")
    return 0


def check_cmd(args: argparse.Namespace) -> int:
    import json

    from agentrl.env.checks import check_text_env, registered_ids
    from agentrl.errors import ConfigError

    if args.env_id not in registered_ids():
        import difflib

        close = difflib.get_close_matches(args.env_id, registered_ids(), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "; `agentrl envs` lists them"
        raise ConfigError(f"no environment {args.env_id!r}{hint}")
    try:
        kwargs = json.loads(args.kwargs)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--kwargs must be a JSON object, e.g. '{{\"max_turns\": 3}}' ({e.msg})") from e
    problems = check_text_env(args.env_id, kwargs)
    for p in problems:
        print(f"FAIL {p}")
    print(f"{args.env_id}: {'ok' if not problems else f'{len(problems)} problem(s)'}")
    return 0 if not problems else 1
