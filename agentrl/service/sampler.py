"""Sampler: the Tinker API's ``sample`` and ``compute_logprobs``, answered by ``agentrl serve``.

What it is: a client of one inference server (``agentrl serve``, or SGLang, which has the same
native routes) that the service started or was given. A sampling session names the base
model or a saved adapter (a ``tinker://…/sampler_weights/…`` path the learner exported);
``adapter(path)`` loads that adapter into the server once, by name (SGLang's
``/load_lora_adapter``), and every ``sample`` of the session names it per request
(``lora_path``), so sessions of several clients' adapters are served in the same batches.
``sample`` maps the SDK's ``SampleRequest`` onto one ``/generate`` call: ``num_samples`` → ``n``,
``max_tokens``/``temperature``/``top_p``/``top_k``/``seed``, ``stop`` as strings or token ids
(``[]``: not even EOS stops), the sampled tokens' log-probabilities, and with
``prompt_logprobs`` every prompt position's (the first has none: NaN on the wire, None in the
SDK) — which is what the SDK's ``compute_logprobs`` asks for.

What it is not: the sampling itself (``agentrl.inference``), nor top-k log-probabilities,
``target_prompt_logprobs`` or ``prompt_alt_tokens`` (refused by name).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from agentrl.errors import Refused
from agentrl.service.proto import Sequence, sample_response


class Sampler:
    """``/generate`` calls to one inference server at ``url`` (``key``: its API key)."""

    load_route = "/load_lora_adapter"
    """The inference server's route that loads an adapter by name (SGLang's)."""

    def __init__(self, url: str, key: str | None, *, timeout_s: float = 600.0) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout_s)
        self.loaded: dict[Path, str] = {}
        self.lock = asyncio.Lock()

    async def adapter(self, path: Path) -> str:
        """The server's name for the adapter at ``path``, loading it the first time."""
        async with self.lock:
            if path not in self.loaded:
                name = f"tinker{len(self.loaded) + 1}"
                r = await self.http.post(self.load_route, json={"lora_name": name, "lora_path": str(path)})
                if r.status_code != 200 or not _succeeded(r):
                    raise Refused(f"the sampler could not load the adapter {path.name!r}: {r.text[:300]}", 400)
                self.loaded[path] = name
            return self.loaded[path]

    async def sample(self, request: dict[str, Any], adapter: str | None) -> bytes:
        """The ``SampleResponse`` (protobuf) of one ``SampleRequest`` body."""
        for key in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
            if request.get(key):
                raise Refused(f"{key} is not served by this service; leave it at 0")
        if request.get("target_prompt_logprobs") is not None:
            raise Refused("target_prompt_logprobs is not served by this service; leave it out")
        prompt = prompt_tokens(request.get("prompt"))
        n = request.get("num_samples", 1)
        if not isinstance(n, int) or not 1 <= n <= 1024:
            raise Refused(f"num_samples must be an integer in [1, 1024], got {n!r}")
        want_prompt = bool(request.get("prompt_logprobs"))
        params = generate_params(request.get("sampling_params") or {}, n)
        sequences, prompt_lps = await self.generate(prompt, params, want_prompt, adapter)
        last_n = request.get("prompt_logprobs_last_n")
        if prompt_lps is not None and isinstance(last_n, int) and 0 < last_n < len(prompt_lps):
            prompt_lps = [None] * (len(prompt_lps) - last_n) + prompt_lps[-last_n:]
        return sample_response(sequences, prompt_lps)

    async def generate(self, prompt: list[int], params: dict[str, Any], want_prompt: bool,
                       adapter: str | None) -> tuple[list[Sequence], list[float | None] | None]:
        """``params["n"]`` sequences from one ``/generate`` call, and with ``want_prompt`` every
        prompt position's log-probability (the first None)."""
        body = {"input_ids": prompt, "sampling_params": params, "return_logprob": True,
                "logprob_start_len": 0 if want_prompt else -1}
        if adapter is not None:
            body["lora_path"] = adapter
        r = await self.http.post("/generate", json=body)
        if r.status_code != 200:
            raise Refused(f"the sampler refused the request: {r.text[:300]}", 400 if r.status_code < 500 else 502)
        results = r.json()
        results = results if isinstance(results, list) else [results]
        sequences = [Sequence(tokens=list(x["output_ids"]),
                              logprobs=[lp[0] for lp in x["meta_info"]["output_token_logprobs"]],
                              stop_reason="length" if (x["meta_info"].get("finish_reason") or {}).get("type") == "length"
                              else "stop") for x in results]
        prompt_lps = [lp[0] for lp in results[0]["meta_info"]["input_token_logprobs"]] if want_prompt else None
        return sequences, prompt_lps

    async def close(self) -> None:
        await self.http.aclose()


def _succeeded(r: httpx.Response) -> bool:
    try:
        body = r.json()
    except ValueError:
        return True  # vLLM answers its load route with plain text
    return not isinstance(body, dict) or body.get("success", True)


def prompt_tokens(prompt: Any) -> list[int]:
    """The token ids of a ``ModelInput`` body (its ``encoded_text`` chunks)."""
    chunks = prompt.get("chunks") if isinstance(prompt, dict) else None
    if not isinstance(chunks, list):
        raise Refused("prompt must be a ModelInput: {\"chunks\": [{\"type\": \"encoded_text\", \"tokens\": [...]}]}")
    tokens: list[int] = []
    for chunk in chunks:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("tokens"), list):
            raise Refused("every prompt chunk must be encoded text with its tokens (images and audio are not served here)")
        tokens += chunk["tokens"]
    if not tokens or not all(isinstance(t, int) for t in tokens):
        raise Refused("the prompt must hold at least one token id (integers)")
    return tokens


def generate_params(params: dict[str, Any], n: int) -> dict[str, Any]:
    """SGLang's ``sampling_params`` for the SDK's ``SamplingParams``."""
    out: dict[str, Any] = {"n": n, "max_new_tokens": params.get("max_tokens") or 128,
                           "temperature": params.get("temperature", 1.0), "top_p": params.get("top_p", 1.0),
                           "top_k": params.get("top_k", -1)}
    if params.get("seed") is not None:
        out["sampling_seed"] = params["seed"]
    stop = params.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop == []:
        out["ignore_eos"] = True
    elif stop and all(isinstance(s, int) for s in stop):
        out["stop_token_ids"] = list(stop)
    elif stop:
        out["stop"] = list(stop)
    return out
