"""A real vLLM server (vLLM's own CPU build, `make vllm`) on the trained tiny model, started
with the command `agentrl train` uses for `inference.engine: vllm`."""

from __future__ import annotations

import os
import secrets
import subprocess

import pytest

from agentrl.config import load_config
from agentrl.process.services import free_port, stop_process
from agentrl.run.local_launcher import vllm_command, vllm_python, wait_healthy
from agentrl.run.run_config import RunConfig


def vllm_run_config(model_dir, *overrides: str) -> RunConfig:
    return load_config(RunConfig, None, [f"model={model_dir}", "inference.engine=vllm", *overrides])


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir, tmp_path_factory):
    """One vLLM server, weight version "default" (the client reads it as its own version, 0), as
    a LoRA run starts it (adapters of rank <= 8 load at run time; requests without one are the
    base model's). Tests that change its weights put the committed ones back before they end."""
    cfg = vllm_run_config(tiny_model_dir, "inference.max_running_requests=64", "trainer.lora.rank=8")
    if vllm_python(cfg) is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set but vLLM is not installed; `make test` runs `make vllm` first")
        pytest.skip("vLLM is not installed here; run `make vllm`")
    port = free_port()
    key = secrets.token_urlsafe(16)  # as a run's: every route but /health needs it (tests send it explicitly)
    cmd, env = vllm_command(cfg, "127.0.0.1", port, 0, key)
    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    with open(log_path, "a") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, 300, log_path, route="/health")
        proc.url, proc.log_path, proc.key = f"http://127.0.0.1:{port}", log_path, key
        proc.auth = {"Authorization": f"Bearer {key}"}
        yield proc
    finally:
        stop_process(proc)
