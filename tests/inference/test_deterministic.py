"""``agentrl serve --enable-deterministic-inference``: a seeded request gives the same bits
whatever shares its batch, whether its prompt came from the prefix cache, and however its
prefill was split — and the numbers are still the model's."""

from __future__ import annotations

import asyncio
import random

import httpx
import torch

TARGET = list(range(40, 70))  # the request every scenario compares
SAMPLING = {"temperature": 1.0, "max_new_tokens": 40, "ignore_eos": True, "sampling_seed": 5}


async def _generate(client: httpx.AsyncClient, url: str, ids: list[int], sampling: dict) -> tuple[list, list]:
    r = await client.post(url + "/generate", json={"input_ids": ids, "sampling_params": sampling,
                                                   "return_logprob": True})
    r.raise_for_status()
    triples = r.json()["meta_info"]["output_token_logprobs"]
    return [t[1] for t in triples], [t[0] for t in triples]


async def _amid_others(url: str, seed: int) -> tuple[list, list]:
    """The target request sent into a crowd: prompts sharing its prefix (the prefix cache),
    long ones (chunks of prefill beside its decode), short ones arriving while it decodes."""
    rnd = random.Random(seed)
    async with httpx.AsyncClient(timeout=120) as client:
        async def other(delay: float) -> None:
            await asyncio.sleep(delay)
            head = TARGET[: rnd.randint(5, 30)] if rnd.random() < 0.5 else []
            ids = head + [rnd.randrange(250) for _ in range(rnd.randint(1, 300))]
            await _generate(client, url, ids, {"temperature": 1.0, "max_new_tokens": rnd.randint(1, 60),
                                               "ignore_eos": True})

        async def target(delay: float) -> tuple[list, list]:
            await asyncio.sleep(delay)
            return await _generate(client, url, TARGET, SAMPLING)

        crowd = [other(rnd.random() * 0.2) for _ in range(15)]
        *_, answer = await asyncio.gather(*crowd, target(rnd.random() * 0.1))
    return answer


def test_a_seeded_request_gives_the_same_bits_alone_or_in_any_crowd(serve_factory, untrained_model_dir, hf_model):
    url = serve_factory(untrained_model_dir, "--enable-deterministic-inference").url
    assert httpx.get(url + "/server_info", timeout=10).json()["enable_deterministic_inference"] is True

    async def alone() -> tuple[list, list]:
        async with httpx.AsyncClient(timeout=120) as client:
            return await _generate(client, url, TARGET, SAMPLING)

    tokens, logprobs = asyncio.run(alone())
    for seed in range(3):
        assert asyncio.run(_amid_others(url, seed)) == (tokens, logprobs), f"crowd {seed}"
    assert asyncio.run(alone()) == (tokens, logprobs)  # now with its prompt in the prefix cache
    # ... and they are the model's numbers: teacher-forced through transformers
    with torch.no_grad():
        logits = hf_model(torch.tensor([TARGET + tokens])).logits[0, len(TARGET) - 1 : -1].float()
    expected = logits.log_softmax(-1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor(logprobs), expected, atol=2e-5), (logprobs[:4], expected[:4].tolist())
