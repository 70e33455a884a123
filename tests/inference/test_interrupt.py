"""Pause, weight updates and resumption, over real HTTP against real ``agentrl serve`` processes."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from agentrl.api import SamplingParams
from agentrl.client.remote_engine import RemoteEngine

from ..serving import until_generating

PROMPT = [60, 124, 117, 115, 101, 114, 124, 62, 72, 105, 33]


async def reset(url: str, model_dir, version: str) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        r = await client.post(url + "/update_weights_from_disk", json={"model_path": str(model_dir),
                                                                       "weight_version": version})
    assert r.status_code == 200, r.text


def teacher_forced_logprobs(model_dir, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]


async def test_pause_aborts_running_requests_and_holds_new_ones(server):
    async with httpx.AsyncClient(timeout=60) as client:
        long = asyncio.create_task(client.post(server + "/generate", json={
            "input_ids": PROMPT, "return_logprob": True,
            "sampling_params": {"max_new_tokens": 450, "temperature": 1.0, "ignore_eos": True}}))
        await until_generating(server, min_tokens=20)
        try:
            r = await client.post(server + "/pause_generation", json={})
            assert r.json() == {"message": "Generation paused successfully.", "status": "ok"}
            out = (await long).json()
            meta = out["meta_info"]
            assert meta["finish_reason"] == {"type": "abort", "message": "Aborted", "status_code": None,
                                             "err_type": None}
            assert 0 < len(out["output_ids"]) < 450
            assert [t[1] for t in meta["output_token_logprobs"]] == out["output_ids"]
            held = asyncio.create_task(client.post(server + "/generate", json={
                "input_ids": PROMPT, "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}}))
            done, _ = await asyncio.wait({held}, timeout=1.0)
            assert not done, "a request sent while paused must wait for /continue_generation"
            assert (await client.get(server + "/ready")).status_code == 503
        finally:
            r = await client.post(server + "/continue_generation", json={})
        assert r.json()["status"] == "ok"
        assert len((await held).json()["output_ids"]) == 3


@pytest.mark.parametrize("mode", ["retract", "in_place"])
async def test_retract_and_in_place_keep_the_request_open(server, mode):
    async with httpx.AsyncClient(timeout=60) as client:
        long = asyncio.create_task(client.post(server + "/generate", json={
            "input_ids": PROMPT, "sampling_params": {"max_new_tokens": 450, "temperature": 0, "ignore_eos": True}}))
        await until_generating(server, min_tokens=20)
        try:
            await client.post(server + "/pause_generation", json={"mode": mode})
            done, _ = await asyncio.wait({long}, timeout=0.5)
            assert not done
        finally:
            await client.post(server + "/continue_generation", json={})
        out = (await long).json()
        greedy = (await client.post(server + "/generate", json={
            "input_ids": PROMPT, "sampling_params": {"max_new_tokens": 450, "temperature": 0, "ignore_eos": True}}
        )).json()
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    assert out["output_ids"] == greedy["output_ids"]  # same weights: the pause changed nothing
    assert out["meta_info"]["num_retractions"] == (1 if mode == "retract" else 0)


async def test_weight_update_mid_generation_switches_versions_at_the_update_point(
        untrained_model_dir, second_model_dir, updatable_server):
    proc = updatable_server
    await reset(proc.url, untrained_model_dir, "0")
    sampling = SamplingParams(max_new_tokens=400, temperature=1.0, ignore_eos=True, seed=11)
    async with RemoteEngine([proc.url], timeout=120) as engine, httpx.AsyncClient(timeout=60) as client:
        job = asyncio.create_task(engine.generate(PROMPT, sampling))
        await until_generating(proc.url, min_tokens=30)
        await engine.pause()
        await engine.update_weights(str(second_model_dir), 1)
        assert engine.version == 1
        await engine.resume()
        out = await job
        info = (await client.get(proc.url + "/model_info")).json()
    assert info["weight_version"] == "1" and info["model_path"] == str(second_model_dir)
    assert out.finish_reason == "length" and len(out.tokens) == 400
    k = out.versions.index(1)
    assert 30 <= k < 400 and out.versions == [0] * k + [1] * (400 - k)
    assert engine.stats["resumes"] == 1
    # Each token's logprob is that of the weights its version names: exact tokens, no loss,
    # no duplicate at the seam.
    before = teacher_forced_logprobs(untrained_model_dir, PROMPT, out.tokens[:k])
    after = teacher_forced_logprobs(second_model_dir, PROMPT, out.tokens)[k:]
    assert torch.allclose(torch.tensor(out.logprobs[:k]), before, atol=1e-4)
    assert torch.allclose(torch.tensor(out.logprobs[k:]), after, atol=1e-4)


async def test_update_without_pause_swaps_between_steps_and_bad_updates_are_refused(
        untrained_model_dir, second_model_dir, updatable_server, tmp_path):
    proc = updatable_server
    await reset(proc.url, untrained_model_dir, "0")
    async with httpx.AsyncClient(timeout=60) as client:
        job = asyncio.create_task(client.post(proc.url + "/generate", json={
            "input_ids": PROMPT, "sampling_params": {"max_new_tokens": 450, "ignore_eos": True}}))
        await until_generating(proc.url, min_tokens=5)  # a few at version 0, most of it still to run
        r = await client.post(proc.url + "/update_weights_from_disk",
                              json={"model_path": str(second_model_dir), "weight_version": "7"})
        assert r.status_code == 200 and r.json()["success"] and r.json()["message"].endswith("to 7.")
        out = (await job).json()
        spans = out["meta_info"]["weight_versions"]
        assert [s["version"] for s in spans] == ["0", "7"] and spans[1]["end"] == 450
        assert out["meta_info"]["weight_version"] == "7"

        missing = await client.post(proc.url + "/update_weights_from_disk", json={"model_path": str(tmp_path)})
        assert missing.status_code == 400 and missing.json()["success"] is False
        assert "config.json" in missing.json()["message"]
        from agentrl.model.tinymodel import init_tiny_model

        init_tiny_model(tmp_path / "small", hidden_size=64)
        other = await client.post(proc.url + "/update_weights_from_disk", json={"model_path": str(tmp_path / "small")})
        assert other.status_code == 400 and "architecture" in other.json()["message"]
        assert (await client.get(proc.url + "/model_info")).json()["weight_version"] == "7"


async def test_a_group_interrupted_by_a_weight_update_loses_no_token(
        untrained_model_dir, second_model_dir, updatable_server):
    """``generate_group`` sends one request for the group; the pause aborts all its samples
    and each is resumed on its own, under the new weights, from its last token."""
    proc = updatable_server
    await reset(proc.url, untrained_model_dir, "0")
    sampling = SamplingParams(max_new_tokens=300, temperature=1.0, ignore_eos=True)
    async with RemoteEngine([proc.url], timeout=120) as engine:
        job = asyncio.create_task(engine.generate_group(PROMPT, sampling, 4))
        await until_generating(proc.url, min_tokens=4 * 20)
        await engine.pause()
        await engine.update_weights(str(second_model_dir), 1)
        await engine.resume()
        outs = await job
    assert engine.stats["resumes"] == 4 and len({tuple(o.tokens) for o in outs}) == 4
    for out in outs[:2]:
        assert out.finish_reason == "length" and len(out.tokens) == 300
        k = out.versions.index(1)
        assert 0 < k < 300 and out.versions == [0] * k + [1] * (300 - k)
        before = teacher_forced_logprobs(untrained_model_dir, PROMPT, out.tokens[:k])
        after = teacher_forced_logprobs(second_model_dir, PROMPT, out.tokens)[k:]
        assert torch.allclose(torch.tensor(out.logprobs[:k]), before, atol=1e-4)
        assert torch.allclose(torch.tensor(out.logprobs[k:]), after, atol=1e-4)
    assert all(len(o.tokens) == 300 and o.versions[-1] == 1 for o in outs)


async def test_released_memory_holds_generation_until_resumed_and_the_update_between_serves_its_version(
        untrained_model_dir, second_model_dir, updatable_server):
    """Colocated training's cycle (inference.release_memory): pause, release, the weights back, an
    update, resume. The KV cache is really freed, a request in flight resumes on the new weights
    with per-token versions, and what is refused is refused by name."""
    proc = updatable_server
    await reset(proc.url, untrained_model_dir, "0")

    async def kv_gb(client) -> float:
        return (await client.get(proc.url + "/server_info")).json()["internal_states"][0]["memory_usage"]["kv_cache"]

    sampling = SamplingParams(max_new_tokens=300, temperature=1.0, ignore_eos=True, seed=5)
    async with RemoteEngine([proc.url], timeout=120) as engine, httpx.AsyncClient(timeout=60) as client:
        held = await kv_gb(client)
        assert held > 0
        r = await client.post(proc.url + "/release_memory_occupation", json={"tags": ["kv_cache", "gpu"]})
        assert r.status_code == 400 and "unknown memory tag" in r.json()["error"]["message"]
        job = asyncio.create_task(engine.generate(PROMPT, sampling))
        await until_generating(proc.url, min_tokens=20)
        with pytest.raises(RuntimeError, match="pause"):
            await engine.release_memory()  # not paused
        frozen = await client.post(proc.url + "/pause_generation", json={"mode": "in_place"})
        assert frozen.status_code == 200
        r = await client.post(proc.url + "/release_memory_occupation", json={})
        assert r.status_code == 400 and "running" in r.json()["error"]["message"]  # frozen in a slot
        await engine.pause()  # abort mode: the request comes back to the client, which waits
        await engine.release_memory()
        assert await kv_gb(client) == 0.0
        other = asyncio.create_task(client.post(proc.url + "/generate", json={
            "input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}}))
        await client.post(proc.url + "/continue_generation", json={})  # unpaused, but its memory is gone
        done, _ = await asyncio.wait({other}, timeout=1.0)
        assert not done, "nothing may run while the KV cache is released"
        await client.post(proc.url + "/pause_generation", json={})
        await engine.occupy_memory(weights_only=True)
        assert await kv_gb(client) == 0.0  # only the weights came back
        await engine.update_weights(str(second_model_dir), 1)
        await engine.resume()
        assert await kv_gb(client) == held
        out = await job
        assert (await other).status_code == 200
    assert out.finish_reason == "length" and len(out.tokens) == 300
    k = out.versions.index(1)
    assert 20 <= k < 300 and out.versions == [0] * k + [1] * (300 - k)
    after = teacher_forced_logprobs(second_model_dir, PROMPT, out.tokens)[k:]
    assert torch.allclose(torch.tensor(out.logprobs[k:]), after, atol=1e-4)  # a zeroed cache, refilled right
