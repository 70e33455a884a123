"""SGLang's router (sglang-router, unmodified) in front of two real `agentrl serve` workers: it
registers them from what they answer, polls their load, spreads generation over them, passes
OpenAI calls through (the openai SDK as the client), and RemoteEngine's weight-update protocol
(pause -> update every server -> continue) holds behind it: requests in flight come back through
the router, resume and carry both versions."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import httpx
import pytest

from agentrl.api import SamplingParams
from agentrl.client.remote_engine import RemoteEngine
from agentrl.process.services import ServerProcess
from agentrl.run.inference_config import InferenceConfig
from agentrl.run.router import SGLangRouter

pytestmark = pytest.mark.timeout(300)
PROMPT = [10, 20, 30, 40, 50]  # ids of the tiny model's 264-token vocabulary


@pytest.fixture(scope="module")
def fleet(tiny_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("router") / "router.log"
    with ServerProcess(tiny_model_dir, "--weight-version", "0") as a, \
            ServerProcess(tiny_model_dir, "--weight-version", "0") as b:
        router = SGLangRouter([a.url, b.url], InferenceConfig(router_args=["--policy", "round_robin"]), log)
        router.start()
        try:
            yield router, [a.url, b.url]
        finally:
            router.stop()


def generated(url: str) -> int:
    return httpx.get(url + "/server_info", timeout=10).json()["internal_states"][0]["num_generated_tokens"]


def test_the_router_registers_both_workers_from_their_answers(fleet):
    router, workers = fleet
    listed = httpx.get(router.url + "/workers", timeout=10).json()["workers"]
    assert sorted(w["url"] for w in listed) == sorted(workers) and all(w["is_healthy"] for w in listed)
    assert all(w["metadata"]["model_type"] == "qwen2" for w in listed)  # from our /model_info
    loads = httpx.get(router.url + "/get_loads", timeout=10).json()["workers"]
    assert sorted(x["worker"] for x in loads) == sorted(workers)
    assert all(x["load"] >= 0 for x in loads)  # our /get_load parsed (-1 means the worker did not answer)


def test_openai_calls_pass_through_the_router(fleet):
    from openai import OpenAI

    router, _ = fleet
    client = OpenAI(base_url=router.url + "/v1", api_key="unused", timeout=60)
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "1+1="}],
                                           max_tokens=8, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.completion_tokens >= 1


async def test_generation_spreads_and_weight_updates_hold_behind_the_router(fleet, tiny_model_dir):
    router, workers = fleet
    before = await asyncio.to_thread(lambda: [generated(u) for u in workers])
    long = SamplingParams(max_new_tokens=400, temperature=1.0, ignore_eos=True)
    async with RemoteEngine(workers, router=router.url, timeout=120) as engine, \
            httpx.AsyncClient(timeout=30) as client:
        jobs = [asyncio.create_task(engine.generate([*PROMPT, i], long)) for i in range(4)]
        async with asyncio.timeout(60):  # round robin: two on each worker, both producing
            while True:
                for job in jobs:
                    if job.done():
                        job.result()  # a failure surfaces here, not as a timeout
                states = [(await client.get(u + "/server_info")).json()["internal_states"][0] for u in workers]
                if all(s["num_running_reqs"] == 2 and s["num_generated_tokens"] - b > 40
                       for s, b in zip(states, before, strict=True)):
                    break
                await asyncio.sleep(0.02)
        await engine.pause()  # every worker, directly: the router forwards none of these
        await engine.update_weights(str(tiny_model_dir), 1)
        await engine.resume()
        outs = await asyncio.gather(*jobs)
        after = await engine.generate(PROMPT, SamplingParams(max_new_tokens=4, temperature=0.0))
        versions = [(await client.get(u + "/model_info")).json()["weight_version"] for u in workers]
    assert versions == ["1", "1"]
    assert all(len(o.tokens) == 400 and o.finish_reason == "length" for o in outs)
    assert all(o.versions[0] == 0 and o.versions[-1] == 1 for o in outs)  # resumed through the router
    assert engine.stats["resumes"] >= 4 and after.versions == [1] * 4


async def test_short_requests_of_one_tick_pass_the_router(fleet):
    """A rollout's short requests arrive together; the router refuses SGLang's batch form with
    per-request ids or sampling parameters (422), so behind it each one goes alone."""
    router, _ = fleet
    short = SamplingParams(max_new_tokens=6, temperature=1.0, ignore_eos=True)  # a sampled EOS would end one early
    async with RemoteEngine(fleet[1], router=router.url, timeout=60) as engine:
        singles = await asyncio.gather(*(engine.generate([*PROMPT, i], short) for i in range(8)))
        group = await engine.generate_group(PROMPT, short, 4)
        seeded = await engine.generate_group(PROMPT, replace(short, seed=7), 3)
    assert all(len(c.tokens) == 6 for c in [*singles, *group, *seeded])
    assert engine.stats["retries"] == 0  # none was refused and re-run
    assert len({tuple(c.tokens) for c in seeded}) > 1  # seeds 7, 8, 9: not one sample three times
