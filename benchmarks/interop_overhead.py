"""The adapter's overhead: the same task as our own env and through an ecosystem adapter, episodes per second.

``agentrl/Arith-v0`` (``a+b+c`` of two-digit numbers, our env) against ``reasoning_gym/chain_sum`` with
reasoning-gym's config narrowed to the same problems (3 terms of 2 digits): each episode is
``areset`` on a row of the env's own dataset, then ``astep`` with the right answer in
``\\boxed{}`` (so both graders do their full work), on one env per side, in one event loop. The
model is not involved: this is what the adapter (reasoning-gym's generator and ``score_answer``,
the adapter's rendering) costs per episode, to set beside a model call's milliseconds.

Last line: one JSON object, ``{"ours_eps", "adapter_eps", "overhead_us_per_episode", ...}``. Usage::

    .venv/bin/python benchmarks/interop_overhead.py [--episodes 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import gymnasium


async def episodes_per_second(env, rows, answer) -> float:
    start = time.perf_counter()
    for row in rows:
        await env.areset(options={"task": row})
        await env.astep(f"\\boxed{{{answer(env, row)}}}")
    return len(rows) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=3000)
    args = parser.parse_args()

    import envs.arith
    from agentrl.plugins import find_env
    from envs.interop import reasoning_gym_env

    ours = gymnasium.make("agentrl/Arith-v0").unwrapped
    adapter = gymnasium.make(find_env("reasoning_gym/chain_sum"), config={
        "min_terms": 3, "max_terms": 3, "min_digits": 2, "max_digits": 2}).unwrapped
    ours_rows = envs.arith.training_rows(0, args.episodes)
    adapter_rows = reasoning_gym_env.train_rows(0, args.episodes)

    async def run():
        # one warm-up pass of 100 each (imports, caches), then the measured pass
        await episodes_per_second(ours, ours_rows[:100], lambda env, row: row["answer"])
        await episodes_per_second(adapter, adapter_rows[:100], lambda env, row: env._entry["answer"])
        a = await episodes_per_second(ours, ours_rows, lambda env, row: row["answer"])
        b = await episodes_per_second(adapter, adapter_rows, lambda env, row: env._entry["answer"])
        return a, b

    ours_eps, adapter_eps = asyncio.run(run())
    print(json.dumps({"episodes": args.episodes, "ours": "agentrl/Arith-v0", "adapter": "reasoning_gym/chain_sum",
                      "ours_eps": round(ours_eps, 1), "adapter_eps": round(adapter_eps, 1),
                      "overhead_us_per_episode": round(1e6 / adapter_eps - 1e6 / ours_eps, 1)}))


if __name__ == "__main__":
    main()
