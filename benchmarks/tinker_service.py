"""A training step through `agentrl service` (the Tinker API) against the same step in-process.

Both sides run the same step on the tiny model: ``forward_backward`` with ``cross_entropy`` on
``--batch`` datums of ``--length`` tokens, then ``optim_step`` (AdamW), for one LoRA client of
rank 8. In-process: ``agentrl.service.learner.Learner`` called directly (the service's own
trainer, no HTTP). Through the service: the unmodified ``tinker`` SDK in ``.venv-tinker``
(``make tinker``) against an ``agentrl service`` subprocess, waiting for each step's result
before the next (as the cookbook's loops do). Both use one torch thread. The sides alternate for
``--rounds`` rounds of ``--steps`` steps, so load drifts on a shared machine reach both; the
ratio uses each side's median step.

    ratio = in-process s/step ÷ service s/step                     goal: >= 0.8

Then the cost of sharing: a second SDK client (its own adapter and optimizer) steps at the same
time as the first; each one's s/step together against the first's alone:

    sharing_ratio = alone s/step ÷ together s/step (each client's)  one worker: about 1/2

The baseline is the service's own learner, not ``agentrl train``'s FSDP actor: the figure is
what the HTTP edge, the protobuf bodies, the queue and the polling cost a step.

Last line: one JSON object. Usage::

    .venv/bin/python benchmarks/tinker_service.py [--rounds 3] [--steps 5] [--batch 8] [--length 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "examples" / "tiny-model"
KEY = "tml-benchmark"

CLIENT = '''
import json, os, sys, time
import numpy as np, tinker
from tinker import types
batch, length, steps = map(int, sys.argv[1:4])
rng = np.random.default_rng(0)
seqs = [rng.integers(3, 250, length + 1).tolist() for _ in range(batch)]
data = [types.Datum(model_input=types.ModelInput.from_ints(s[:-1]),
                    loss_fn_inputs={"target_tokens": np.array(s[1:]), "weights": np.ones(length, np.float32)})
        for s in seqs]
sc = tinker.ServiceClient()
tc = sc.create_lora_training_client(base_model=sc.get_server_capabilities().supported_models[0].model_name,
                                    rank=8, seed=0).result()
def step():
    fb = tc.forward_backward(data, "cross_entropy")
    tc.optim_step(types.AdamParams(learning_rate=1e-4)).result()
    fb.result()
step()  # warm-up
print("ready", flush=True)
for _ in sys.stdin:  # the parent's turn signal, until it closes
    t = time.perf_counter()
    for _ in range(steps):
        step()
    print(json.dumps((time.perf_counter() - t) / steps), flush=True)
os._exit(0)
'''


def in_process(batch: int, length: int):
    from agentrl.service.learner import Learner, LoraSettings
    from agentrl.service.proto import Datum, ForwardBackward

    learner = Learner(MODEL)
    learner.create("bench", LoraSettings(rank=8, seed=0))
    rng = np.random.default_rng(0)
    seqs = [rng.integers(3, 250, length + 1).tolist() for _ in range(batch)]
    fb = ForwardBackward("bench", 1, [Datum(s[:-1], {"target_tokens": np.array(s[1:]),
                                                     "weights": np.ones(length, np.float32)}) for s in seqs],
                         "cross_entropy", {}, forward_only=False)
    adam = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0,
            "grad_clip_norm": 0.0}

    def step() -> None:
        learner.forward_backward(fb)
        learner.optim_step("bench", adam)

    step()  # warm-up
    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--length", type=int, default=64)
    args = p.parse_args()
    tinker_python = ROOT / ".venv-tinker" / "bin" / "python"
    if not tinker_python.exists():
        sys.exit("benchmarks/tinker_service.py needs .venv-tinker: run `make tinker`")
    torch.set_num_threads(1)
    from agentrl.cli.service_command import READY
    from agentrl.process.services import ServiceProcess

    local_step = in_process(args.batch, args.length)
    # --sampler: a URL never called (no sampling here), so no agentrl serve is started
    cmd = [str(Path(sys.executable).parent / "agentrl"), "service", "--model", str(MODEL), "--port", "0",
           "--api-key", KEY, "--dir", str(ROOT / "runs" / "bench-tinker-service"), "--sampler", "http://127.0.0.1:9"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    local, remote = [], []
    with ServiceProcess(cmd, ready=READY, env=env) as service:
        client_env = {k: v for k, v in env.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        client_env.update(TINKER_BASE_URL=service.url, TINKER_API_KEY=KEY, TINKER_TELEMETRY="0")
        clients = [subprocess.Popen([str(tinker_python), "-c", CLIENT, str(args.batch), str(args.length),
                                     str(args.steps)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                    env=client_env) for _ in range(2)]
        together: list[float] = []
        try:
            for c in clients:
                assert c.stdout.readline().strip() == "ready", "an SDK client did not start"
            for _ in range(args.rounds):
                t = time.perf_counter()
                for _ in range(args.steps):
                    local_step()
                local.append((time.perf_counter() - t) / args.steps)
                remote += turn(clients[:1])
                together += turn(clients)
                print(f"in-process {local[-1]:.3f} s/step   service {remote[-1]:.3f} s/step   two clients "
                      f"{together[-2]:.3f} and {together[-1]:.3f} s/step", file=sys.stderr)
        finally:
            for c in clients:
                c.kill()
    a, b, c = statistics.median(local), statistics.median(remote), statistics.median(together)
    print(json.dumps({"benchmark": "tinker_service", "batch": args.batch, "length": args.length,
                      "steps": args.steps, "rounds": args.rounds, "in_process_s_per_step": round(a, 4),
                      "service_s_per_step": round(b, 4), "ratio": round(a / b, 3),
                      "two_clients_s_per_step": round(c, 4), "sharing_ratio": round(b / c, 3)}))


def turn(clients: list[subprocess.Popen]) -> list[float]:
    """Let ``clients`` run their steps at once; each one's s/step."""
    for c in clients:
        c.stdin.write("go\n")
        c.stdin.flush()
    return [json.loads(c.stdout.readline()) for c in clients]


if __name__ == "__main__":
    main()
