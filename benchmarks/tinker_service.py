"""A training step through `agentrl service` (the Tinker API) against the same step in `agentrl train`.

Three sides run the same step on the tiny model: ``ppo`` on ``--batch`` sequences of
``--length`` + 1 tokens (every token after the first a loss token), LoRA rank 8 (alpha 8, on the
seven attention and MLP projections), then one AdamW step (lr 1e-4, betas 0.9/0.95, eps 1e-12,
no weight decay, no clipping), on one torch thread:

- ``agentrl train``: what its trainer loop (``agentrl.run.loop``) runs for a step on one rank —
  ``prepare_batch`` over the trajectories, then ``Actor.train_step`` (FSDP2 with one rank, peft
  LoRA, packed sequences, ``trainer.loss.kind: ppo``); the trajectories carry the sampler's
  log-probabilities and a reward each (one group: ``group_norm`` advantages);
- through the service: the unmodified ``tinker`` SDK in ``.venv-tinker`` (``make tinker``)
  against an ``agentrl service`` subprocess, ``forward_backward(data, "ppo")`` then
  ``optim_step``, waiting for each step's result before the next (as the cookbook's loops do);
  each datum is the same sequence with the same sampler log-probabilities and its advantage from
  ``agentrl train``'s batch divided by the batch's loss tokens N (Tinker's ``ppo`` is a sum over
  tokens, agentrl's a token mean: with A/N the two losses are one number, which the JSON line
  shows for the first step of each side, both from the same base model with B = 0);
- in-process: the service's own learner (``agentrl.service.learner.Learner``) called directly,
  no HTTP.

The sampler log-probabilities are the base model's own (a no-grad pass of the learner) plus
Gaussian noise of 0.1, so the ratios start near 1 and a few tokens clip, as with an engine. The sides alternate for ``--rounds`` rounds of ``--steps`` steps,
so load drifts on a shared machine reach each of them; the ratios use each side's median step:

    ratio            = agentrl train s/step ÷ service s/step     goal: >= 0.8 (above 1: the service is faster)
    ratio_in_process = in-process s/step ÷ service s/step        what HTTP, protobuf and polling cost

Then the cost of sharing: a second SDK client (its own adapter and optimizer) steps at the same
time as the first; each one's s/step together against the first's alone:

    sharing_ratio = alone s/step ÷ together s/step (each client's)  one worker: about 1/2

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
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "examples" / "tiny-model"
KEY = "tml-benchmark"
ADAM = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0, "grad_clip_norm": 0.0}

CLIENT = '''
import json, os, sys, time
import numpy as np, tinker
from tinker import types
steps = int(sys.argv[1])
adam = types.AdamParams(**json.loads(sys.argv[2]))
spec = json.loads(sys.stdin.readline())  # the batch: sequences, sampler logprobs, advantages
data = [types.Datum(model_input=types.ModelInput.from_ints(s[:-1]),
                    loss_fn_inputs={"target_tokens": np.array(s[1:]), "logprobs": np.array(q, np.float32),
                                    "advantages": np.full(len(q), a, np.float32)})
        for s, q, a in zip(spec["seqs"], spec["logprobs"], spec["advantages"])]
sc = tinker.ServiceClient()
tc = sc.create_lora_training_client(base_model=sc.get_server_capabilities().supported_models[0].model_name,
                                    rank=8, seed=0).result()
def step():
    fb = tc.forward_backward(data, "ppo")
    tc.optim_step(adam).result()
    return fb.result().metrics["loss:sum"]
print(json.dumps(step()), flush=True)  # warm-up: the first step's loss
for _ in sys.stdin:  # the parent's turn signal, until it closes
    t = time.perf_counter()
    for _ in range(steps):
        step()
    print(json.dumps((time.perf_counter() - t) / steps), flush=True)
os._exit(0)
'''


def the_batch(batch: int, length: int) -> tuple[list[list[int]], list[list[float]]]:
    """Random sequences of ``length + 1`` tokens, and each one's log-probabilities under the base
    model (the sampler's, as if it had sampled them: the base model's, with a little noise)."""
    from agentrl.service.learner import Learner, LoraSettings
    from agentrl.service.proto import Datum, ForwardBackward

    rng = np.random.default_rng(0)
    seqs = [rng.integers(3, 250, length + 1).tolist() for _ in range(batch)]
    learner = Learner(MODEL)
    learner.create("base", LoraSettings(rank=1, seed=0))  # B = 0: the base model
    fb = ForwardBackward("base", 1, [Datum(s[:-1], {"target_tokens": np.array(s[1:]),
                                                    "weights": np.ones(length, np.float32)}) for s in seqs],
                         "cross_entropy", {}, forward_only=True)
    outputs, _ = learner.forward_backward(fb)
    # the sampler a little off the trainer (as an engine is): ratios near 1, a few clipped
    return seqs, [np.minimum(o["logprobs"] + rng.normal(0.0, 0.1, length), 0.0).astype(np.float32).tolist()
                  for o in outputs]


def agentrl_train(seqs: list[list[int]], logprobs: list[list[float]]) -> tuple[Callable[[], object], list[float], float]:
    """``agentrl train``'s step on one rank (``prepare_batch`` + ``Actor.train_step``); returns the
    step, each sequence's advantage and the first (warm-up) step's loss."""
    from agentrl.api import NOT_SAMPLED, Trajectory
    from agentrl.process.services import free_port
    from agentrl.trainer.actor import Actor
    from agentrl.trainer.batch import prepare_batch
    from agentrl.trainer.trainer_config import LoraConfig, LossConfig, TrainerConfig

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    config = TrainerConfig(lr=ADAM["learning_rate"], betas=[ADAM["beta1"], ADAM["beta2"]], adam_eps=ADAM["eps"],
                           weight_decay=0.0, grad_clip=0.0, dtype="float32", loss=LossConfig(kind="ppo"),
                           lora=LoraConfig(rank=8, alpha=8.0))
    actor = Actor(MODEL, config)

    def batch():  # fresh trajectories each step, as the loop's are (none stale); one group, rewards 0/1
        v = actor.version
        trajectories = [Trajectory(s, [0] + [1] * (len(s) - 1), [0.0, *q], [NOT_SAMPLED] + [v] * (len(s) - 1),
                                   reward=float(i % 2), group_id="g", episode_id=f"e{i}")
                        for i, (s, q) in enumerate(zip(seqs, logprobs, strict=True))]
        return prepare_batch(trajectories, version=v, config=config)

    def step(b=None) -> dict[str, float]:
        b = b if b is not None else batch()
        return actor.train_step(b, token_stats=min(16, len(b)))  # the loop's default logging.trajectories_per_step

    first = batch()
    advantages = [float(s["advantages"][-1]) for s in first.sequences]
    return step, advantages, step(first)["loss"]  # warm-up


def in_process(seqs: list[list[int]], logprobs: list[list[float]], advantages: list[float]) -> tuple[Callable, float]:
    """The service's learner called directly; returns the step and the first step's loss."""
    from agentrl.service.learner import Learner, LoraSettings
    from agentrl.service.proto import Datum, ForwardBackward

    learner = Learner(MODEL)
    learner.create("bench", LoraSettings(rank=8, seed=0))
    fb = ForwardBackward("bench", 1, [Datum(s[:-1], {"target_tokens": np.array(s[1:]), "logprobs": np.array(q, np.float32),
                                                     "advantages": np.full(len(q), a, np.float32)})
                                      for s, q, a in zip(seqs, logprobs, advantages, strict=True)],
                         "ppo", {}, forward_only=False)

    def step() -> float:
        _, metrics = learner.forward_backward(fb)
        learner.optim_step("bench", ADAM)
        return metrics["loss:sum"]

    return step, step()  # warm-up


def timed(step: Callable[[], object], steps: int) -> float:
    t = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t) / steps


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

    seqs, logprobs = the_batch(args.batch, args.length)
    train_step, advantages, train_loss = agentrl_train(seqs, logprobs)
    n_tokens = args.batch * args.length  # Tinker's ppo sums over tokens; agentrl's is their mean
    local_step, local_loss = in_process(seqs, logprobs, [a / n_tokens for a in advantages])
    spec = json.dumps({"seqs": seqs, "logprobs": logprobs, "advantages": [a / n_tokens for a in advantages]})
    # --sampler: a URL never called (no sampling here), so no agentrl serve is started
    cmd = [str(Path(sys.executable).parent / "agentrl"), "service", "--model", str(MODEL), "--port", "0",
           "--api-key", KEY, "--dir", str(ROOT / "runs" / "bench-tinker-service"), "--sampler", "http://127.0.0.1:9"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_"))}
    env["OMP_NUM_THREADS"] = "1"
    times: dict[str, list[float]] = {"train": [], "local": [], "remote": [], "together": []}
    with ServiceProcess(cmd, ready=READY, env=env) as service:
        client_env = {k: v for k, v in env.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        client_env.update(TINKER_BASE_URL=service.url, TINKER_API_KEY=KEY, TINKER_TELEMETRY="0")
        clients = [subprocess.Popen([str(tinker_python), "-c", CLIENT, str(args.steps), json.dumps(ADAM)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=client_env)
                   for _ in range(2)]
        try:
            remote_loss = [turn([c], spec)[0] for c in clients][0]  # each client's warm-up step
            for _ in range(args.rounds):
                times["train"].append(timed(train_step, args.steps))
                times["remote"] += turn(clients[:1])
                times["local"].append(timed(local_step, args.steps))
                times["together"] += turn(clients)
                print("agentrl train {:.3f}  service {:.3f}  in-process {:.3f} s/step   two clients {:.3f} and {:.3f}"
                      .format(times["train"][-1], times["remote"][-1], times["local"][-1], *times["together"][-2:]),
                      file=sys.stderr)
        finally:
            for c in clients:
                c.kill()
    train, remote, local, together = (statistics.median(times[k]) for k in ("train", "remote", "local", "together"))
    print(json.dumps({"benchmark": "tinker_service", "batch": args.batch, "length": args.length, "loss": "ppo",
                      "lora_rank": 8, "steps": args.steps, "rounds": args.rounds,
                      "agentrl_train_s_per_step": round(train, 4), "service_s_per_step": round(remote, 4),
                      "ratio": round(train / remote, 3), "in_process_s_per_step": round(local, 4),
                      "ratio_in_process": round(local / remote, 3), "two_clients_s_per_step": round(together, 4),
                      "sharing_ratio": round(remote / together, 3),
                      "first_loss": {"agentrl_train": round(train_loss, 6), "service": round(remote_loss, 6),
                                     "in_process": round(local_loss, 6)}}))


def turn(clients: list[subprocess.Popen], line: str = "go") -> list[float]:
    """Send each client ``line`` (its turn to step, or the batch) and read back one number each:
    its s/step, or its warm-up step's loss."""
    for c in clients:
        c.stdin.write(line + "\n")
        c.stdin.flush()
    return [json.loads(c.stdout.readline()) for c in clients]


if __name__ == "__main__":
    main()
