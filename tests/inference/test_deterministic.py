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


def test_a_decode_token_has_the_same_logits_alone_or_among_other_rows(untrained_model_dir):
    """In-process, the decoder alone: a request's decode steps, alone and beside other decode and
    prefill rows, give bit-equal logits (the batched attention matmuls among them, whose kernel
    may depend on the group's size when an operand is strided)."""
    from agentrl.inference.decoder import Decoder, Step

    torch.set_num_threads(1)
    dec = Decoder(untrained_model_dir, num_slots=8, max_len=128, batch_invariant=True)

    def decode_logits(crowd_seed: int | None) -> list[torch.Tensor]:
        rnd = random.Random(crowd_seed)
        dec.cache_k.zero_()
        dec.cache_v.zero_()
        others = [] if crowd_seed is None else [[rnd.randrange(250) for _ in range(rnd.randint(1, 60))]
                                                for _ in range(rnd.randint(1, 3))]
        out = [dec.forward(Step(decode=[], prefill=[(0, 0, TARGET), *((1 + j, 0, p) for j, p in enumerate(others))]))[0]]
        pos = [len(TARGET), *(len(p) for p in others)]
        for _ in range(6):
            extra = [] if crowd_seed is None or rnd.random() < 0.5 or len(pos) > 6 else [
                (len(pos), 0, [rnd.randrange(250) for _ in range(rnd.randint(1, 40))])]
            out.append(dec.forward(Step(decode=[(7, p) for p in pos], prefill=extra))[0])
            pos = [p + 1 for p in pos] + [len(e[2]) for e in extra]
        return out

    alone = decode_logits(None)
    for seed in range(3):
        assert all(torch.equal(a, b) for a, b in zip(alone, decode_logits(seed), strict=True)), seed
