"""``deterministic: true``: two runs of the same config and seed, with η = 2, give the same
metrics (every field but times), the same recorded trajectories (tokens, behaviour logprobs,
versions) and bit-identical weights — with generations that a publish split between two
versions, the case timing decides in the default mode."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agentrl.rollout.recorded import read_rows, recorded_steps

ROOT = Path(__file__).resolve().parents[2]
AGENTRL = Path(sys.executable).parent / "agentrl"
STEPS = 6


def start(run_dir: Path) -> subprocess.Popen:
    # two groups in flight (max_concurrent 8 of group_size 4) keep admission staggered, so a
    # publish lands while episodes are mid-generation
    return subprocess.Popen([str(AGENTRL), "train", "examples/arith_grpo.yaml", f"run_dir={run_dir}",
                             "deterministic=true", f"steps={STEPS}", f"trainer.total_steps={STEPS}",
                             "trainer.max_staleness=2", "rollout.batch_size=4", "rollout.group_size=4",
                             "rollout.max_concurrent=8", "rollout.lockstep.chunk_tokens=4",
                             "rollout.lockstep.overlap_rounds=1", "eval.dataset=null", "max_minutes=null",
                             "checkpoint.every_steps=0", "logging.tensorboard=false"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> None:
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert "deterministic: generation in rounds of 4 tokens" in stdout


def untimed(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


def sampled(run_dir: Path) -> list[list[tuple]]:
    return [[(t["input_ids"], t["logprobs"], t["versions"], t["reward"]) for t in read_rows(path)]
            for path in recorded_steps(run_dir / "record")]


def test_two_deterministic_runs_at_eta_2_are_identical(tmp_path):
    from safetensors.torch import load_file

    first, second = tmp_path / "a" / "run", tmp_path / "b" / "run"  # one name: the same group ids
    runs = [start(first), start(second)]  # at the same time: each one's timing disturbs the other's
    for proc in runs:
        finish(proc)
    assert untimed(first) == untimed(second)
    steps = [r for r in untimed(first) if "train/loss" in r]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert max(r["batch/staleness_max"] for r in steps) >= 1  # η > 0 at work: older versions trained on
    trajectories = sampled(first)
    assert trajectories == sampled(second) and len(trajectories) == STEPS
    split = [v for step in trajectories for _, _, v, _ in step if len({x for x in v if x >= 0}) > 1]
    assert split, "no generation spanned a publish"
    w1 = load_file(str(first / "weights" / f"v{STEPS:06d}" / "model.safetensors"))
    w2 = load_file(str(second / "weights" / f"v{STEPS:06d}" / "model.safetensors"))
    assert w1.keys() == w2.keys() and all(bool((w1[k] == w2[k]).all()) for k in w1)
    initial = load_file(str(ROOT / "examples" / "tiny-model" / "model.safetensors"))
    assert any(not bool((w1[k] == initial[k]).all()) for k in w1)  # and training moved them


def test_a_listed_server_that_is_not_batch_invariant_is_refused_in_one_line(tiny_server, tmp_path):
    out = subprocess.run([str(AGENTRL), "train", "examples/arith_grpo.yaml", f"run_dir={tmp_path / 'run'}",
                          "deterministic=true", f"inference.servers=[{tiny_server.url}]", "steps=1",
                          "eval.dataset=null"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    (line,) = out.stderr.strip().splitlines()
    assert "config key 'deterministic'" in line and "--enable-deterministic-inference" in line, line
