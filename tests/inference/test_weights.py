"""Weights that ``agentrl serve`` must refuse (issue 16): on update they are loaded into a staging
copy, validated and swapped only if valid — the old weights keep serving; at start-up the same
checks end the command in one line. Plus ``--api-key`` and a port already in use."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file

from agentrl.api import SamplingParams
from agentrl.client import RemoteEngine
from agentrl.errors import RequestRejected

PROMPT = [60, 124, 117, 115, 101, 114, 124, 62, 72, 105, 33]
SECRET = "SECRET-FILE-CONTENT-1234"


def greedy(url: str, headers: dict | None = None) -> list[int]:
    r = httpx.post(url + "/generate", headers=headers, timeout=60, json={
        "input_ids": PROMPT, "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def broken_copy(src: Path, dst: Path, how: str) -> Path:
    """A copy of checkpoint ``src`` broken in one way."""
    shutil.copytree(src, dst)
    weights = dst / "model.safetensors"
    if how == "garbage-config":
        (dst / "config.json").write_text(f"{{ {SECRET} not json")
        return dst
    if how == "garbage-safetensors":
        weights.write_bytes(SECRET.encode() * 50)
        return dst
    tensors = load_file(weights)
    name = "model.layers.0.mlp.up_proj.weight"
    if how == "wrong-shape":
        tensors[name] = torch.zeros(tensors[name].shape[0] + 1, tensors[name].shape[1])
    elif how == "nan":
        tensors[name] = torch.full_like(tensors[name], float("nan"))
    elif how == "int-dtype":
        tensors[name] = torch.zeros(tensors[name].shape, dtype=torch.int32)
    elif how == "missing":
        del tensors[name]
    elif how == "unknown":
        tensors["model.layers.0.mlp.extra.weight"] = torch.zeros(2)
    save_file(tensors, weights)
    return dst


CASES = {  # how -> what the refusal must say
    "wrong-shape": "tensor 'model.layers.0.mlp.up_proj.weight' has shape (129, 32), expected (128, 32)",
    "nan": "tensor 'model.layers.0.mlp.up_proj.weight' holds NaN or infinite values",
    "int-dtype": "tensor 'model.layers.0.mlp.up_proj.weight' has dtype torch.int32, expected a floating dtype",
    "missing": "tensor 'model.layers.0.mlp.up_proj.weight' is missing from the checkpoint",
    "unknown": "tensor 'model.layers.0.mlp.extra.weight' is not part of the served architecture",
    "garbage-config": "config.json is not valid JSON at line 1 column 3",
    "garbage-safetensors": "model.safetensors: not a readable safetensors file",
}


@pytest.fixture(scope="module")
def spec_sizes(untrained_model_dir):
    import json

    config = json.loads((untrained_model_dir / "config.json").read_text())
    return config["intermediate_size"], config["hidden_size"]


@pytest.mark.parametrize("how", list(CASES))
def test_an_invalid_update_is_a_400_naming_the_tensor_and_the_old_weights_keep_serving(
        updatable_server, untrained_model_dir, tmp_path, how, spec_sizes):
    url = updatable_server.url
    httpx.post(url + "/update_weights_from_disk", json={"model_path": str(untrained_model_dir),
                                                        "weight_version": "base"}, timeout=60)
    before = greedy(url)
    bad = broken_copy(untrained_model_dir, tmp_path / how, how)
    r = httpx.post(url + "/update_weights_from_disk", json={"model_path": str(bad), "weight_version": "bad"},
                   timeout=60)
    assert r.status_code == 400, r.text
    expected = CASES[how].replace("(129, 32)", f"({spec_sizes[0] + 1}, {spec_sizes[1]})")
    expected = expected.replace("(128, 32)", f"({spec_sizes[0]}, {spec_sizes[1]})")
    assert r.json()["success"] is False and expected in r.json()["message"], r.text
    assert SECRET not in r.text
    assert greedy(url) == before  # the old weights, still serving
    assert httpx.get(url + "/model_info", timeout=10).json()["weight_version"] == "base"


def test_server_info_follows_the_weight_version(updatable_server, second_model_dir, untrained_model_dir):
    url = updatable_server.url
    r = httpx.post(url + "/update_weights_from_disk", json={"model_path": str(second_model_dir),
                                                            "weight_version": "7"}, timeout=60)
    assert r.status_code == 200 and r.json()["success"], r.text
    assert httpx.get(url + "/server_info", timeout=10).json()["weight_version"] == "7"
    httpx.post(url + "/update_weights_from_disk", json={"model_path": str(untrained_model_dir),
                                                        "weight_version": "base"}, timeout=60)
    assert httpx.get(url + "/get_server_info", timeout=10).json()["weight_version"] == "base"


def serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "agentrl"), "serve", *args], capture_output=True,
                          text=True, timeout=180)


@pytest.mark.parametrize("how", ["nan", "garbage-config", "garbage-safetensors"])
def test_serve_on_a_broken_checkpoint_says_why_in_one_line_and_is_never_ready(untrained_model_dir, tmp_path, how):
    bad = broken_copy(untrained_model_dir, tmp_path / how, how)
    r = serve("--model", str(bad), "--port", "0")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentrl serve: error: ") and CASES[how] in lines[0], r.stderr
    assert "ready" not in r.stdout and SECRET not in r.stderr


def test_a_port_in_use_fails_in_one_line_before_the_model_loads(untrained_model_dir, tmp_path):
    bad = broken_copy(untrained_model_dir, tmp_path / "nan", "nan")  # loading it would fail differently
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = serve("--model", str(bad), "--port", str(port))
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"agentrl serve: error: cannot listen on 127.0.0.1:{port} (Address already in use); pick another --port "
        "(0 picks a free one)"]


def test_api_key_guards_every_route_but_the_probes(serve_factory, untrained_model_dir):
    proc = serve_factory(untrained_model_dir, "--api-key", "k-123")
    url = proc.url
    for method, path in [("POST", "/generate"), ("POST", "/update_weights_from_disk"), ("POST", "/pause_generation"),
                         ("POST", "/init_weights_update_group"), ("POST", "/update_weights_from_distributed"),
                         ("POST", "/destroy_weights_update_group"),
                         ("GET", "/model_info"), ("GET", "/server_info"), ("POST", "/v1/chat/completions"),
                         ("GET", "/v1/models")]:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "k-123"}):
            r = httpx.request(method, url + path, headers=headers, json={}, timeout=30)
            assert r.status_code == 401 and "Authorization: Bearer KEY" in r.text, (path, headers, r.text)
    for path in ("/health", "/health_generate", "/ready"):
        assert httpx.get(url + path, timeout=30).status_code == 200
    assert greedy(url, {"Authorization": "Bearer k-123"})

    async def client_side() -> None:
        async with RemoteEngine(url, api_key="k-123") as engine:
            done = await engine.generate(PROMPT, SamplingParams(max_new_tokens=4, ignore_eos=True))
            assert len(done.tokens) == 4
            await engine.pause()
            await engine.resume()
        async with RemoteEngine(url, max_retries=0) as engine:
            with pytest.raises(RequestRejected, match="API key"):
                await engine.generate(PROMPT, SamplingParams(max_new_tokens=4))
    asyncio.run(client_side())
