"""Prompt sharing in a real ``agentrl serve``: the prefix cache, group twins and packed prefill, over HTTP.

The story: a cache may only make the server faster. Every test compares what a request gets
with the cache against what it gets without it (or against transformers), and checks the
counters that show the work was really shared — and never shared across a weight update.
"""

from __future__ import annotations

import asyncio
import itertools
import random

import httpx
import torch

from agentrl.api import SamplingParams
from agentrl.client.remote_engine import RemoteEngine

from ..serving import until_generating

SYSTEM = list(range(40, 80))  # a 40-token "system prompt" that several prompts share


def post(url: str, body: dict, timeout: float = 120.0):
    r = httpx.post(url + "/generate", json=body, timeout=timeout)
    assert r.status_code == 200, r.text
    return r.json()


def state(url: str) -> dict:
    return httpx.get(url + "/get_server_info", timeout=10).json()["internal_states"][0]


async def astate(client: httpx.AsyncClient, url: str) -> dict:
    return (await client.get(url + "/get_server_info")).json()["internal_states"][0]


PROMPTS = random.Random(2026)  # seeded: a run draws the same prompts, so any near-tie in greedy
# decoding they meet is met every time, not once in a few hundred runs


def unique_prompt(n: int = 24) -> list[int]:
    """Random tokens: no other prompt is likely to share more than their first token or two
    (the cache may hold such a head; the tests allow for it where it matters)."""
    return [PROMPTS.randrange(3, 250) for _ in range(n)]


def triples(result: dict) -> tuple[list[int], torch.Tensor]:
    meta = result["meta_info"]["output_token_logprobs"]
    return [t[1] for t in meta], torch.tensor([t[0] for t in meta])


def teacher_forced(model_dir, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]


def test_outputs_and_logprobs_are_identical_with_and_without_the_cache(server, serve_factory, untrained_model_dir):
    plain = serve_factory(untrained_model_dir, "--disable-radix-cache").url
    assert httpx.get(plain + "/get_server_info", timeout=10).json()["disable_radix_cache"] is True
    assert httpx.get(server + "/get_server_info", timeout=10).json()["disable_radix_cache"] is False
    tail = unique_prompt(3)
    prompts = [[*SYSTEM, *tail, 100 + i] for i in range(3)]
    for sampling in ({"temperature": 0}, {"temperature": 1.0, "sampling_seed": 5}):
        sp = {**sampling, "max_new_tokens": 16, "ignore_eos": True}
        seen = {}
        for url in (server, plain):
            results = []
            for p in prompts:  # in turn: the 2nd and 3rd prompts find the system prompt cached
                first = post(url, {"input_ids": p, "sampling_params": sp, "return_logprob": True})
                follow = [*p, *first["output_ids"], 33, 34]  # the episode's next turn
                second = post(url, {"input_ids": follow, "sampling_params": sp, "return_logprob": True})
                group = post(url, {"input_ids": p, "sampling_params": {**sp, "n": 3}, "return_logprob": True})
                results.append([first, second, *group])
                if url == server:  # the next turn reused the whole first turn but its last token
                    assert second["meta_info"]["cached_tokens"] == len(p) + 16 - 1
                else:
                    assert all(r["meta_info"]["cached_tokens"] == 0 for r in [first, second, *group])
            seen[url] = results
        for cached, fresh in zip(seen[server], seen[plain], strict=True):
            for a, b in zip(cached, fresh, strict=True):
                (ta, la), (tb, lb) = triples(a), triples(b)
                assert ta == tb
                assert torch.allclose(la, lb, atol=1e-5), (la, lb)
    assert state(server)["num_cached_tokens"] > 0 and state(plain)["num_cached_tokens"] == 0


