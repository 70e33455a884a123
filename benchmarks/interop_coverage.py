"""How many of each ecosystem's tasks and games run here: ``agentrl envs check`` and one episode each.

For every reasoning-gym task (``reasoning_gym/<task>``) and every base TextArena game
(``textarena/<Game-vN>``): ``agentrl.env.checks.check_text_env`` (what ``agentrl envs check``
runs), then one episode through the env protocol with a scripted player — the gold answer for
reasoning-gym (its reward is printed: a few tasks score their own gold answer below 1), and
for TextArena the move ``[0]`` every turn until the game or the turn cap ends it (every seat
in self-play). The model is not involved: this measures the adapters and the ecosystems'
code on this machine. Each env runs in a child process with a time limit, so a game that
hangs or crashes counts as failing and the sweep goes on.

Prints one line per env (``ok`` or why not) and, last, one JSON object: per ecosystem the
count that pass both, the count tried, and the failures grouped by reason. Usage::

    .venv/bin/python benchmarks/interop_coverage.py [--only reasoning_gym|textarena] [--timeout 60]
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import re
import sys


def one(env_id: str) -> str:
    """'ok ...' or the first problem, for one env id (in a child process)."""
    import gymnasium

    from agentrl.env.checks import check_text_env
    from agentrl.plugins import find_env

    try:
        problems = check_text_env(env_id)
    except Exception as e:
        return f"check raised {type(e).__name__}: {e}"
    if problems:
        return "check: " + problems[0]
    env = gymnasium.make(find_env(env_id)).unwrapped
    try:
        env.reset(seed=0)
        if env_id.startswith("reasoning_gym/"):
            gold = env._entry["answer"]
            _, reward, terminated, truncated, _ = env.step(f"<answer>{gold}</answer>")
            return f"ok gold_reward={reward:g}"
        done, steps = False, 0
        while not done:
            _, reward, terminated, truncated, info = env.step("[0]")
            done, steps = terminated or truncated, steps + 1
        how = "ended" if terminated else f"capped ({info.get('truncated_by')})"
        return f"ok {how} after {steps} moves, seat_rewards={info.get('seat_rewards')}"
    except Exception as e:
        return f"episode raised {type(e).__name__}: {e}"
    finally:
        env.close()


def _child(env_id: str, out: multiprocessing.Queue) -> None:
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # some games print
        result = one(env_id)
    out.put(result)


def run(env_id: str, timeout: float) -> str:
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(env_id, q))
    p.start()
    p.join(timeout)
    if p.is_alive():
        p.kill()
        p.join()
        return f"timed out after {timeout:g} s"
    return q.get() if not q.empty() else f"child exited with code {p.exitcode}"


def reason(result: str) -> str:
    """A failure's group: the adapter's one-line reason where it gave one."""
    for key in ("NLTK corpus", "API key", "Python >= 3.12", "does not declare", "timed out", "not numbers",
                "failed to start", "refused config", "docstring"):
        if key in result:
            return key
    return re.sub(r"\d+", "N", result)[:80]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("reasoning_gym", "textarena"))
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    from envs.interop import reasoning_gym_env, textarena_env

    ids = {"reasoning_gym": [f"reasoning_gym/{t}" for t in reasoning_gym_env.tasks()],
           "textarena": [f"textarena/{g}" for g in textarena_env.games()]}
    summary = {}
    for eco, env_ids in ids.items():
        if args.only and eco != args.only:
            continue
        passed, failures = 0, collections.defaultdict(list)
        for env_id in env_ids:
            result = run(env_id, args.timeout)
            print(f"{env_id}: {result}", flush=True)
            if result.startswith("ok"):
                passed += 1
            else:
                failures[reason(result)].append(env_id.split("/", 1)[1])
        summary[eco] = {"pass": passed, "tried": len(env_ids), "failures": dict(failures)}
    print(json.dumps(summary), file=sys.stdout)


if __name__ == "__main__":
    main()
