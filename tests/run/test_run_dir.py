"""The run directory of `agentrl train`: one run writes it at a time (a second one was found running
into the same directory, interleaving metrics and summaries); a run stopped before its first
checkpoint can be restarted (it was a dead end: a rerun pointed to --resume, --resume found no
checkpoint); a path that is a file, or that cannot be made, is one line, not a traceback; a
run_dir that holds another run, a gateway's recordings or an evaluation's results is refused in one line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agentrl.errors import ConfigError
from agentrl.run.run_lock import LOCK_FILE, LockHeld, RunLock

ROOT = Path(__file__).resolve().parents[2]
AGENTRL = Path(sys.executable).parent / "agentrl"
SMALL = ["eval.limit=20", "rollout.batch_size=4", "rollout.group_size=4", "max_minutes=null",
         "logging.trajectories_per_step=0", "logging.tensorboard=false"]


def train(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(AGENTRL), "train", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def hold_lock(directory: Path) -> subprocess.Popen:
    """Another process holding ``directory``'s lock, as a running ``agentrl train`` does."""
    code = ("import sys, time; from agentrl.run.run_lock import RunLock\n"
            "with RunLock(sys.argv[1], 'agentrl train'):\n    print('held', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(directory)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    holder = hold_lock(tmp_path)
    try:
        with pytest.raises(LockHeld, match=rf"in use by agentrl train \(pid {holder.pid} on host "):
            RunLock(tmp_path, "agentrl eval").acquire()
    finally:
        holder.kill()
        holder.wait()
    # the kernel let go of the SIGKILLed holder's lock; the file still names it: taken over
    with RunLock(tmp_path, "agentrl eval") as lock:
        assert lock.taken_over is not None and lock.taken_over["pid"] == holder.pid
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert (tmp_path / LOCK_FILE).read_text() == ""  # released cleanly: nobody to take over
    with RunLock(tmp_path, "agentrl eval") as lock:
        assert lock.taken_over is None


def test_a_lock_on_a_file_or_an_unmakeable_path_is_one_config_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        RunLock(tmp_path / "file", "agentrl train").acquire()
    with pytest.raises(ConfigError, match="cannot make the directory"):
        RunLock("/proc/no-such/run", "agentrl train").acquire()


def test_agentrl_train_into_a_run_dir_in_use_is_refused_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = hold_lock(run_dir)
    try:
        out = train("examples/arith_grpo.yaml", f"run_dir={run_dir}", "steps=1", *SMALL, timeout=120)
    finally:
        holder.kill()
        holder.wait()
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        line for line in out.stderr.strip().splitlines() if line.startswith("agentrl train: error: ")]
    assert f"is in use by agentrl train (pid {holder.pid} on host" in out.stderr
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "logs").exists()  # nothing started