def test_the_n_samples_of_a_group_compute_the_prompt_once(server):
    prompt = unique_prompt()
    before = state(server)
    out = post(server, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4, "n": 8, "ignore_eos": True},
                        "return_logprob": True})
    after = state(server)
    # one sample computed the prompt; its seven twins took its keys/values (and its first logits)
    first, *twins = sorted(r["meta_info"]["cached_tokens"] for r in out)
    assert first < len(prompt) and twins == [len(prompt)] * 7  # first: a head an earlier request cached
    assert after["num_prompt_tokens"] - before["num_prompt_tokens"] == 8 * len(prompt)
    assert after["num_cached_tokens"] - before["num_cached_tokens"] == first + 7 * len(prompt)
    assert len({tuple(r["output_ids"]) for r in out}) > 1  # still eight independent samples
    loads = httpx.get(server + "/v1/loads", timeout=10).json()["loads"][0]
    assert 0 < loads["cache_hit_rate"] == after["cache_hit_rate"] <= 1


def test_a_batch_prefilled_together_equals_each_prompt_alone(serve_factory, untrained_model_dir):
    """Prompts of different lengths packed into one forward pass give the tokens and logprobs
    that each gets when it is computed alone (no cache, so every prompt is really computed)."""
    url = serve_factory(untrained_model_dir, "--disable-radix-cache").url
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 250) for _ in range(n)] for n in (5, 17, 9, 30, 2, 12)]
    for sampling in ({"temperature": 0}, {"temperature": 1.0, "sampling_seed": 11}):
        sp = {**sampling, "max_new_tokens": 10, "ignore_eos": True}
        together = post(url, {"input_ids": prompts, "sampling_params": sp, "return_logprob": True})
        before = state(url)["num_prefill_calls"]
        alone = [post(url, {"input_ids": p, "sampling_params": sp, "return_logprob": True}) for p in prompts]
        assert state(url)["num_prefill_calls"] - before == len(prompts)
        for a, b in zip(together, alone, strict=True):
            (ta, la), (tb, lb) = triples(a), triples(b)
            assert ta == tb and torch.allclose(la, lb, atol=1e-5)


async def test_a_weight_update_invalidates_every_cached_prefix(untrained_model_dir, second_model_dir, updatable_server):
    url = updatable_server.url
    async with httpx.AsyncClient(timeout=60) as client:
        r = await client.post(url + "/update_weights_from_disk", json={"model_path": str(untrained_model_dir),
                                                                       "weight_version": "0"})
        assert r.status_code == 200
        prompt = unique_prompt()
        body = {"input_ids": prompt, "return_logprob": True,
                "sampling_params": {"max_new_tokens": 8, "temperature": 1.0, "sampling_seed": 2, "ignore_eos": True}}
        await client.post(url + "/generate", json=body)
        again = (await client.post(url + "/generate", json=body)).json()
        assert again["meta_info"]["cached_tokens"] == len(prompt) - 1  # cached under the old weights
        # a long request runs across the update: its keys/values mix both weights
        long = asyncio.create_task(client.post(url + "/generate", json={
            "input_ids": prompt[:10], "sampling_params": {"max_new_tokens": 300, "ignore_eos": True}}))
        await until_generating(url)
        r = await client.post(url + "/update_weights_from_disk", json={"model_path": str(second_model_dir),
                                                                       "weight_version": "1"})
        assert r.status_code == 200 and (await astate(client, url))["radix_cache_tokens"] == 0
        mixed = (await long).json()
        after = (await client.post(url + "/generate", json=body)).json()
        # nothing from before the update served the prompt, nor was the mixed request cached
        assert after["meta_info"]["cached_tokens"] == 0
        resumed = (await client.post(url + "/generate", json={
            "input_ids": prompt[:10] + mixed["output_ids"][:-1], "sampling_params": {"max_new_tokens": 1}})).json()
        # only the prompt head, which `after` computed under the new weights (with the odd mixed
        # token that happens to equal what follows the head there); none of the mixed output
        asked, cached = prompt[:10] + mixed["output_ids"][:-1], [*prompt, *after["output_ids"][:-1]]
        head = len(list(itertools.takewhile(lambda ab: ab[0] == ab[1], zip(asked, cached, strict=False))))
        assert head >= 10 and resumed["meta_info"]["cached_tokens"] == min(head, len(asked) - 1)
    tokens, logprobs = triples(after)
    assert torch.allclose(logprobs, teacher_forced(second_model_dir, prompt, tokens), atol=1e-4)


