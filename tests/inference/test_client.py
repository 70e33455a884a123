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
from agentrl.client import sglang_backend
from agentrl.client.backend import EngineBackend
from agentrl.client.engines import ENGINES, detect
from agentrl.client.remote_engine import RemoteEngine
from agentrl.client.sglang_backend import SGLangBackend
from agentrl.client.vllm_backend import VLLMBackend
from agentrl.errors import RequestRejected, ServerError, ServerUnavailable

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
    return RemoteEngine(["http://a"], transport=httpx.MockTransport(script), backoff=0.0, engine="sglang", **kw)


def test_remote_engine_is_an_inference_client():
    assert isinstance(RemoteEngine(["http://127.0.0.1:1"]), InferenceClient)
    with pytest.raises(ValueError, match="at least one server"):
        RemoteEngine([])


def test_every_registered_engine_meets_the_backend_protocol_and_auto_finds_it():
    """Adding an engine is a backend module and a registry line: each registered class has
    every member ``EngineBackend`` declares; ``auto`` picks by ``/v1/models``' ``owned_by``
    and takes SGLang's API for an owner it does not know."""
    members = {n for n in vars(EngineBackend) if not n.startswith("_")} | set(EngineBackend.__annotations__)
    assert {"generate", "load_weights", "receive_weights", "pause", "lora_routes"} <= members
    for name, backend in ENGINES.items():
        assert not [m for m in members if not hasattr(backend, m)], name
    assert (ENGINES["agentrl"], ENGINES["vllm"]) == (SGLangBackend, VLLMBackend)
    assert [detect(owners) for owners in ({"vllm"}, {"sglang"}, {"someone", None}, set())] == [
        VLLMBackend, SGLangBackend, SGLangBackend, SGLangBackend]


def test_sampling_params_speak_sglang():
    """SGLang's names (``sampling_seed``), only what differs from the defaults, ``n`` above 1."""
    sp = SamplingParams(max_new_tokens=7, temperature=0.0, stop=["\n"], seed=3, min_new_tokens=2)
    assert sglang_backend.sampling_params(sp) == {"max_new_tokens": 7, "temperature": 0.0, "top_p": 1.0, "top_k": -1,
                                                  "ignore_eos": False, "stop": ["\n"], "sampling_seed": 3,
                                                  "min_new_tokens": 2}
    assert sglang_backend.sampling_params(sp, 4)["n"] == 4 and "n" not in sglang_backend.sampling_params(sp, 1)


async def test_auto_asks_the_servers_once_and_speaks_what_they_name():
    """``engine: auto``: ``GET /v1/models`` once; a vLLM server is then sent vLLM's body."""
    script = Script([(200, {"data": [{"id": "m", "owned_by": "vllm"}]}),
                     (200, {"choices": [{"index": 0, "token_ids": [5], "finish_reason": "length",
                                         "logprobs": {"content": [{"token_id": 5, "logprob": -0.1}]}}]})])
    engine = RemoteEngine(["http://a"], transport=httpx.MockTransport(script), backoff=0.0)
    c = await engine.generate(PROMPT, SamplingParams(max_new_tokens=1, min_new_tokens=1))
    assert (c.tokens, c.finish_reason) == ([5], "length")
    assert [path for path, _ in script.sent] == ["/v1/models", "/inference/v1/generate"]
    assert script.sent[1][1]["sampling_params"]["min_tokens"] == 1


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


async def test_a_server_that_missed_the_pause_is_paused_when_it_answers_again():
    """Down when the pause went out, back before the resume: the next control call pauses it
    first, so a colocated run's memory release finds it paused like the others."""
    script = Script([
        (0, httpx.ConnectError("refused")),  # the pause: marked down (no retries)
        (200, {}), (200, {"message": "ok"}),  # /health answers: paused on its return
        (200, {"success": True}),  # the release
    ])
    engine = engine_with(script, max_retries=0, health_check_interval=0.01)
    await engine.pause()
    assert engine.healthy_addresses() == []
    await engine.release_memory()
    assert script.sent == [("/pause_generation", {"mode": "abort"}), ("/health", {}),
                           ("/pause_generation", {"mode": "abort"}), ("/release_memory_occupation", {})]


