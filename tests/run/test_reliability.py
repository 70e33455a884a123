"""`agentrl train` when parts fail: a killed inference server is restarted and the run goes on; a
SIGKILLed trainer rank stops the run cleanly and `--resume` loses nothing (both in either
placement, colocated and decoupled); a SIGKILLed rollout process (``rollout.worker: process``) stops
the run saying so, and `--resume` loses nothing; a SIGTERM to the run stops everything it started, and so does a SIGKILL; a server that exits at once is said to have
exited; an env that raises on 30% of episodes is counted, not fatal."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AGENTRL = Path(sys.executable).parent / "agentrl"
SMALL = ["eval.limit=20", "rollout.batch_size=4", "rollout.group_size=4", "max_minutes=null",
         "logging.trajectories_per_step=0", "logging.tensorboard=false"]


class Train:
    """``agentrl train`` as a child process whose output lines are collected as they come."""

    def __init__(self, *args: str, env: dict | None = None) -> None:
        self.proc = subprocess.Popen([str(AGENTRL), "train", *args], cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})})
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()

    def wait_for(self, text: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"never saw {text!r}:\n{''.join(self.lines[-40:])}")
            time.sleep(0.2)

    def finish(self, timeout: float = 600) -> tuple[int, str]:
        code = self.proc.wait(timeout)
        time.sleep(0.2)
        return code, "".join(self.lines)


def pids_with(*words: str, without: str = "\0") -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if all(w in cmd for w in words) and without not in cmd:
                out.append(int(d.name))
    return out


PLACEMENTS = ["placement=colocated", "placement=decoupled"]


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_a_killed_inference_server_is_restarted_and_the_run_goes_on(tmp_path, placement):
    run_dir = tmp_path / "run"
    t = Train("examples/arith_grpo.yaml", f"run_dir={run_dir}", "steps=5", "checkpoint.every_steps=0", placement,
              *SMALL)
    t.wait_for("step    2")
    port = json.loads((run_dir / "servers.json").read_text())["servers"][0].rsplit(":", 1)[1]
    victims = pids_with("agentrl", "serve", "--port", port)
    assert len(victims) == 1
    os.kill(victims[0], signal.SIGKILL)
    code, out = t.finish()
    assert code == 0, out[-3000:]
    assert "died with exit code -9; restarting it" in out and "is back at" in out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["steps"] == 5 and summary["server_restarts"] == 1


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_a_killed_trainer_rank_stops_the_run_and_resume_loses_nothing(tmp_path, placement):
    run_dir = tmp_path / "run"
    t = Train("examples/arith_grpo.yaml", f"run_dir={run_dir}", "steps=6", "checkpoint.every_steps=2", placement,
              *SMALL)
    t.wait_for("step    3")
    rank = pids_with("agentrl.run.loop", str(run_dir), without="torch.distributed.run")
    assert len(rank) == 1
    os.kill(rank[0], signal.SIGKILL)
    code, out = t.finish()
    assert code == 2 and "the trainer ranks failed" in out, out[-3000:]
    time.sleep(1)
    port = json.loads((run_dir / "servers.json").read_text())["servers"][0].rsplit(":", 1)[1]
    assert pids_with(str(run_dir)) == [] and pids_with("agentrl", "serve", "--port", port) == []  # nothing left
    logged = len((run_dir / "rollout" / "episodes.jsonl").read_text().splitlines())
    assert logged > 0

    t = Train("--resume", str(run_dir))
    code, out = t.finish()
    assert code == 0, out[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["steps"] == 6 and summary["counters"]["episodes_replayed"] > 0
    assert "resumed from step_000002" in out or "resumed from step_000004" in out


def test_a_killed_rollout_process_stops_the_run_saying_so_and_resume_loses_nothing(tmp_path):
    run_dir = tmp_path / "run"
    t = Train("examples/arith_grpo.yaml", f"run_dir={run_dir}", "steps=6", "checkpoint.every_steps=2", *SMALL)
    t.wait_for("step    3")
    victims = pids_with("agentrl.run.rollout_process", str(run_dir))
    assert len(victims) == 1
    os.kill(victims[0], signal.SIGKILL)
    code, out = t.finish()
    assert code == 2 and f"the rollout process (pid {victims[0]}) exited with code -9" in out, out[-3000:]
    time.sleep(1)
    port = json.loads((run_dir / "servers.json").read_text())["servers"][0].rsplit(":", 1)[1]
    assert pids_with(str(run_dir)) == [] and pids_with("agentrl", "serve", "--port", port) == []  # nothing left

    t = Train("--resume", str(run_dir))
    code, out = t.finish()
    assert code == 0, out[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["steps"] == 6 and summary["counters"]["episodes_replayed"] > 0


def test_sigterm_stops_the_run_and_every_process_it_started(tmp_path):
    run_dir = tmp_path / "run"
    t = Train("examples/arith_grpo.yaml", f"run_dir={run_dir}", "steps=500", "checkpoint.every_steps=0", *SMALL)
    t.wait_for("step    2")
    port = json.loads((run_dir / "servers.json").read_text())["servers"][0].rsplit(":", 1)[1]
    assert len(pids_with("agentrl", "serve", "--port", port)) == 1
    t.proc.send_signal(signal.SIGTERM)  # what kill, Slurm's scancel or a closed terminal (SIGHUP) send
    code, out = t.finish(timeout=120)
    assert code == 128 + signal.SIGTERM and "agentrl train: SIGTERM received; stopping its processes" in out, out[-3000:]
    assert "Traceback" not in out and "SignalException" not in out, out[-3000:]  # one line, not torchrun's last words
    time.sleep(1)
    assert pids_with(str(run_dir)) == [] and pids_with("agentrl", "serve", "--port", port) == []  # nothing left


def test_sigkill_of_the_run_takes_every_process_it_started_with_it(tmp_path):
    """An OOM kill of the launcher runs no ``finally``: its server was found re-parented to pid 1,
    holding its core. The parent-death signal reaches the server and torchrun (which stops its rank)."""
    run_dir = tmp_path / "run"
    t = Train("examples/arith_grpo.yaml", f"run_dir={run_dir}", "steps=500", "checkpoint.every_steps=0", *SMALL)
    t.wait_for("step    2")
    port = json.loads((run_dir / "servers.json").read_text())["servers"][0].rsplit(":", 1)[1]
    assert len(pids_with("agentrl", "serve", "--port", port)) == 1 and pids_with("agentrl.run.loop", str(run_dir))
    t.proc.send_signal(signal.SIGKILL)
    assert t.finish(timeout=30)[0] == -signal.SIGKILL
    deadline = time.monotonic() + 60
    while pids_with(str(run_dir)) or pids_with("agentrl", "serve", "--port", port):
        assert time.monotonic() < deadline, f"left running: {pids_with(str(run_dir))}, server {port}"
        time.sleep(0.5)
    t = Train("--resume", str(run_dir), "steps=1", "eval.dataset=null")  # the dead run's lock is free: taken over
    code, out = t.finish()
    assert code == 0 and "took over the lock of agentrl train (pid " in out, out[-3000:]


def test_a_server_that_exits_at_once_is_said_to_have_exited(tmp_path):
    """A corrupt model config.json: the server exits in a second; the launcher said it "did not
    become ready within 300 s"."""
    model = tmp_path / "model"
    shutil.copytree(ROOT / "examples" / "tiny-model", model)
    (model / "config.json").write_text('{"model_type": "llama", ')
    started = time.monotonic()
    code, out = Train("examples/arith_grpo.yaml", f"run_dir={tmp_path / 'run'}", f"model={model}", *SMALL).finish()
    assert code == 2 and "exited with code 2 before it was ready" in out and "not valid JSON" in out, out[-3000:]
    assert "did not become ready" not in out and time.monotonic() - started < 60


