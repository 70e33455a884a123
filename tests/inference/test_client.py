"""``RemoteEngine``: routing, failover and retry rules.

The failover test kills a real server mid-request. The retry/resume rules are unit-tested
against a scripted fake transport (``httpx.MockTransport``): the fake only replays answers,
it stands in for no logic of ours.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from agentrl.api import InferenceClient, SamplingParams
from agentrl.errors import RequestRejected, ServerError, ServerUnavailable
from agentrl.inference.client import RemoteEngine

PROMPT = [60, 124, 117, 115, 101, 114, 124, 62, 72, 105, 33]


def answer(tokens, reason, version="3", spans=None):
    meta = {"id": "x", "finish_reason": reason, "weight_version": version, "completion_tokens": len(tokens),
            "output_token_logprobs": [[-0.5, t, None] for t in tokens]}
    if spans is not None:
        meta["weight_versions"] = spans
    return {"text": "", "output_ids": tokens, "meta_info": meta}


class Script:
    """Replays canned answers per route and records what was sent."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.sent: list[tuple[str, dict]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        self.sent.append((request.url.path, body))
        status, payload = self.answers.pop(0)
        if isinstance(payload, Exception):
            raise payload
        return httpx.Response(status, json=payload)


def engine_with(script: Script, **kw) -> RemoteEngine:
    return RemoteEngine(["http://a"], transport=httpx.MockTransport(script), backoff=0.0, **kw)


def test_remote_engine_is_an_inference_client():
    assert isinstance(RemoteEngine(["http://127.0.0.1:1"]), InferenceClient)
    with pytest.raises(ValueError, match="at least one server"):
        RemoteEngine([])


async def test_aborted_request_is_resumed_with_prompt_plus_tokens_and_remaining_budget():
    script = Script([
        (200, answer([5, 6], {"type": "abort", "message": "Aborted", "status_code": None}, version="3")),
        (200, answer([7, 8, 9], {"type": "stop", "matched": 9}, version="4",
                     spans=[{"version": "4", "start": 0, "end": 3}])),
    ])
    out = await engine_with(script).generate([1, 2], SamplingParams(max_new_tokens=10, stop_token_ids=[9]))
    assert out.tokens == [5, 6, 7, 8, 9] and out.versions == [3, 3, 4, 4, 4]
    assert out.finish_reason == "stop" and out.matched_stop == 9
    (_, first), (_, second) = script.sent
    assert first["input_ids"] == [1, 2] and first["sampling_params"]["max_new_tokens"] == 10
    assert second["input_ids"] == [1, 2, 5, 6] and second["sampling_params"]["max_new_tokens"] == 8
    assert second["sampling_params"]["stop_token_ids"] == [9] and first["rid"] != second["rid"]


async def test_non_numeric_versions_read_as_the_client_version():
    script = Script([(200, answer([5], {"type": "length", "length": 1}, version="default"))])
    out = await engine_with(script, version=2).generate([1], SamplingParams(max_new_tokens=1))
    assert out.versions == [2]


async def test_4xx_is_rejected_without_retry_and_5xx_is_retried():
    script = Script([(400, {"error": {"message": "The input (9 tokens) is longer than ..."}})])
    with pytest.raises(RequestRejected, match="longer than"):
        await engine_with(script).generate([1], SamplingParams())
    assert len(script.sent) == 1
    script = Script([(503, {"message": "busy"}), (200, answer([5], {"type": "length", "length": 1}))])
    out = await engine_with(script).generate([1], SamplingParams(max_new_tokens=1))
    assert out.tokens == [5] and len(script.sent) == 2
    script = Script([(500, {})] * 3)
    with pytest.raises(ServerError):
        await engine_with(script, max_retries=2).generate([1], SamplingParams())
    assert len(script.sent) == 3


async def test_an_unreachable_server_gives_server_unavailable():
    script = Script([(0, httpx.ConnectError("refused"))] * 20)
    engine = engine_with(script, max_retries=1, health_check_interval=0.01)
    with pytest.raises(ServerUnavailable):
        await engine.generate([1], SamplingParams())
    assert engine.healthy_addresses() == []


async def test_generate_waits_while_the_client_is_paused():
    script = Script([(200, {"message": "ok"}), (200, {"success": True}), (200, {"message": "ok"}),
                     (200, answer([5], {"type": "length", "length": 1}, version="1"))])
    engine = engine_with(script)
    await engine.pause()
    await engine.update_weights("/ckpt", 1)
    job = asyncio.create_task(engine.generate([1], SamplingParams(max_new_tokens=1)))
    await asyncio.sleep(0.2)
    assert not job.done() and [p for p, _ in script.sent] == ["/pause_generation", "/update_weights_from_disk"]
    await engine.resume()
    assert (await job).versions == [1] and engine.version == 1
    assert script.sent[1][1] == {"model_path": "/ckpt", "weight_version": "1"}


async def test_a_failed_weight_update_raises():
    script = Script([(400, {"success": False, "message": "Failed to update weights: no config.json"})])
    engine = engine_with(script)
    with pytest.raises(RequestRejected, match="no config.json"):
        await engine.update_weights("/nope", 3)
    assert engine.version == 0


async def test_least_loaded_routing_and_failover_when_a_server_dies(untrained_model_dir, serve_factory, server):
    a, b_url = serve_factory(untrained_model_dir), server
    sampling = SamplingParams(max_new_tokens=300, temperature=1.0, ignore_eos=True)
    async with RemoteEngine([a.url, b_url], timeout=120, health_check_interval=60) as engine, \
            httpx.AsyncClient(timeout=30) as client:
        jobs = [asyncio.create_task(engine.generate([*PROMPT, i], sampling)) for i in range(6)]
        async with asyncio.timeout(60):  # both servers got work, and a has produced some tokens
            while True:
                la = (await client.get(a.url + "/server_info")).json()["internal_states"][0]
                lb = (await client.get(b_url + "/v1/loads")).json()["loads"][0]
                if la["num_running_reqs"] == 3 and lb["num_running_reqs"] == 3 and la["num_generated_tokens"] > 30:
                    break
                await asyncio.sleep(0.02)
        a.kill()
        outs = await asyncio.gather(*jobs)
    assert all(len(o.tokens) == 300 and o.finish_reason == "length" for o in outs)
    assert engine.stats["servers_lost"] == 1 and engine.stats["reruns"] == 3
    assert engine.healthy_addresses() == [b_url]


async def test_a_server_that_comes_back_is_resynced_to_the_current_weights():
    script = Script([
        (200, {"message": "ok"}), (200, {"success": True}), (200, {"message": "ok"}),  # publish version 3
        (0, httpx.ConnectError("refused")), (0, httpx.ConnectError("refused")),  # generate; /health fails
        (200, {}), (200, {"weight_version": "2"}), (200, {"success": True}),  # back, stale -> updated
        (200, answer([5], {"type": "length", "length": 1}, version="3")),
    ])
    engine = engine_with(script, health_check_interval=0.01)
    await engine.pause()
    await engine.update_weights("/ckpt-3", 3)
    await engine.resume()
    out = await engine.generate([1], SamplingParams(max_new_tokens=1))
    assert out.versions == [3] and engine.stats["servers_lost"] == 1
    paths = [p for p, _ in script.sent]
    assert paths[3:] == ["/generate", "/health", "/health", "/model_info", "/update_weights_from_disk", "/generate"]
    assert script.sent[7][1] == {"model_path": "/ckpt-3", "weight_version": "3"}