async def test_a_client_that_follows_the_publisher_s_resyncs_a_restarted_server_to_its_weights():
    """The rollout process's client never publishes: it follows the publisher's (``policy``)."""
    publisher = engine_with(Script([(200, {"message": "ok"}), (200, {"success": True}), (200, {"message": "ok"})]))
    await publisher.pause()
    await publisher.update_weights("/ckpt-3", 3)
    await publisher.resume()
    script = Script([
        (0, httpx.ConnectError("refused")), (0, httpx.ConnectError("refused")),  # generate; /health fails
        (200, {}), (200, {"weight_version": "2"}), (200, {"success": True}),  # back, stale -> updated
        (200, answer([5], {"type": "length", "length": 1}, version="3")),
    ])
    follower = engine_with(script, health_check_interval=0.01)
    follower.follow(publisher.policy())
    assert follower.policy() == publisher.policy() and follower.version == 3
    out = await follower.generate([1], SamplingParams(max_new_tokens=1))
    assert out.versions == [3]
    assert [p for p, _ in script.sent] == ["/generate", "/health", "/health", "/model_info",
                                           "/update_weights_from_disk", "/generate"]
    assert script.sent[4][1] == {"model_path": "/ckpt-3", "weight_version": "3"}


class Generate:
    """Answers /generate per sample with ``reply(prompt, sampling_params) -> (status, result)``
    and records every body (batches included)."""

    def __init__(self, reply):
        self.reply = reply
        self.sent: list[dict] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.sent.append(body)
        batch = isinstance(body["input_ids"][0], list)
        prompts = body["input_ids"] if batch else [body["input_ids"]]
        sps = body["sampling_params"]
        sps = sps if isinstance(sps, list) else [sps] * len(prompts)  # one object applies to every prompt
        results = []
        for p, sp in zip(prompts, sps, strict=True):
            for _ in range(sp.get("n", 1)):
                status, result = self.reply(p, sp)
                if status != 200:
                    return httpx.Response(status, json=result)
                results.append(result)
        return httpx.Response(200, json=results if batch or len(results) > 1 else results[0])


async def test_a_group_is_one_request_and_an_aborted_sample_resumes_alone():
    aborted = iter([True])

    def reply(prompt, sp):
        if len(prompt) > 2:  # a resume: prompt + the 2 tokens kept
            return 200, answer([7, 9], {"type": "stop", "matched": 9}, version="4")
        if sp.get("n") and next(aborted, False):
            return 200, answer([5, 6], {"type": "abort", "message": "Aborted", "status_code": None})
        return 200, answer([8], {"type": "stop", "matched": 8})

    fake = Generate(reply)
    engine = RemoteEngine(["http://a"], transport=httpx.MockTransport(fake), backoff=0.0, engine="sglang")
    outs = await engine.generate_group([1, 2], SamplingParams(max_new_tokens=10, stop_token_ids=[8, 9]), 3)
    assert [o.tokens for o in outs] == [[5, 6, 7, 9], [8], [8]]
    assert outs[0].versions == [3, 3, 4, 4] and outs[0].finish_reason == "stop"
    first, resume = fake.sent
    assert first["input_ids"] == [1, 2] and first["sampling_params"]["n"] == 3
    assert resume["input_ids"] == [1, 2, 5, 6] and resume["sampling_params"]["max_new_tokens"] == 8