def test_a_run_whose_episodes_all_fail_ends_with_code_1_saying_why(tmp_path):
    env = {"PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    t = Train("examples/arith_grpo.yaml", f"run_dir={tmp_path / 'run'}", "steps=2", "checkpoint.every_steps=0",
              "rollout.dataset=flaky_arith:rows", "rollout.workflow_args.env_id=test/BrokenArith-v0",
              "eval.dataset=null", *SMALL, env=env)
    code, out = t.finish()
    assert code == 1, out[-3000:]
    assert "episodes failed (env_error" in out and "the run learned from almost nothing" in out, out[-2000:]
    assert "The first error: env_error: " in out and "the broken env broke on purpose" in out, out[-2000:]


def test_an_env_failing_on_30_percent_of_episodes_is_counted_not_fatal(tmp_path):
    run_dir = tmp_path / "run"
    env = {"PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    t = Train("examples/arith_grpo.yaml", f"run_dir={run_dir}", "steps=3", "checkpoint.every_steps=0",
              "rollout.dataset=flaky_arith:rows", "rollout.workflow_args.env_id=test/FlakyArith-v0",
              "eval.dataset=null", *SMALL, env=env)
    code, out = t.finish()
    assert code == 0, out[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    failed = sum(r["rollout/failed"] for r in rows)
    total = sum(r["rollout/trajectories"] for r in rows)
    # a coin per sampled reply (replies within a group often agree): wide bounds, never a failed run
    assert 0.05 < failed / total < 0.6, (failed, total)
    assert all(r["batch/num_env_error"] == r["rollout/failed"] for r in rows)
    assert all(r["train/loss"] == pytest.approx(r["train/loss"]) for r in rows)  # finite: a step was trained
