"""The agent program of ``workflows.verifiers_harness``: one verifiers episode, its model calls through
an agentrl gateway session. It runs in verifiers' own environment (``.venv-verifiers``: verifiers
pins ``mcp`` and ``openai`` versions ours do not share) and imports nothing of agentrl.

What it does: reads ``{"task": row}`` on stdin (``row["index"]``: which task of the taskset),
loads the taskset with verifiers' own loaders (``vf.resolve_env_config`` / ``vf.load_environment``),
and runs ``env.run_episode(task, vf.ModelContext(...))`` with the model client pointed at the
session (``OPENAI_BASE_URL``, key ``OPENAI_API_KEY``): verifiers' harness (the null harness, a
chat program, by default) talks to the model through verifiers' interception, which calls the
gateway, which records every call's exact tokens. The rubric's reward (``trace.reward``) is then
posted to ``{AGENTRL_SESSION_URL}/reward``. Local by construction: a subprocess runtime (not
Prime's sandboxes) and a local base URL; nothing is uploaded. An episode verifiers reports as
failed exits non-zero with its errors on stderr (agentrl records a failed episode).

    python workflows/verifiers_agent.py --taskset TASKSET [--harness null] [--env-config JSON]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import urllib.request


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--taskset", required=True, help="a verifiers taskset id (a module exporting it in __all__)")
    parser.add_argument("--harness", default="null", help="verifiers harness id (null: its chat program)")
    parser.add_argument("--env-config", default="{}", help="JSON merged into verifiers' env config")
    args = parser.parse_args()
    row = json.loads(sys.stdin.read() or "{}").get("task", {})
    import verifiers.v1 as vf

    config = {"taskset": {"id": args.taskset}}
    config.update(json.loads(args.env_config))
    # every agent role of the env (`agent`, a game's `player`, ...) on this machine: the harness asked
    # for and a subprocess runtime, never Prime's sandboxes
    local = {"harness": {"id": args.harness}, "runtime": {"type": "subprocess"}}
    roles = [name for name, field in type(vf.resolve_env_config(config)).model_fields.items()
             if isinstance(field.annotation, type) and issubclass(field.annotation, vf.AgentConfig)]
    for role in roles:
        config[role] = {**local, **config.get(role, {})}
    env = vf.load_environment(vf.resolve_env_config(config))
    index = int(row.get("index", 0))
    task = next(itertools.islice(iter(env.taskset.load()), index, None), None)
    if task is None:
        print(f"taskset {args.taskset!r} has no task {index}", file=sys.stderr)
        return 2
    client = vf.EvalClientConfig(base_url=os.environ["OPENAI_BASE_URL"], api_key_var="OPENAI_API_KEY")
    episode = asyncio.run(env.run_episode(task, vf.ModelContext(model="agentrl", client=client)))
    if not episode.ok or not episode.traces:
        print(f"verifiers episode failed: {episode.errors}"[:4000], file=sys.stderr)
        return 1
    trace = episode.traces[-1]
    if not any(m.role == "assistant" for m in trace.messages):
        failed = [c.error.message for c in trace.calls if c.error is not None]
        print(f"verifiers' harness got no reply from the model: {failed or trace.errors or trace.stop_condition}"[:3000],
              file=sys.stderr)
        return 1
    reward = float(trace.reward)
    body = json.dumps({"reward": reward}).encode()
    request = urllib.request.Request(os.environ["AGENTRL_SESSION_URL"] + "/reward", data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()
    print(json.dumps({"reward": reward, "rewards": {k: (v.score if v else None)
                                                    for k, v in episode.traces[-1].rewards.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
