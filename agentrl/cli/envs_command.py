"""``agentrl envs``: list the registered environments; ``agentrl envs check ID``: check one.

``ID`` is a registered Gymnasium id (``agentrl/Math-v1``) or, for an env of your own module,
``module:ns/Name-vN`` (the module registers the id at import; it is looked for on the import
path, then in the current directory), or another ecosystem's (``reasoning_gym/chain_sum``,
``textarena/GuessTheNumber-v0``, ``skyrl_gym/gsm8k_multi_turn``, ``openenv:URL``,
``verifiers:TASKSET``; the list ends with one line per ecosystem: what is installed). ``--import MODULE`` lists a module's envs too. The check is ``agentrl.env.checks.check_text_env`` (Gymnasium's ``check_env`` with its
warnings turned into failures, then agentrl's own checks); for an env outside ``envs/``, missing
Gymnasium docstring sections are printed as advice (``ADVICE ...``), not counted as a failure.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("envs", help="list the registered agentrl/... environments, or check one",
                                   description="List the registered environments (one line each).")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (it registers environments of its own); repeatable")
    parser.set_defaults(func=list_envs)
    sub = parser.add_subparsers(dest="envs_command", metavar="ACTION")
    check = sub.add_parser("check", help="run gymnasium's check_env and agentrl's checks on one environment")
    check.add_argument("env_id", help="an id such as agentrl/Math-v1, or module:ns/Name-vN for one of your module")
    check.add_argument("--kwargs", default="{}", help="JSON object of keyword arguments for gymnasium.make")
    check.set_defaults(func=check_cmd)


def list_envs(args: argparse.Namespace) -> int:
    from agentrl.env.checks import ecosystem_lines, registered_ids, summary

    ids = registered_ids(tuple(args.imports))
    lines = [(env_id, summary(env_id)) for env_id in ids] + ecosystem_lines()
    width = max((len(name) for name, _ in lines), default=0)
    for name, text in lines:
        print(f"{name:<{width}}  {text}")
    return 0


def check_cmd(args: argparse.Namespace) -> int:
    import json

    from agentrl.env.checks import check_text_env, docstring_advice, shipped
    from agentrl.errors import ConfigError

    try:
        kwargs = json.loads(args.kwargs)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--kwargs must be a JSON object, e.g. '{{\"max_turns\": 3}}' ({e.msg})") from e
    problems = check_text_env(args.env_id, kwargs)
    for p in problems:
        print(f"FAIL {p}")
    if not shipped(args.env_id):
        for a in docstring_advice(args.env_id):
            print(f"ADVICE {a}: they tell readers (and agentrl envs) what the env is; it runs without them")
    print(f"{args.env_id}: {'ok' if not problems else f'{len(problems)} problem(s)'}")
    return 0 if not problems else 1
