"""`agentrl train` end to end on the demo's config (a few steps): the real launcher, a real
`agentrl serve`, torchrun, the rollout executor, checkpoints, and `--resume`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AGENTRL = Path(sys.executable).parent / "agentrl"


def train(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(AGENTRL), "train", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def run(trained_run):
    """The shared short run (tests/conftest.py: 3 steps, batches of 4 groups of 4, a checkpoint
    every 2 steps, 4 sampled trajectories a step)."""
    return trained_run


def test_the_last_line_is_the_summary(run):
    run_dir, out = run
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 3 and summary["run_dir"] == str(run_dir)
    assert 0.0 <= summary["eval_before"] <= 1.0 and 0.0 <= summary["eval_after"] <= 1.0
    assert summary["minutes"] > 0 and summary["counters"]["groups_finished"] >= 3 * 4


def test_metrics_files_and_curves(run):
    run_dir, _ = run
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert r["rollout/trajectories"] == 16 and r["batch/num_kept"] == 16
        assert r["batch/staleness_max"] <= 2  # η of the demo config
        assert sum(v for k, v in r.items() if k.startswith("staleness/")) == 16  # the histogram
        for key in ("train/loss", "train/clip_frac", "train/behaviour_weight_mean", "perf/weight_pause_s",
                    "perf/generation_tokens_per_s", "perf/trainer_idle_fraction", "rollout/response_tokens_mean"):
            assert key in r, key
        assert 0 < r["perf/loop_cpu_s"] < 60  # the event loop's own CPU seconds in the step
    assert {r["step"] for r in rows if "eval/pass@1" in r} == {0, 3}
    assert (run_dir / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_000003"


def test_sampled_trajectories_agree_with_the_trainer(run):
    """At step 1 the trainer still holds version 0: its log-probabilities of the tokens version 0
    sampled must equal the sampler's — proof the stream, the mask and the logprobs line up."""
    run_dir, _ = run
    rows = [json.loads(line) for line in (run_dir / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    checked = 0
    for r in rows:
        assert len(r["tokens"]) == len(r["input_ids"]) == len(r["trainer_logprobs"]) == len(r["entropy"])
        assert isinstance(r["advantage"], float) and all(e >= 0 for e in r["entropy"])
        for m, v, lp, tlp in zip(r["loss_mask"], r["versions"], r["logprobs"], r["trainer_logprobs"], strict=True):
            if m == 1 and v == 0:
                assert tlp == pytest.approx(lp, abs=2e-3)
                checked += 1
    assert checked > 10
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["group_id"], []).append(r)
    for members in groups.values():  # GRPO: above the group's mean reward, a positive advantage
        mean = sum(r["reward"] for r in members) / len(members)
        if len(members) == 4:  # the whole group is in the sample
            assert all((r["advantage"] > 0) == (r["reward"] > mean) and (r["advantage"] == 0) == (r["reward"] == mean)
                       for r in members), [(r["reward"], r["advantage"]) for r in members]


def test_every_trajectory_is_recorded_with_its_episodes_environment_io(run):
    """record/step_N.jsonl holds every trajectory of the step whole, and each episode's first one
    the env's inputs and outputs: the task, the opening messages, the reply as the env got it, the
    reward and its terms — the reward the trajectory carries. The viewer's JSON routes serve it."""
    from fastapi.testclient import TestClient

    from agentrl.view.rundata import RunData
    from agentrl.view.viewer import build_app

    run_dir, _ = run
    for step in (1, 2, 3):
        rows = [json.loads(line) for line in (run_dir / "record" / f"step_{step:06d}.jsonl").read_text().splitlines()]
        assert len(rows) == 16 and len({r["episode_id"] for r in rows}) == 16  # 4 groups of 4, one segment each
        for r in rows:
            record = r["record"]
            assert record["truncated"] is False and 0 < record["bytes"] <= 65536
            reset, generate, step_ = record["events"]
            assert reset["task"]["question"] == reset["observation"][-1]["content"]
            assert generate["tokens"] == sum(r["loss_mask"]) and generate["seed"] is None
            assert step_["reward"] == r["reward"] and set(step_["info"]["rewards"]) == {"correct", "format"}
            assert step_["info"]["correct"] == (r["reward"] > 0)
    client = TestClient(build_app([RunData(run_dir)]))
    assert client.get("/api/runs").json()[0]["recorded_steps"] == [1, 2, 3]
    served = client.get("/api/runs/0/record/3").json()
    assert [s["record"] for s in served] == [r["record"] for r in rows]  # rows: step 3's
    sampled = client.get("/api/runs/0/steps/1").json()
    assert sampled and all(s["record"]["events"][0]["kind"] == "reset" for s in sampled)


def test_resume_continues_from_the_checkpoint(run, tmp_path):
    import shutil

    src, _ = run
    run_dir = tmp_path / "resumed"
    shutil.copytree(src, run_dir)
    (run_dir / "checkpoints" / "latest").write_text("step_000002")  # as if it crashed during step 3
    out = train("--resume", str(run_dir), "steps=4")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 4 and summary["eval_before"] is not None
    assert summary["counters"]["episodes_replayed"] > 0  # generations of the first run, not redone
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "rollout/reward_mean" in r] == [1, 2, 3, 4]
    assert "resumed from step_000002" in out.stdout


