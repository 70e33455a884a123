"""docker-compose.yml for real: the images are built (cached), `docker-compose --profile cpu up`
trains a short job to a checkpoint with the trainer, `agentrl serve` and the sandbox service in
their own containers; an external agent (the openai SDK, from the host) plays an episode through
the gateway, which records it; a program sent through the sandbox service from the trainer's
container runs without network; and `docker-compose down --volumes` leaves nothing behind.

Skips only where no Docker engine can be started (never under CI: the docker_ready fixture);
a missing docker-compose is a failure (`make test` installs it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from agentrl.client import vllm_backend
from agentrl.process.services import free_port

ROOT = Path(__file__).resolve().parents[2]
SHORT = ("steps=2 eval.limit=20 rollout.batch_size=4 rollout.group_size=4 checkpoint.every_steps=1 "
         "max_minutes=null logging.trajectories_per_step=4")
LONG_RUNNING = ("inference-cpu", "inference", "inference-vllm", "sandbox", "gateway", "gateway-gpu")
PROFILES = ("--profile", "cpu", "--profile", "gateway")

pytestmark = [pytest.mark.docker, pytest.mark.timeout(2400)]


class Compose:
    """``docker-compose -p PROJECT`` in the repository, with this test's environment."""

    def __init__(self, project: str, env: dict[str, str]) -> None:
        self.project, self.env = project, env

    def __call__(self, *args: str, timeout: float = 900, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        out = subprocess.run(["docker-compose", "-p", self.project, *PROFILES, *args], cwd=ROOT,
                             env=self.env, capture_output=True, text=True, timeout=timeout, **kwargs)
        if check:
            assert out.returncode == 0, f"docker-compose {' '.join(args)}:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
        return out

    def left(self) -> dict[str, list[str]]:
        """What of the project still exists in the engine."""
        def ids(*cmd: str) -> list[str]:
            return subprocess.run(["docker", *cmd], capture_output=True, text=True, timeout=60).stdout.split()
        label = f"label=com.docker.compose.project={self.project}"
        return {"containers": ids("ps", "-aq", "--filter", label), "networks": ids("network", "ls", "-q", "--filter", label),
                "volumes": ids("volume", "ls", "-q", "--filter", label)}


@pytest.fixture(scope="module")
def compose(docker_ready):
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is not installed; `make test` installs it (apt-get install docker-compose)")
    build = subprocess.run(["docker/build-images.sh"], cwd=ROOT, capture_output=True, text=True, timeout=2000)
    assert build.returncode == 0, build.stderr[-4000:]
    env = {**os.environ, "AGENTRL_SANDBOX_API_KEY": "test-" + os.urandom(8).hex(), "AGENTRL_TRAIN_ARGS": SHORT,
           "AGENTRL_GATEWAY_API_KEY": "test-" + os.urandom(8).hex(), "AGENTRL_GATEWAY_PORT": str(free_port())}
    c = Compose(f"agentrl-test-{os.getpid()}", env)
    try:
        yield c
    finally:
        c("down", "--volumes", "--remove-orphans", check=False, timeout=300)


def test_the_file_validates_and_keeps_secrets_out(compose):
    out = compose("config")
    cfg = yaml.safe_load(out.stdout)
    services = cfg["services"]
    assert set(services) >= {"inference", "inference-cpu", "sandbox", "gateway", "gateway-gpu", "trainer", "trainer-gpu"}
    for name in LONG_RUNNING:
        assert services[name]["healthcheck"]["test"] and services[name]["restart"] == "unless-stopped", name
    assert services["trainer"]["depends_on"] == {"inference-cpu": {"condition": "service_healthy"},
                                                 "sandbox": {"condition": "service_healthy"}}
    assert services["inference"]["profiles"] == ["gpu"] and services["inference-cpu"]["profiles"] == ["cpu"]
    # vLLM's server with the flags and routes agentrl's own launcher gives it, and a trainer against it
    vllm = services["inference-vllm"]
    assert vllm["profiles"] == ["vllm"] and vllm["environment"]["VLLM_SERVER_DEV_MODE"] == "1"
    assert vllm["entrypoint"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--logprobs-mode processed_logprobs" in vllm["command"]
    assert f"--worker-extension-cls {vllm_backend.WORKER_EXTENSION}" in vllm["command"]
    mounted = {target: source for source, target, *_ in (v.split(":") for v in vllm["volumes"])}
    # the extension's module on PYTHONPATH, inside the whole package it loads process_group.py from
    package = mounted["/opt/agentrl"]
    assert Path(package) == ROOT / "agentrl"
    inside = Path(vllm["environment"]["PYTHONPATH"]).relative_to("/opt/agentrl")
    assert Path(package) / inside == vllm_backend.WORKER_DIR
    assert services["trainer-vllm"]["depends_on"]["inference-vllm"] == {"condition": "service_healthy"}
    assert "inference.servers=[http://inference-vllm:30000]" in services["trainer-vllm"]["command"]
    gpus = services["inference"]["deploy"]["resources"]["reservations"]["devices"]
    assert gpus[0]["capabilities"] == ["gpu"]
    key = compose.env["AGENTRL_SANDBOX_API_KEY"]
    assert services["sandbox"]["environment"]["AGENTRL_SANDBOX_API_KEY"] == key
    assert key not in (ROOT / "docker-compose.yml").read_text()
    assert compose.env["AGENTRL_GATEWAY_API_KEY"] not in (ROOT / "docker-compose.yml").read_text()
    missing = subprocess.run(["docker-compose", "config", "-q"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                             env={k: v for k, v in os.environ.items() if k != "AGENTRL_SANDBOX_API_KEY"})
    assert missing.returncode != 0 and "AGENTRL_SANDBOX_API_KEY" in missing.stderr


def test_up_trains_to_a_checkpoint_and_down_leaves_nothing(compose):
    up = compose("up", "--no-color", "--exit-code-from", "trainer", timeout=1200)
    summary = json.loads([line for line in up.stdout.splitlines() if '"run_dir": "/runs/compose"' in line][-1]
                         .split("|", 1)[1])
    assert summary["steps"] == 2 and summary["counters"]["episodes_failed"] == 0
    assert 0.0 <= summary["eval_after"] <= 1.0

    # an external agent on the host: a session from the gateway, one call with the openai SDK, a reward
    compose("up", "-d", "gateway", timeout=600)
    gateway = f"http://127.0.0.1:{compose.env['AGENTRL_GATEWAY_PORT']}"
    agent_plays_one_episode(gateway, compose.env["AGENTRL_GATEWAY_API_KEY"])

    # the training run's files and the gateway's record, on the shared volume (read by one container
    # of the stack: each `run` is a container started and removed)
    ls = compose("run", "--rm", "--no-deps", "-T", "trainer", "sh", "-c",
                 "cat /runs/compose/checkpoints/latest; echo; echo $(ls /runs/compose/weights); "
                 "tail -n 1 /runs/compose/metrics.jsonl; tail -n 1 /runs/gateway/trajectories.jsonl")
    latest, weights, last, recorded = ls.stdout.strip().splitlines()[-4:]
    assert latest == "step_000002" and "v000002" in weights.split()
    assert json.loads(last)["step"] == 2
    episode = json.loads(recorded)
    assert episode["reward"] == 1.0 and sum(episode["loss_mask"]) >= 1

    # a program sent through the sandbox service from the trainer's container: it runs, offline
    program = ("import socket\n"
               "try:\n    socket.create_connection(('inference-cpu', 30000), timeout=3); print('connected')\n"
               "except OSError as e:\n    print('offline', type(e).__name__)\n")
    run = compose("run", "--rm", "-T", "trainer", "agentrl", "sandbox", "run", "--backend", "http://sandbox:8100", "-",
                  input=program)
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["status"] == "ok" and result["stdout"].startswith("offline"), result
    hosts = subprocess.run(["docker", "ps", "-aq", "--no-trunc", "--filter",
                            f"label=com.docker.compose.project={compose.project}",
                            "--filter", "label=com.docker.compose.service=sandbox"],
                           capture_output=True, text=True, timeout=60).stdout.split()
    assert hosts

    compose("down", "--volumes", "--remove-orphans", timeout=300)
    assert compose.left() == {"containers": [], "networks": [], "volumes": []}
    owners = subprocess.run(["docker", "ps", "-a", "--filter", "label=agentrl.sandbox",
                             "--format", '{{.Label "agentrl.sandbox.owner"}}'],
                            capture_output=True, text=True, timeout=60).stdout.split()
    assert not [o for o in owners if any(o.startswith(h[:12] + ":") for h in hosts)]  # its program containers too


def agent_plays_one_episode(gateway: str, admin_key: str) -> None:
    """What an agent of one's own does (see examples/gateway_agent.py), from the host."""
    import time

    from openai import OpenAI

    deadline = time.monotonic() + 300
    while True:  # `up -d` returns before the gateway is healthy
        try:
            if httpx.get(f"{gateway}/health", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the gateway did not answer /health"
        time.sleep(1)
    admin = {"Authorization": f"Bearer {admin_key}"}
    assert httpx.post(f"{gateway}/v1/sessions", json={}, timeout=30).status_code == 401  # the key is required
    session = httpx.post(f"{gateway}/v1/sessions", json={}, headers=admin, timeout=30).json()
    client = OpenAI(base_url=session["base_url"], api_key=session["api_key"], timeout=60)
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is 2+3?"}],
                                           max_tokens=8)
    assert reply.choices[0].message.content is not None
    sid = session["session_id"]
    assert httpx.post(f"{gateway}/v1/sessions/{sid}/reward", json={"reward": 1.0}, headers=admin,
                      timeout=30).status_code == 200
    assert httpx.post(f"{gateway}/v1/sessions/{sid}/end", json={}, headers=admin, timeout=30).status_code == 200