async def test_groups_of_one_tick_share_a_request_and_a_refusal_reaches_only_its_group():
    def reply(prompt, sp):
        if prompt == [66]:
            return 400, {"error": {"message": "prompt 66 is refused"}}
        return 200, answer([prompt[0]], {"type": "length", "length": 1})

    fake = Generate(reply)
    engine = RemoteEngine(["http://a"], transport=httpx.MockTransport(fake), backoff=0.0, engine="sglang")
    sampling = SamplingParams(max_new_tokens=1)
    good = await asyncio.gather(*(engine.generate_group([p], sampling, 2) for p in (10, 11, 12)))
    assert [[o.tokens for o in g] for g in good] == [[[10], [10]], [[11], [11]], [[12], [12]]]
    assert len(fake.sent) == 1 and fake.sent[0]["input_ids"] == [[10], [11], [12]]
    outcomes = await asyncio.gather(*(engine.generate_group([p], sampling, 2) for p in (10, 66)),
                                    return_exceptions=True)
    assert [o.tokens for o in outcomes[0]] == [[10], [10]]
    assert isinstance(outcomes[1], RequestRejected) and "66 is refused" in str(outcomes[1])
    assert [b["input_ids"] for b in fake.sent[1:]] == [[[10], [66]], [10], [66]]  # then each alone


async def test_a_seeded_group_sends_consecutive_seeds_and_a_failed_group_falls_back_to_single_requests():
    def reply(prompt, sp):
        return 200, answer([sp.get("sampling_seed", 0)], {"type": "length", "length": 1})

    fake = Generate(reply)
    engine = RemoteEngine(["http://a"], transport=httpx.MockTransport(fake), backoff=0.0, engine="sglang")
    outs = await engine.generate_group([1], SamplingParams(max_new_tokens=1, seed=40), 3)
    assert [o.tokens for o in outs] == [[40], [41], [42]]
    assert fake.sent[0]["input_ids"] == [[1]] * 3 and "n" not in fake.sent[0]["sampling_params"][0]

    def flaky(prompt, sp):
        return (503, {"message": "busy"}) if sp.get("n") else (200, answer([4], {"type": "length", "length": 1}))

    fake = Generate(flaky)
    engine = RemoteEngine(["http://a"], transport=httpx.MockTransport(fake), backoff=0.0, engine="sglang")
    outs = await engine.generate_group([1], SamplingParams(max_new_tokens=1), 2)
    assert [o.tokens for o in outs] == [[4], [4]] and engine.stats["retries"] == 1
    assert [b["input_ids"] for b in fake.sent] == [[1], [[1], [1]]]  # the two re-runs left together


async def test_a_vllm_server_without_agentrl_s_worker_extension_loads_with_vllm_s_own_reload(tiny_model_dir, caplog):
    """A vLLM server started by hand, without ``--worker-extension-cls``, answers the extension's
    method with a 500 naming it (the answer below is vLLM 0.32's, as seen): the update goes on
    with vLLM's ``reload_weights``, with a warning naming the flag, and later updates use it
    directly. Any other failure of the reload is raised."""
    missing = {"error": {"message": "Call to collective_rpc method failed: Worker failed with error ''CPUWorker' "
                                    "object has no attribute 'agentrl_reload_weights'', please check the stack "
                                    "trace above for the root cause", "type": "InternalServerError", "code": 500}}
    models = (200, {"data": [{"id": "m", "root": str(tiny_model_dir), "owned_by": "vllm"}]})
    script = Script([models, (500, missing), (200, {"results": [None]}), (200, {}), (200, {"success": True}),
                     (200, {"results": [None]}), (200, {}), (200, {"success": True})])
    engine = RemoteEngine(["http://a"], transport=httpx.MockTransport(script), backoff=0.0, engine="vllm")
    await engine.update_weights(str(tiny_model_dir), 1)
    await engine.update_weights(str(tiny_model_dir), 2)
    methods = [body["method"] for path, body in script.sent if path == "/collective_rpc"]
    assert methods == ["agentrl_reload_weights", "reload_weights", "reload_weights"]
    assert engine.version == 2 and "--worker-extension-cls agentrl_vllm_worker.WorkerExtension" in caplog.text

    broken = {"error": {"message": "Call to collective_rpc method failed: Worker failed with error 'shape "
                                   "mismatch'", "type": "InternalServerError", "code": 500}}
    engine = RemoteEngine(["http://a"], transport=httpx.MockTransport(Script([models, (500, broken)])), backoff=0.0,
                          engine="vllm")
    with pytest.raises(ServerError, match="shape mismatch"):
        await engine.update_weights(str(tiny_model_dir), 1)
    assert engine.version == 0