@pytest.mark.parametrize("eta", [0, 1])
def test_colocated_runs_train_and_resume(tmp_path, eta):
    """placement colocated: generation pauses for each train step (in-flight requests resume after
    the publish), with η = 0 (synchronous) and η = 1 (the next batch's episodes admitted during a
    step, their tokens at most one version old); a checkpoint, then --resume to the end. At η = 1
    the server also releases its KV cache while the trainer trains (inference.release_memory).
    The episodes run in rank 0's event loop at η = 0 (rollout.worker thread) and in a process of
    their own at η = 1 (auto): the paused servers hold that process's requests."""
    run_dir = tmp_path / "run"
    small = ["eval.limit=20", "rollout.batch_size=4", "rollout.group_size=4", "max_minutes=null",
             "logging.trajectories_per_step=0", "checkpoint.every_steps=2"]
    release = "true" if eta else "null"
    out = train("examples/arith_grpo.yaml", f"run_dir={run_dir}", "placement=colocated",
                f"trainer.max_staleness={eta}", "steps=2", f"inference.release_memory={release}",
                f"rollout.worker={'auto' if eta else 'thread'}", *small)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    worker = "process" if eta else "thread"
    assert out.stdout.splitlines()[1].startswith(f"agentrl train: rollout.worker {worker} ("), out.stdout[:500]
    assert out.stdout.startswith("agentrl train: placement colocated (placement set): generation and training "
                                 "take turns, each with all"), out.stdout[:300]
    assert ("memory released" in out.stdout.splitlines()[0]) == bool(eta)
    out = train("--resume", str(run_dir), "steps=4")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "placement colocated" in out.stdout.splitlines()[0] and "resumed from step_000002" in out.stdout
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert max(r["batch/staleness_max"] for r in steps) <= eta
    assert all(r["rollout/failed"] == 0 for r in steps)


def test_a_short_run_with_weights_sent_by_broadcast(tmp_path):
    """trainer.weight_sync.transport=distributed: every publish is a broadcast from rank 0 to the
    server over a gloo group of their own (no checkpoint written for it); two steps finish."""
    run_dir = tmp_path / "run"
    out = train("examples/arith_grpo.yaml", f"run_dir={run_dir}", "trainer.weight_sync.transport=distributed",
                "steps=2", "eval.dataset=null", "rollout.batch_size=2", "rollout.group_size=4", "max_minutes=null",
                "checkpoint.every_steps=0", "logging.trajectories_per_step=0", "logging.tensorboard=false",
                timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["perf/weight_pause_s"] > 0 for r in steps)
    assert not (run_dir / "weights").exists()  # nothing went through files
    log = (run_dir / "logs" / "trainer.log").read_text()
    assert "weight group 'agentrl_weights' formed: trainer rank 0 and 1 server rank(s) on 1 server(s), gloo" in log
    assert "buckets staged while the servers generate, committed in the pause" in log  # overlapped
    assert all(r["perf/weight_deliver_s"] > 0 for r in steps)


