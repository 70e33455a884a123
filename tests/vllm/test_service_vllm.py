"""The Tinker service's sampler on a real vLLM server (vLLM's CPU build): a client's adapter loaded
at run time and named per request, the sampled tokens' and the prompt's log-probabilities.

The bug stories: an adapter loaded but not named by the request (the base model's samples come
back as the client's); the prompt's log-probabilities shifted by one position (the SDK's
``compute_logprobs`` would score the wrong tokens); a load answered in plain text read as a failure.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.errors import Refused
from agentrl.service.sampler import generate_params
from agentrl.service.vllm_sampler import VllmSampler

PROMPT = [49, 50, 43, 55, 61]


def logprobs_of(model, tokens: list[int]) -> list[float]:
    """log p(token_i | tokens_<i) for i >= 1, by transformers."""
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens[1:])[:, None])[:, 0].tolist()


def greedy(model, prompt: list[int], n: int) -> list[int]:
    """``n`` argmax tokens, past EOS (as vLLM with ``ignore_eos``), by transformers."""
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            tokens.append(int(model(torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(prompt):]


def test_a_clients_adapter_samples_on_vllm_by_name(vllm_server, tiny_model_dir, tmp_path, random_adapter):
    from agentrl.trainer.lora import merge_adapter

    random_adapter(tiny_model_dir, tmp_path / "adapter", rank=8, seed=5)
    merged = AutoModelForCausalLM.from_pretrained(merge_adapter(tmp_path / "adapter", tmp_path / "merged",
                                                                base_dir=tiny_model_dir), dtype=torch.float32).eval()
    argmax = generate_params({"max_tokens": 8, "temperature": 0.0, "stop": []}, 1)  # vLLM: greedy takes n=1
    sampled = generate_params({"max_tokens": 8, "stop": []}, 2)

    async def main():
        sampler = VllmSampler(vllm_server.url, vllm_server.key)
        name = None
        try:
            name = await sampler.adapter(tmp_path / "adapter")
            assert await sampler.adapter(tmp_path / "adapter") == name  # loaded once, then by name
            tuned = await sampler.generate(PROMPT, argmax, True, name)
            group = await sampler.generate(PROMPT, sampled, False, name)
            base = await sampler.generate(PROMPT, argmax, False, None)
            with pytest.raises(Refused, match="sampling_params"):
                await sampler.generate(PROMPT, generate_params({"max_tokens": 4, "top_p": 0.0}, 1), False, name)
            return tuned, group, base
        finally:
            if name is not None:
                async with httpx.AsyncClient(timeout=30, headers=vllm_server.auth) as http:
                    await http.post(vllm_server.url + "/v1/unload_lora_adapter", json={"lora_name": name})
            await sampler.close()

    (sequences, prompt_lps), (group, no_prompt), (base_sequences, _) = asyncio.run(main())
    expect = greedy(merged, PROMPT, 8)
    assert [s.tokens for s in sequences] == [expect] and sequences[0].stop_reason == "length"
    assert sequences[0].logprobs == pytest.approx(logprobs_of(merged, PROMPT + expect)[len(PROMPT) - 1:], abs=2e-3)
    assert len(group) == 2 and no_prompt is None
    for s in group:  # sampled at T = 1: each token's logprob is the adapted model's
        assert s.logprobs == pytest.approx(logprobs_of(merged, PROMPT + s.tokens)[len(PROMPT) - 1:], abs=2e-3)
    assert prompt_lps[0] is None
    assert prompt_lps[1:] == pytest.approx(logprobs_of(merged, PROMPT), abs=2e-3)
    assert base_sequences[0].tokens != expect  # the base model answers otherwise: the adapter was used
