"""An agent that trains the model by calling it: plain OpenAI SDK + HTTP against a run's gateway.

    agentrl train examples/arith_grpo.yaml rollout.source=gateway run_dir=runs/gw-train &
    python examples/gateway_agent.py --run-dir runs/gw-train [--groups 50]

(``--run-dir`` waits for the run to write ``RUN_DIR/gateway.json``; ``--gateway URL`` takes the
URL itself.)
The run (``rollout.source: gateway``) serves an OpenAI-compatible gateway and trains on
whatever episodes agents play through it. This agent brings its own tasks and its own
reward, as an agent in production would: for each task it opens ``--samples`` sessions of one
group (``{"metadata": {"group": ...}}``: one GRPO group), asks the model the question with the
unmodified ``openai`` SDK, scores the answer itself, posts the reward and ends the session.
When the trainer is as far behind as the run's staleness bound allows, the gateway answers
429 with ``Retry-After`` and the agent waits. A call the gateway refuses (503 when no
inference server answers) loses that episode: said on stderr, the session ended so the
gateway keeps it as failed data, and the agent goes on. Nothing here imports agentrl: the
same loop works from any language. It stops after ``--groups`` tasks, or when the run is gone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import sys
import time

import httpx
from openai import APIConnectionError, APIStatusError, OpenAI


def open_session(http: httpx.Client, gateway: str, group: str) -> dict | None:
    """A new session of ``group``, waiting out 429s; None once the gateway is gone."""
    while True:
        try:
            r = http.post(f"{gateway}/v1/sessions", json={"metadata": {"group": group}})
        except httpx.TransportError:
            return None
        if r.status_code == 429:
            print("429: the trainer is catching up", file=sys.stderr, flush=True)
            time.sleep(float(r.headers.get("Retry-After", "1")))
            continue
        r.raise_for_status()
        return r.json()


def play(http: httpx.Client, gateway: str, group: str, a: int, b: int, c: int) -> float | None:
    """One episode: ask, score, reward, end; its reward, NaN if the gateway refused the call
    (the episode is lost; the gateway keeps what it has as failed data), None once the run (and
    its gateway) is gone."""
    session = open_session(http, gateway, group)
    if session is None:
        return None
    client = OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
    auth = {"Authorization": f"Bearer {session['api_key']}"}
    try:
        try:
            reply = client.chat.completions.create(model="policy", max_tokens=12, temperature=1.0,
                                                   messages=[{"role": "user", "content": f"What is {a}+{b}+{c}?"}])
        except APIStatusError as e:  # 503: no inference server answered; 401: the session was ended idle
            print(f"episode lost: HTTP {e.status_code}: {e.message}", file=sys.stderr, flush=True)
            http.post(f"{gateway}/v1/sessions/{session['session_id']}/end", json={}, headers=auth)  # failed data
            return math.nan
        boxed = re.findall(r"\\boxed\{(-?\d+)\}", reply.choices[0].message.content or "")
        reward = 1.0 if boxed and int(boxed[-1]) == a + b + c else 0.0
        http.post(f"{gateway}/v1/sessions/{session['session_id']}/reward", json={"reward": reward}, headers=auth)
        http.post(f"{gateway}/v1/sessions/{session['session_id']}/end", json={}, headers=auth)
    except (httpx.TransportError, APIConnectionError):
        return None
    return reward


def wait_for_gateway(run_dir: str, wait_s: float) -> str:
    """The url in RUN_DIR/gateway.json, once the run has written it (an agent started with its
    run need not race it)."""
    path = os.path.join(run_dir, "gateway.json")
    deadline = time.monotonic() + wait_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(f"gateway_agent: {path} did not appear within {wait_s:.0f} s; is `agentrl train ... "
                     f"rollout.source=gateway run_dir={run_dir}` running?")
        time.sleep(0.5)
    with open(path) as f:
        return json.load(f)["url"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--gateway", help="the run's gateway URL (the url of RUN_DIR/gateway.json)")
    where.add_argument("--run-dir", help="the run's directory: wait for its gateway.json, then use its url")
    p.add_argument("--wait", type=float, default=600.0, help="seconds --run-dir waits for the gateway")
    p.add_argument("--groups", type=int, default=50, help="tasks to play")
    p.add_argument("--samples", type=int, default=16, help="episodes per task (the run's rollout.group_size)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    gateway = args.gateway if args.run_dir is None else wait_for_gateway(args.run_dir, args.wait)
    if not gateway or not gateway.startswith(("http://", "https://")):
        p.error(f"--gateway must be the gateway's URL (http://HOST:PORT), got {gateway!r}; with the run's "
                "directory, use --run-dir RUN_DIR (it waits for RUN_DIR/gateway.json)")
    rng = random.Random(args.seed)
    admin = os.environ.get("AGENTRL_GATEWAY_API_KEY")
    headers = {"Authorization": f"Bearer {admin}"} if admin else {}
    played = 0
    with httpx.Client(headers=headers, timeout=300) as http:
        for g in range(args.groups):
            a, b, c = (rng.randint(0, 99) for _ in range(3))
            rewards = [play(http, gateway, f"{args.seed}-{g}", a, b, c) for _ in range(args.samples)]
            if any(r is None for r in rewards):
                break
            played += 1
            scored = [r for r in rewards if not math.isnan(r)]
            mean = sum(scored) / len(scored) if scored else None
            print(json.dumps({"group": g, "mean_reward": mean, "lost": len(rewards) - len(scored)}), flush=True)
    print(json.dumps({"groups_played": played}), flush=True)
    if played == 0:
        print(f"no group was played: the gateway at {gateway} did not answer", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