def test_a_lora_run_sends_its_adapter_by_broadcast(tmp_path):
    """trainer.lora with trainer.weight_sync.transport=distributed: each publish broadcasts the
    adapter alone to agentrl serve, which merges it (adapters: auto); no file is written for it."""
    run_dir = tmp_path / "run"
    out = train("examples/arith_grpo.yaml", f"run_dir={run_dir}", "trainer.lora.rank=8",
                "trainer.weight_sync.transport=distributed", "steps=2", "eval.dataset=null", "rollout.batch_size=2",
                "rollout.group_size=4", "max_minutes=null", "checkpoint.every_steps=0",
                "logging.trajectories_per_step=0", "logging.tensorboard=false", timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["steps"] == 2
    assert not (run_dir / "weights").exists()  # nothing went through files
    log = (run_dir / "logs" / "trainer.log").read_text()
    assert "weight group 'agentrl_weights' formed: trainer rank 0 and 1 server rank(s) on 1 server(s), gloo" in log
    assert ("each publish broadcasts the adapter alone (broadcast: adapter, 70 tensors, " in log  # 5 layers x 7 x A, B
            and "1 bucket(s)), merged into the servers' base weights" in log), log[-2000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["perf/weight_deliver_s"] > 0 for r in steps)


def test_a_lora_run_on_two_ranks_publishes_adapters_and_resumes(tmp_path):
    """trainer.lora on two FSDP ranks: every publish and checkpoint holds the adapter alone (peft's
    files; the full weights are never written), and --resume continues the run from its checkpoint."""
    run_dir = tmp_path / "run"
    small = ["eval.dataset=null", "rollout.batch_size=2", "rollout.group_size=4", "max_minutes=null",
             "logging.trajectories_per_step=0", "logging.tensorboard=false", "checkpoint.every_steps=1"]
    out = train("examples/arith_grpo.yaml", f"run_dir={run_dir}", "trainer.lora.rank=8", "world_size=2", "steps=1",
                *small, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    adapter = ["adapter_config.json", "adapter_model.safetensors"]
    assert sorted(f.name for f in (run_dir / "checkpoints" / "step_000001" / "trainer" / "adapter").iterdir()) == adapter
    out = train("--resume", str(run_dir), "steps=2", timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "resumed from step_000001" in out.stdout
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2] and [r["train/optimizer_steps"] for r in steps] == [1, 2]
    published = sorted((run_dir / "weights").iterdir())
    assert [p.name for p in published] == ["v000001", "v000002"]
    assert all(sorted(f.name for f in p.iterdir()) == adapter for p in published)
    assert not list(run_dir.rglob("model.safetensors"))


def test_bad_configs_fail_before_anything_starts(tmp_path):
    out = train("examples/arith_grpo.yaml", f"run_dir={tmp_path / 'a'}", "rollout.group_sise=4", timeout=120)
    assert out.returncode == 2 and "did you mean 'rollout.group_size'" in out.stderr
    out = train("examples/arith_grpo.yaml", f"run_dir={tmp_path / 'b'}", "rollout.workflow_args.env_id=agentrl/Arth-v0",
                timeout=120)
    assert out.returncode == 2 and "rollout.workflow_args.env_id" in out.stderr and "Arith-v0" in out.stderr
    out = train("examples/arith_grpo.yaml", f"run_dir={tmp_path / 'c'}", "model=/nonexistent", timeout=120)
    assert out.returncode == 2 and "config key 'model'" in out.stderr
    out = train("examples/arith_grpo.yaml", f"run_dir={tmp_path / 'd'}", "eval.sampling.max_new_tokens=1024",
                timeout=120)  # the tiny model's whole context
    assert out.returncode == 2 and "config key 'eval.sampling.max_new_tokens'" in out.stderr
    assert "context of 1024 tokens" in out.stderr
    # issue 31 as found: examples/code_agent_docker.yaml's rollout budget of 1024 tokens (the whole
    # context) failed every episode with INFERENCE_ERROR, and the run exited 0
    out = train("examples/arith_grpo.yaml", f"run_dir={tmp_path / 'e'}", "rollout.sampling.max_new_tokens=1024",
                timeout=120)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stdout[-2000:] + out.stderr
    assert "config key 'rollout.sampling.max_new_tokens': 1024 tokens leave no room for a prompt" in out.stderr
    assert "context of 1024 tokens" in out.stderr
    for name in "acde":
        assert not (tmp_path / name).exists(), name
    out = train("--resume", str(tmp_path / "nothing"), timeout=120)
    assert out.returncode == 2 and "no complete checkpoint" in out.stderr
