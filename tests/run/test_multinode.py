"""Two torchrun nodes on one machine: `agentrl train` once per node (nnodes=2, node_rank 0 and 1,
the rendezvous over loopback) trains the same first step as one node running both ranks.

Both runs see the same batch: η = 0 admits exactly the first B rows, and every episode samples
with its own seed (seeded_workflow.py), so the first step's loss, entropy and gradient norm
(reduced over the two ranks by the process group) must agree to float precision.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.process.services import free_port

ROOT = Path(__file__).resolve().parents[2]
AGENTRL = Path(sys.executable).parent / "agentrl"
RUN = ["examples/arith_grpo.yaml", "steps=1", "world_size=2", "rollout.workflow=seeded_workflow:SeededEnvWorkflow",
       "rollout.batch_size=4", "rollout.group_size=4", "trainer.max_staleness=0", "eval.dataset=null",
       "checkpoint.every_steps=0", "max_minutes=null", "logging.tensorboard=false", "logging.trajectories_per_step=0"]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}

pytestmark = pytest.mark.timeout(900)


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([str(AGENTRL), "train", *RUN, *args], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    return out


def first_step(run_dir: Path) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in rows if r["step"] == 1 and "train/loss" in r)


def test_two_nodes_train_the_first_step_like_one(tmp_path):
    one = tmp_path / "one-node"
    finish(start(f"run_dir={one}"))
    two = tmp_path / "two-nodes"
    port = free_port()
    nodes = [start(f"run_dir={two}", "nnodes=2", f"node_rank={r}", "master_addr=127.0.0.1", f"master_port={port}")
             for r in (0, 1)]
    try:
        out0, out1 = finish(nodes[0]), finish(nodes[1])
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
    assert "node 0 of 2: 1 rank(s), rendezvous at 127.0.0.1" in out0
    assert json.loads(out1.strip().splitlines()[-1])["node_rank"] == 1
    assert "inference server" not in out1  # node 1 started none: it trains only
    a, b = first_step(one), first_step(two)
    # the same batch reached both (else the comparison below means nothing)
    assert (a["rollout/trajectories"], a["rollout/reward_mean"]) == (b["rollout/trajectories"], b["rollout/reward_mean"])
    assert a["rollout/response_tokens_mean"] == b["rollout/response_tokens_mean"]
    # at ratio 1 the loss is -sum(A * tokens) / tokens, about 0 for equal-length replies; the gradient
    # norm (all-reduced over the two ranks before clipping) and the entropy carry the model's numbers
    assert b["train/loss"] == pytest.approx(a["train/loss"], abs=1e-5)
    assert a["train/grad_norm"] > 0.1
    assert b["train/grad_norm"] == pytest.approx(a["train/grad_norm"], rel=1e-5)
    assert b["train/entropy"] == pytest.approx(a["train/entropy"], rel=1e-5)
