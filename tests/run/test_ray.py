"""`agentrl train ... launcher=ray` on a one-machine Ray cluster the test starts (CPU): two inference
servers behind SGLang's router and two trainer ranks, all Ray actors, train a few steps; the run
gives every CPU back, and the cluster (stopped by the test) outlives it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.process.services import free_port

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SMALL = ["steps=2", "eval.limit=20", "rollout.batch_size=4", "rollout.group_size=4", "checkpoint.every_steps=0",
         "max_minutes=null", "logging.trajectories_per_step=0"]

pytestmark = pytest.mark.timeout(600)


def resources(address: str) -> tuple[dict, dict]:
    """(cluster, available) resources, asked by a fresh driver."""
    code = ("import json, sys, ray; ray.init(address=sys.argv[1], log_to_driver=False); "
            "print(json.dumps([ray.cluster_resources(), ray.available_resources()]))")
    out = subprocess.run([sys.executable, "-c", code, address], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return tuple(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """`ray start --head --block` on free ports; SIGTERM to it stops every process it started."""
    port = free_port()
    tmp = tmp_path_factory.mktemp("ray")
    cmd = [str(BIN / "ray"), "start", "--head", "--block", "--port", str(port), "--num-cpus", "6",
           "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", str(tmp),
           "--dashboard-port", str(free_port()), "--ray-client-server-port", str(free_port()),
           "--dashboard-agent-listen-port", str(free_port()), "--min-worker-port", "0", "--max-worker-port", "0"]
    log = (tmp / "ray-start.log").open("w")
    head = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while "--block" not in (tmp / "ray-start.log").read_text():
            assert head.poll() is None and time.monotonic() < deadline, (tmp / "ray-start.log").read_text()[-3000:]
            time.sleep(1)
        yield address
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait(10)
        log.close()


def test_a_ray_launched_run_trains_and_gives_the_cluster_back(ray_cluster, tmp_path):
    run_dir = tmp_path / "run"
    out = subprocess.run([str(BIN / "agentrl"), "train", "examples/arith_grpo.yaml", "launcher=ray",
                          f"ray.address={ray_cluster}", f"run_dir={run_dir}", "world_size=2",
                          "inference.num_servers=2", "inference.router=sglang", *SMALL],
                         cwd=ROOT, capture_output=True, text=True, timeout=500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["counters"]["groups_finished"] >= 2 * 4
    events = "\n".join(summary["events"])
    assert "inference server 0 ready at http://" in events and "inference server 1 ready" in events
    assert "a Ray actor" in events and "2 trainer rank(s) started as Ray actors on 1 node(s)" in events
    assert "SGLang router ready" in events
    servers = json.loads((run_dir / "servers.json").read_text())
    assert len(servers["servers"]) == 2 and servers["router"].startswith("http://")
    for rank in (0, 1):  # both ranks ran the loop to its end
        assert (run_dir / "logs" / f"trainer-rank-{rank}.log").is_file()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_000002"
    cluster, available = resources(ray_cluster)
    assert cluster["CPU"] == 6 and available.get("CPU") == 6  # actors killed, placement group removed


def test_a_ray_launched_run_starts_vllm_servers_as_actors(ray_cluster, tmp_path):
    """``inference.engine: vllm`` under Ray: the server is vLLM (`make vllm`'s .venv-vllm) in a
    Ray actor, and the run trains on its episodes and publishes to it."""
    run_dir = tmp_path / "run"
    out = subprocess.run([str(BIN / "agentrl"), "train", "examples/arith_grpo.yaml", "launcher=ray",
                          f"ray.address={ray_cluster}", f"run_dir={run_dir}", "inference.engine=vllm", *SMALL],
                         cwd=ROOT, capture_output=True, text=True, timeout=500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["counters"]["episodes_failed"] == 0
    assert any("(vllm, a Ray actor)" in e for e in summary["events"]), summary["events"]
    assert "vllm" in (run_dir / "logs" / "server-0.log").read_text().lower()
    assert (run_dir / "weights").is_dir() and any((run_dir / "weights").iterdir())  # published to it from disk
    cluster, available = resources(ray_cluster)
    assert available.get("CPU") == cluster["CPU"]