def test_path_errors_of_train_and_eval_are_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    for cmd, args in (("train", [f"run_dir={tmp_path / 'file'}"]), ("train", ["run_dir=/proc/no-such/run"]),
                      ("eval", [f"run_dir={tmp_path / 'file'}"]), ("eval", ["--out", str(tmp_path / "file")])):
        out = subprocess.run([str(AGENTRL), cmd, "examples/arith_grpo.yaml", *args, "eval.limit=2"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and "Traceback" not in out.stderr, (cmd, args, out.stderr[-2000:])
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "is a file, not a directory" in out.stderr or "cannot make the directory" in out.stderr
        if "file" in args[-1]:  # issue 49: refused before the placement lines, which promised a run
            assert "placement" not in out.stdout, out.stdout


def test_a_run_dir_holding_another_run_is_refused_naming_resume(trained_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run[0], run_dir)  # a finished run with checkpoints
    before = sorted(p.name for p in run_dir.iterdir())
    out = train("examples/arith_grpo.yaml", f"run_dir={run_dir}", "steps=1", *SMALL, timeout=120)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert f"run_dir {str(run_dir)!r} already holds a run; continue it with `agentrl train --resume {run_dir}`" \
        in out.stderr, out.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == before


def test_a_run_dir_holding_a_gateways_recordings_is_refused_in_one_line(tiny_server, tmp_path):
    """Issue 31: ``run_dir=runs/gw`` — the README gateway's own ``--out`` — was accepted, and the
    run's files mixed with the recorded episodes. The recordings here are a real gateway's."""
    from agentrl.process.services import ServiceProcess

    gw_out = tmp_path / "gw"
    cmd = [str(AGENTRL), "gateway", "--model", str(ROOT / "examples" / "tiny-model"), "--upstream", tiny_server.url,
           "--port", "0", "--api-key", "ADMIN", "--out", str(gw_out)]
    with ServiceProcess(cmd, ready="agentrl gateway: ready on ") as gateway, httpx.Client(timeout=60) as http:
        session = http.post(f"{gateway.url}/v1/sessions", headers={"Authorization": "Bearer ADMIN"}, json={}).json()
        key = {"Authorization": f"Bearer {session['api_key']}"}
        r = http.post(f"{session['base_url']}/chat/completions", headers=key, json={
            "model": "policy", "messages": [{"role": "user", "content": "What is 2+3?"}], "max_tokens": 8})
        assert r.status_code == 200, r.text
        http.post(f"{gateway.url}/v1/sessions/{session['session_id']}/reward", headers=key, json={"reward": 1.0})
        assert http.post(f"{gateway.url}/v1/sessions/{session['session_id']}/end", headers=key, json={}).status_code == 200
    recorded = (gw_out / "trajectories.jsonl").read_text()
    assert recorded.count("\n") == 1
    for command, config in (("train", "examples/arith_grpo.yaml"), ("sft", "examples/sft_tools.yaml")):
        out = subprocess.run([str(AGENTRL), command, config, f"run_dir={gw_out}"], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stdout[-2000:] + out.stderr
        assert f"config key 'run_dir': {str(gw_out)!r} holds a gateway's recordings" in out.stderr, out.stderr
        assert f"give agentrl {command} another run_dir=" in out.stderr
        assert f"agentrl sft CONFIG data={gw_out / 'trajectories.jsonl'}" in out.stderr
    assert sorted(p.name for p in gw_out.iterdir()) == ["trajectories.jsonl"]  # nothing of a run was written
    assert (gw_out / "trajectories.jsonl").read_text() == recorded


def test_a_run_dir_holding_an_evaluations_results_is_refused_in_one_line(tmp_path):
    """Issue 31 review: `agentrl train ... run_dir=DIR` over the results of `agentrl eval --out DIR`
    was accepted and wrote a run's files among them. The results here are a real evaluation's."""
    out_dir = tmp_path / "ev"
    out = subprocess.run([str(AGENTRL), "eval", "examples/arith_grpo.yaml", "eval.limit=2", "--out", str(out_dir)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    before = {p.relative_to(out_dir): p.read_bytes() for p in out_dir.rglob("*") if p.is_file()}
    assert {"eval.jsonl", "eval_settings.json", "eval_summary.json"} <= {str(p) for p in before}
    for command, config in (("train", "examples/arith_grpo.yaml"), ("sft", "examples/sft_tools.yaml")):
        out = subprocess.run([str(AGENTRL), command, config, f"run_dir={out_dir}"], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stdout[-2000:] + out.stderr
        assert (f"config key 'run_dir': {str(out_dir)!r} holds the results of `agentrl eval --out` "
                "(eval.jsonl, eval_settings.json, eval_summary.json), not a run") in out.stderr, out.stderr
        assert f"give agentrl {command} another run_dir=" in out.stderr and f"`agentrl view {out_dir}`" in out.stderr
    after = {p.relative_to(out_dir): p.read_bytes() for p in out_dir.rglob("*") if p.is_file()}
    assert after == before  # nothing of a run was written


def test_group_size_1_is_refused_naming_the_key(tmp_path):
    out = train("examples/arith_grpo.yaml", f"run_dir={tmp_path / 'run'}", "rollout.group_size=1", timeout=120)
    assert out.returncode == 2 and "config key 'rollout.group_size'" in out.stderr, out.stderr[-2000:]
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_a_run_stopped_before_its_first_checkpoint_restarts_from_step_0(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([str(AGENTRL), "train", "examples/arith_grpo.yaml", f"run_dir={run_dir}", "steps=500",
                             "checkpoint.every_steps=10", *SMALL], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (run_dir / "metrics.jsonl").exists() or '"step": 2' not in (run_dir / "metrics.jsonl").read_text():
        assert proc.poll() is None and time.monotonic() < deadline, "the run never reached step 2"
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)  # Ctrl-C at step 2, before the first checkpoint (step 10)
    assert proc.wait(120) == 130
    assert not (run_dir / "checkpoints" / "latest").exists()

    shutil.copytree(run_dir, tmp_path / "copy")

    for how, args in (("--resume", ["--resume", str(tmp_path / "copy")]),
                      ("a rerun", ["examples/arith_grpo.yaml", f"run_dir={run_dir}", *SMALL])):
        out = train(*args, "steps=1", "eval.dataset=null")
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert f"stopped before its first checkpoint, so there is nothing to resume: {how} restarts it from " \
               "step 0 in place" in out.stdout, out.stdout[-3000:]
        summary = json.loads(out.stdout.strip().splitlines()[-1])
        assert summary["steps"] == 1 and summary["counters"].get("episodes_replayed", 0) == 0
        restarted = Path(summary["run_dir"])
        rows = [json.loads(line) for line in (restarted / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if "rollout/reward_mean" in r] == [1]  # a fresh run, not the stopped one
        (aside,) = (restarted / "stopped").iterdir()
        assert '"step": 2' in (aside / "metrics.jsonl").read_text()  # the stopped attempt's outputs are kept


def test_agentrl_eval_resumes_only_results_of_the_same_settings(tiny_server, tmp_path):
    """A rerun with the same settings resumes (nothing re-played); one with other sampling is
    refused, naming what differs, instead of mixing two models' or settings' scores."""
    def evaluate(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(Path(sys.executable).parent / "agentrl"), "eval", "examples/arith_grpo.yaml",
                               f"run_dir={tmp_path}", f"inference.servers=[{tiny_server.url}]", "eval.limit=4", *extra],
                              cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=300)
    first = evaluate()
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    again = evaluate()
    assert again.returncode == 0 and json.loads(again.stdout.splitlines()[-1])["pass@1"] == \
        json.loads(first.stdout.splitlines()[-1])["pass@1"]
    assert len((tmp_path / "eval" / "eval.jsonl").read_text().splitlines()) == 4  # resumed: nothing played twice
    other = evaluate("eval.sampling.temperature=1.0")
    assert other.returncode == 2 and "holds results measured with other settings (sampling:" in other.stderr, \
        other.stderr[-2000:]
    assert "evaluate into another --out" in other.stderr


def test_a_model_with_missing_or_truncated_weights_is_one_line(tiny_model_dir, tmp_path):
    """Issue 49: a 64-byte safetensors, or none, was the loader's traceback."""
    from agentrl.config import load_config
    from agentrl.errors import ModelError
    from agentrl.model.tinymodel import load_model
    from agentrl.run.run_config import RunConfig, check_run_config

    model = shutil.copytree(tiny_model_dir, tmp_path / "m", ignore=shutil.ignore_patterns("*.safetensors"))
    cfg = load_config(RunConfig, None, [f"model={model}"])
    with pytest.raises(ConfigError, match="config key 'model': .* has no \\*.safetensors files"):
        check_run_config(cfg)
    (model / "model.safetensors").write_bytes((tiny_model_dir / "model.safetensors").read_bytes()[:64])
    with pytest.raises(ConfigError, match="config key 'model': .* is not a safetensors file"):
        check_run_config(cfg)
    with pytest.raises(ModelError, match="cannot load the model"):
        load_model(model)
