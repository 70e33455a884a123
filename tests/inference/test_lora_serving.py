"""SGLang's LoRA routes on a real ``agentrl serve``: ``/load_lora_adapter``, ``/unload_lora_adapter``,
a ``/generate`` request's ``lora_path``, the OpenAI routes' ``model: "base:adapter"`` and the
adapters' cards on ``/v1/models``.

The adapters are peft's own (random A and B, so that they change the model), applied per
request at run time: a batch that mixes the base model and two adapters on one prompt gives
each row what it gives alone (to 1e-5), and an adapter's row gives what the peft-merged
checkpoint gives once loaded as the served weights."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from agentrl.process.services import ServerProcess

from ..serving import until_generating

PROMPT = [60, 124, 117, 115, 101, 114, 124, 62, 72, 105, 33]
SAMPLING = {"max_new_tokens": 10, "temperature": 1.0, "sampling_seed": 3, "ignore_eos": True}


@pytest.fixture(scope="module")
def adapters(untrained_model_dir, tmp_path_factory, random_adapter):
    root = tmp_path_factory.mktemp("lora-adapters")
    return {"a": random_adapter(untrained_model_dir, root / "a", seed=1, rank=4),
            "b": random_adapter(untrained_model_dir, root / "b", seed=2, rank=2, targets=["q_proj", "v_proj"])}


@pytest.fixture(scope="module")
def server(untrained_model_dir, adapters):
    """This module's own server, adapters a and b loaded (its weights change in one test)."""
    with ServerProcess(untrained_model_dir, "--context-length", "256", "--max-running-requests", "8") as proc:
        for name, path in adapters.items():
            r = httpx.post(proc.url + "/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)}, timeout=60)
            assert r.status_code == 200 and r.json()["success"], r.text
        yield proc.url


def _generate(url: str, body: dict) -> dict | list:
    r = httpx.post(url + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _tokens_and_logprobs(result: dict) -> tuple[list[int], torch.Tensor]:
    triples = result["meta_info"]["output_token_logprobs"]
    return [t[1] for t in triples], torch.tensor([t[0] for t in triples], dtype=torch.float64)


def _alone(url: str, lora: str | None) -> tuple[list[int], torch.Tensor]:
    return _tokens_and_logprobs(_generate(url, {"input_ids": PROMPT, "sampling_params": SAMPLING,
                                                "return_logprob": True, "lora_path": lora}))


def test_a_batch_mixing_adapters_gives_each_row_what_it_gives_alone_and_what_the_merged_checkpoint_gives(
        server, adapters, untrained_model_dir, tmp_path):
    from agentrl.trainer.lora import merge_adapter

    # one prompt three times: rows must not be taken for twins of one another, nor (alone,
    # after the base row cached the prompt) read the base model's cached keys and values
    batch = _generate(server, {"input_ids": [PROMPT] * 3, "sampling_params": SAMPLING, "return_logprob": True,
                               "lora_path": [None, "a", "b"]})
    rows = [_tokens_and_logprobs(r) for r in batch]
    alone = {name: _alone(server, name) for name in (None, "a", "b")}
    for (tokens, logprobs), name in zip(rows, (None, "a", "b"), strict=True):
        assert tokens == alone[name][0], name
        assert torch.allclose(logprobs, alone[name][1], atol=1e-5, rtol=0), name
    assert len({tuple(r[0]) for r in rows}) == 3  # each adapter changed what was sampled
    # the peft-merged checkpoint of adapter a, served as full weights, samples what a did
    merged = merge_adapter(adapters["a"], tmp_path / "merged", base_dir=untrained_model_dir)
    try:
        r = httpx.post(server + "/update_weights_from_disk", json={"model_path": str(merged)}, timeout=120)
        assert r.status_code == 200, r.text
        tokens, logprobs = _alone(server, None)
        assert tokens == alone["a"][0]
        # a run-time row computes x W + s (x A) B, the merged weights x (W + s B A): equal in exact
        # arithmetic, rounded differently (up to 1.1e-5 apart on one of our machines' CPUs)
        assert torch.allclose(logprobs, alone["a"][1], atol=3e-5, rtol=0)
    finally:
        r = httpx.post(server + "/update_weights_from_disk", json={"model_path": str(untrained_model_dir)}, timeout=120)
        assert r.status_code == 200, r.text


def test_adapters_are_listed_selected_by_model_and_refused_by_name(server, adapters, untrained_model_dir):
    cards = httpx.get(server + "/v1/models", timeout=10).json()["data"]
    base = cards[0]["id"]
    assert [(c["id"], c["parent"], c["root"]) for c in cards[1:]] == [
        ("a", base, str(adapters["a"])), ("b", base, str(adapters["b"]))]
    assert httpx.get(server + "/v1/models/a", timeout=10).json()["parent"] == base
    # model "base:adapter" on the OpenAI routes: the same tokens as lora_path on /generate
    body = {"model": f"{base}:a", "prompt": PROMPT, "max_tokens": 6, "temperature": 0}
    completion = httpx.post(server + "/v1/completions", json=body, timeout=60).json()
    native = _generate(server, {"input_ids": PROMPT, "lora_path": "a",
                                "sampling_params": {"max_new_tokens": 6, "temperature": 0}})
    plain = _generate(server, {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 0}})
    assert completion["choices"][0]["text"] == native["text"] != plain["text"]
    # an unknown name: 400 in SGLang's words, on both route families
    r = httpx.post(server + "/generate", json={"input_ids": PROMPT, "lora_path": "c"}, timeout=10)
    assert r.status_code == 400 and "requested LoRA adapters are not loaded: c" in r.text, r.text
    r = httpx.post(server + "/v1/completions", json={**body, "model": f"{base}:c"}, timeout=10)
    assert r.status_code == 400 and "not loaded: c" in r.text, r.text
    r = httpx.post(server + "/generate", json={"input_ids": [PROMPT] * 2, "lora_path": ["a"]}, timeout=10)
    assert r.status_code == 400 and "list of 2 names" in r.text, r.text
    # loading: a name taken, a directory that is no adapter; unloading a name not loaded
    r = httpx.post(server + "/load_lora_adapter", json={"lora_name": "a", "lora_path": str(adapters["b"])}, timeout=60)
    assert r.status_code == 400 and "Failed to load LoRA adapter a because it is already loaded" in r.json()["error_message"]
    r = httpx.post(server + "/load_lora_adapter", json={"lora_name": "c", "lora_path": str(untrained_model_dir)},
                   timeout=60)
    assert r.status_code == 400 and not r.json()["success"] and "adapter_config.json" in r.json()["error_message"]
    r = httpx.post(server + "/unload_lora_adapter", json={"lora_name": "c"}, timeout=10)
    assert r.status_code == 400 and "LoRA with name c does not exist" in r.json()["error_message"]
    # unloaded while a request runs with it: the request finishes with it, as it would have
    body = {"input_ids": PROMPT, "lora_path": "b", "return_logprob": True,
            "sampling_params": {**SAMPLING, "max_new_tokens": 150}}
    alone = _generate(server, body)

    async def unload_while_running():
        async with httpx.AsyncClient(timeout=60) as client:
            job = asyncio.create_task(client.post(server + "/generate", json=body))
            await until_generating(server, min_tokens=20)
            unloaded = await client.post(server + "/unload_lora_adapter", json={"lora_name": "b"})
            return (await job).json(), unloaded.json()
    running, unloaded = asyncio.run(unload_while_running())
    assert running["output_ids"] == alone["output_ids"] and len(running["output_ids"]) == 150
    assert unloaded == {"success": True, "error_message": None, "loaded_adapters": {"a": str(adapters["a"])}}
    assert httpx.post(server + "/generate", json={"input_ids": PROMPT, "lora_path": "b"}, timeout=10).status_code == 400
    r = httpx.post(server + "/load_lora_adapter", json={"lora_name": "b", "lora_path": str(adapters["b"])}, timeout=60)
    assert r.json()["success"] and set(r.json()["loaded_adapters"]) == {"a", "b"}
