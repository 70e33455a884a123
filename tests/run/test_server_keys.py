"""The servers a run starts take a key the run generates and sends (issue 49): any local user
reached a run's ``agentrl serve``, and a vLLM server's dev routes (``/collective_rpc``,
``/update_weight_version``) let one make the run train on another model's samples; a user's own
``$AGENTRL_SERVE_API_KEY`` was required by the run's server and never sent; a gateway in front
of a keyed server answered agents 401, as if their own key had failed."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from agentrl.api import SamplingParams
from agentrl.client.remote_engine import RemoteEngine
from agentrl.client.vllm_backend import KEY_MIDDLEWARE, WORKER_DIR
from agentrl.config import load_config
from agentrl.http_edge import SERVER_KEY_ENV
from agentrl.process.services import background_server, keyed_module
from agentrl.rollout.gateway import Gateway
from agentrl.rollout.gateway_config import GatewayConfig
from agentrl.rollout.gateway_routes import build_app
from agentrl.run.local_launcher import (
    SGLANG_WITH_KEY,
    ManagedServer,
    Run,
    ensure_server_key,
    vllm_command,
)
from agentrl.run.run_config import RunConfig

sys.path.insert(0, str(WORKER_DIR))
from agentrl_vllm_auth import RequireKey  # noqa: E402  (vLLM imports it the same way)


def test_a_run_generates_a_key_unless_the_user_gave_one(monkeypatch, tmp_path):
    monkeypatch.setenv(SERVER_KEY_ENV, "")  # unset for the run (and restored after: the launcher sets it)
    key = ensure_server_key()
    assert len(key) >= 32 and os.environ[SERVER_KEY_ENV] == key and ensure_server_key() == key
    monkeypatch.setenv(SERVER_KEY_ENV, "the-users-own-key")
    assert ensure_server_key() == "the-users-own-key"  # required by the servers and sent by the run


def test_vllm_and_sglang_get_the_key_off_the_command_line(monkeypatch, tmp_path):
    cfg = load_config(RunConfig, None, [f"model={tmp_path}", "inference.engine=vllm"])
    cmd, env = vllm_command(cfg, "127.0.0.1", 8000, 0, "k-123")
    assert env["VLLM_API_KEY"] == "k-123" and "k-123" not in " ".join(cmd)
    assert cmd[cmd.index("--middleware") + 1] == KEY_MIDDLEWARE
    # SGLang takes --api-key only: the launcher adds it inside the process, where ps cannot see it
    fake = tmp_path / "fake" / "sglang"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "launch_server.py").write_text("import sys\nprint(sys.argv[1:], open('/proc/self/cmdline').read())\n")
    out = subprocess.run([sys.executable, "-c", SGLANG_WITH_KEY, "--port", "1"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "fake"), SERVER_KEY_ENV: "k-456"},
                         timeout=60)
    argv, cmdline = out.stdout.split("] ", 1)
    assert argv == "['--port', '1', '--api-key', 'k-456'" and "k-456" not in cmdline, out
    # SGLang's router the same way (it then sends the key to the servers and requires it of its clients)
    from agentrl.run.router import SGLangRouter
    from agentrl.run.run_config import InferenceConfig

    monkeypatch.setenv(SERVER_KEY_ENV, "k-789")
    router = SGLangRouter(["http://127.0.0.1:1"], InferenceConfig(), tmp_path / "router.log").command()
    assert router[1:3] == ["-c", keyed_module("sglang_router.launch_router", SERVER_KEY_ENV)] and "k-789" not in " ".join(router)


def test_vllm_s_dev_routes_need_the_key():
    """``RequireKey`` as vLLM adds it (``--middleware``): every route but /health needs the key."""
    async def ok(request):
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route(p, ok, methods=["GET", "POST"]) for p in
                            ("/health", "/collective_rpc", "/update_weight_version", "/sleep", "/v1/models")])
    app.add_middleware(RequireKey, key="k-789")
    with TestClient(app) as client:
        for path in ("/collective_rpc", "/update_weight_version", "/sleep", "/v1/models", "/openapi.json"):
            r = client.post(path, headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", path
            assert client.post(path).status_code == 401
        assert client.post("/collective_rpc", headers={"Authorization": "Bearer k-789"}).text == "ok"
        assert client.get("/health").text == "ok"

def test_a_vllm_server_without_a_key_refuses_to_start(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "")
    with pytest.raises(RuntimeError, match="VLLM_API_KEY"):
        RequireKey(Starlette())


def test_a_runs_agentrl_serve_needs_its_key_and_the_runs_clients_send_it(monkeypatch, tiny_model_dir, tmp_path):
    monkeypatch.setenv(SERVER_KEY_ENV, "")  # unset for the run (and restored after: the launcher sets it)
    cfg = load_config(RunConfig, None, [f"model={tiny_model_dir}", "inference.max_running_requests=4"])
    run = Run(cfg, tmp_path, echo=lambda line: None)  # generates the key its children inherit
    server = ManagedServer(0, cfg, run.log_dir)
    server.start()
    try:
        key = os.environ[SERVER_KEY_ENV]
        assert key.encode() not in open(f"/proc/{server.process.proc.pid}/cmdline", "rb").read()
        assert httpx.get(server.url + "/v1/models").status_code == 401
        assert httpx.post(server.url + "/update_weight_version", json={"new_version": "9"}).status_code == 401
        assert httpx.get(server.url + "/health").status_code == 200

        async def main() -> tuple[list[int], httpx.Response, httpx.Response]:
            async with RemoteEngine(server.url) as engine:  # the run's client: the key from the environment
                out = await engine.generate([49, 50, 43], SamplingParams(max_new_tokens=3, temperature=0))
            answers = []
            for upstream_key in (key, "not-the-servers-key"):
                monkeypatch.setenv(SERVER_KEY_ENV, upstream_key)
                gateway = Gateway(RemoteEngine(server.url), str(tiny_model_dir), GatewayConfig(), close_engine=True)
                async with background_server(build_app(gateway), "127.0.0.1", 0) as url:
                    async with httpx.AsyncClient(timeout=60) as http:
                        s = (await http.post(url + "/v1/sessions", json={})).json()
                        answers.append(await http.post(s["base_url"] + "/chat/completions", json={
                            "model": "m", "messages": [{"role": "user", "content": "1+2="}], "max_tokens": 3},
                            headers={"Authorization": f"Bearer {s['api_key']}"}))
                await gateway.aclose()
            return out.tokens, *answers

        tokens, good, refused = asyncio.run(main())
        assert len(tokens) == 3 and good.status_code == 200, good.text
        # the upstream's refusal of the gateway's key is the gateway's fault, not the agent's: 502
        assert refused.status_code == 502 and SERVER_KEY_ENV in refused.json()["error"]["message"]
    finally:
        server.stop()