async def test_flush_cache_empties_it_and_waits_for_idleness(server):
    async with httpx.AsyncClient(timeout=60) as client:
        prompt = unique_prompt()
        body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
        await client.post(server + "/generate", json=body)
        assert (await client.post(server + "/generate", json=body)).json()["meta_info"]["cached_tokens"] > 0
        long = asyncio.create_task(client.post(server + "/generate", json={
            "input_ids": prompt, "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}))
        await until_generating(server)
        busy = await client.post(server + "/flush_cache")
        assert busy.status_code == 400 and "not flushed" in busy.text
        await long
        r = await client.post(server + "/flush_cache")
        assert r.status_code == 200 and (await astate(client, server))["radix_cache_tokens"] == 0
        assert (await client.post(server + "/generate", json=body)).json()["meta_info"]["cached_tokens"] == 0


def test_eviction_under_memory_pressure_keeps_answers_right(serve_factory, untrained_model_dir, hf_model):
    url = serve_factory(untrained_model_dir, "--prefix-cache-tokens", "64").url
    prompts = [[250 + i, *unique_prompt(29)] for i in range(4)]  # distinct first tokens: nothing shared
    sp = {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}
    firsts = [post(url, {"input_ids": p, "sampling_params": sp}) for p in prompts]
    info = state(url)
    assert info["radix_cache_capacity"] == 64 and info["radix_cache_tokens"] <= 64
    assert info["radix_cache_evicted_tokens"] > 0
    oldest, newest = (post(url, {"input_ids": p, "sampling_params": sp}) for p in (prompts[0], prompts[-1]))
    assert oldest["meta_info"]["cached_tokens"] == 0  # evicted first (least recently used)
    assert newest["meta_info"]["cached_tokens"] == len(prompts[-1]) - 1
    for p, out in zip(prompts, firsts, strict=True):
        ids = list(p)
        with torch.no_grad():
            for _ in range(3):
                ids.append(int(hf_model(torch.tensor([ids])).logits[0, -1].argmax()))
        assert out["output_ids"] == ids[len(p):]
    assert oldest["output_ids"] == firsts[0]["output_ids"] and newest["output_ids"] == firsts[-1]["output_ids"]


async def test_remote_engine_groups_share_the_prompt(server):
    """``generate_group`` through the real server: one request for the rollout's groups, the
    prompt computed once per group, seeded groups reproducible and made of distinct samples."""
    prompts = [unique_prompt() for _ in range(3)]
    async with RemoteEngine([server]) as engine, httpx.AsyncClient(timeout=30) as client:
        before = await astate(client, server)
        groups = await asyncio.gather(*(engine.generate_group(p, SamplingParams(max_new_tokens=5), 4)
                                        for p in prompts))
        after = await astate(client, server)
        assert engine.stats["posts"] == 1  # the three groups left in one /generate
        seeded = SamplingParams(max_new_tokens=6, temperature=1.0, seed=9, ignore_eos=True)
        a = await engine.generate_group(prompts[0], seeded, 3)
        b = await engine.generate_group(prompts[0], seeded, 3)
    assert [len(g) for g in groups] == [4, 4, 4] and all(c.finish_reason in ("stop", "length") for g in groups for c in g)
    # each group's three twins took its first sample's prompt; that one may have found a head
    # of its prompt cached by an earlier request (a random prompt's first token, most often)
    assert 0 <= after["num_cached_tokens"] - before["num_cached_tokens"] - 3 * 3 * len(prompts[0]) < 3 * len(prompts[0])
    assert [c.tokens for c in a] == [c.tokens for c in b] and len({tuple(c.tokens) for c in a}) == 3
