"""VllmSampler: the service's ``sample`` and ``compute_logprobs`` answered by a vLLM server.

What it is: ``agentrl.service.sampler.Sampler`` with vLLM's wire in place of SGLang's. An adapter
loads at run time through ``/v1/load_lora_adapter`` (the server needs ``--enable-lora``, a
``--max-lora-rank`` at least the clients' ranks and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``),
and each request names it in ``model``, so samples of several clients' adapters share vLLM's
batches. Sampling is one ``/inference/v1/generate`` call (vLLM's token-in/token-out route, the one
``agentrl.client.vllm_backend`` speaks: exact token ids and the sampled tokens' log-probabilities),
its sampling parameters mapped by that backend; ``prompt_logprobs: 0`` asks for each prompt
token's own log-probability (the first position has none).

What it is not: the SDK's wire (``sampler``, whose checks every request passes first) or the
server's start: the service is given the URL of a vLLM server already running
(``agentrl service --sampler URL --sampler-engine vllm``).
"""

from __future__ import annotations

from typing import Any

from agentrl.api import SamplingParams
from agentrl.client import vllm_backend
from agentrl.errors import Refused, RequestRejected, ServerError
from agentrl.service.proto import Sequence
from agentrl.service.sampler import Sampler

SGLANG_TO_OURS = {"max_new_tokens": "max_new_tokens", "temperature": "temperature", "top_p": "top_p",
                  "top_k": "top_k", "sampling_seed": "seed", "ignore_eos": "ignore_eos", "stop": "stop",
                  "stop_token_ids": "stop_token_ids"}
"""``sampler.generate_params``' keys (SGLang's names) -> ``SamplingParams`` fields."""


def vllm_params(params: dict[str, Any], want_prompt: bool) -> dict[str, Any]:
    """vLLM's ``sampling_params`` for the SGLang-named ones ``sampler.generate_params`` made."""
    try:
        ours = SamplingParams(**{SGLANG_TO_OURS[k]: v for k, v in params.items() if k != "n"})
        out = vllm_backend.sampling_params(ours, params["n"])
    except (ValueError, TypeError, RequestRejected) as e:
        raise Refused(f"sampling_params: {e}") from None
    if want_prompt:
        out["prompt_logprobs"] = 0
    return out


def prompt_logprobs(entries: Any, prompt: list[int]) -> list[float | None]:
    """Each prompt token's log-probability from vLLM's ``prompt_logprobs`` (a dict per position,
    keyed by token id; None at the first position)."""
    if not isinstance(entries, list) or len(entries) != len(prompt):
        raise ServerError(f"vLLM answered {type(entries).__name__} prompt_logprobs for a prompt of {len(prompt)} tokens")
    out: list[float | None] = []
    for token, entry in zip(prompt, entries, strict=True):
        hit = (entry or {}).get(str(token)) or (entry or {}).get(token)
        out.append(None if hit is None else float(hit["logprob"]))
    return out


class VllmSampler(Sampler):
    """``Sampler`` on vLLM's routes (see the module)."""

    load_route = vllm_backend.LOAD_LORA

    async def generate(self, prompt: list[int], params: dict[str, Any], want_prompt: bool,
                       adapter: str | None) -> tuple[list[Sequence], list[float | None] | None]:
        body: dict[str, Any] = {"token_ids": prompt, "sampling_params": vllm_params(params, want_prompt),
                                "stream": False}
        if adapter is not None:
            body["model"] = adapter
        r = await self.http.post(vllm_backend.GENERATE, json=body)
        if r.status_code != 200:
            raise Refused(f"the sampler refused the request: {r.text[:300]}", 400 if r.status_code < 500 else 502)
        data = r.json()
        parsed = vllm_backend.parse_generate(data, params["n"], lambda _v: 0)
        sequences = [Sequence(tokens=toks, logprobs=lps, stop_reason="length" if reason["type"] == "length" else "stop")
                     for toks, lps, _versions, reason in parsed]
        return sequences, prompt_logprobs(data.get("prompt_logprobs"), prompt) if want_prompt else None
