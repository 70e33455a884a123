"""The end-to-end test: the demo's whole loop on the tiny model for two steps, as `make demo` runs it.

A real `agentrl serve`, RemoteEngine, agentrl/Arith-v0, the one-rank FSDP2 actor and weight
publishing all take part; the served policy version must follow the trainer's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_demo_runs_two_grpo_steps_and_publishes_each(tmp_path, tiny_model_dir):
    out = tmp_path / "demo"
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "grpo_arith.py"), f"model={tiny_model_dir}", f"out={out}",
         "steps=2", "prompts=4", "samples=4", "eval_problems=40", "eval_every=1", "filter_groups=true"],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["final_version"] == 2 and summary["steps"] == 2
    assert 0.0 <= summary["accuracy_before"] <= 1.0 and 0.0 <= summary["accuracy_after"] <= 1.0
    assert summary["eval_problems"] == 40
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["version"], m["client_version"]) for m in rows] == [(1, 1, 1), (2, 2, 2)]
    assert all(0.0 <= m["reward_mean"] <= 1.0 and m["grad_norm"] >= 0.0 for m in rows)
    assert 0.0 <= rows[0]["eval_accuracy"] <= 1.0 and "eval_accuracy" not in rows[1]  # the last one is "after"
    assert (out / "demo.png").stat().st_size > 10_000
    assert yaml.safe_load((out / "config.yaml").read_text())["steps"] == 2
    assert [p.name for p in (out / "weights").iterdir()] == ["v000002"]


def test_demo_bad_override_is_one_line_naming_the_key(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "grpo_arith.py"), "stpes=3", f"out={tmp_path}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "grpo_arith: error: unknown config key 'stpes'; did you mean 'steps'? (known keys here: clip, eval_every, "
        "eval_problems, eval_seed, filter_groups, kl_coef, lr, max_new_tokens, max_running_requests, min_lr_ratio, "
        "model, out, prompts, samples, sampling_seed, seed, steps, temperature, threads, top_p, warmup_steps)"
    )


def test_filter_groups_keeps_only_groups_whose_rewards_differ(monkeypatch):
    import importlib.util

    from agentrl.api import Trajectory

    spec = importlib.util.spec_from_file_location("grpo_arith", ROOT / "examples" / "grpo_arith.py")
    demo = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "grpo_arith", demo)  # its dataclass looks itself up there
    spec.loader.exec_module(demo)

    def traj(group: str, reward: float) -> Trajectory:
        return Trajectory(input_ids=[1, 2], loss_mask=[0, 1], logprobs=[0.0, -1.0], versions=[-1, 0],
                          reward=reward, group_id=group)

    mixed = [traj("a", 1.0), traj("a", 0.0), traj("b", 0.0), traj("b", 0.0), traj("c", 1.0), traj("c", 1.0)]
    assert [(t.group_id, t.reward) for t in demo.informative_groups(mixed)] == [("a", 1.0), ("a", 0.0)]
    same = [traj("a", 0.0), traj("b", 1.0)]
    assert demo.informative_groups(same) == same  # nothing differs: keep all rather than train on nothing
