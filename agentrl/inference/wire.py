"""SGLang's ``/generate`` wire format, as ``agentrl serve`` reads and writes it.

What it is: validation of request bodies (``sampling_params`` keys, types, ranges, context
length — each failure a ``BadRequest`` whose message names the field and what is allowed)
and the shapes of results (``text``, ``output_ids``, ``meta_info`` with ``finish_reason``,
``output_token_logprobs`` triples, ``weight_versions`` spans), following sglang 0.5.23
(``python/sglang/srt/managers/io_struct.py``, ``sampling/sampling_params.py``). The functions take
the few values they need (context length, vocabulary size, tokenizer), not the server.
What it is not: the routes (``agentrl.inference.native_routes``, ``openai_routes``) or the engine.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse

from agentrl.api import SamplingParams

if TYPE_CHECKING:  # annotations only: the format itself needs no torch
    from agentrl.inference.engine import Request as EngineRequest

SAMPLING_KEYS = (
    "max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty",
    "presence_penalty", "repetition_penalty", "stop", "stop_regex", "stop_token_ids", "ignore_eos",
    "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "n", "sampling_seed",
    "json_schema", "regex", "ebnf", "structural_tag", "logit_bias", "stream_interval", "custom_params",
)
# Keys we accept only at their neutral value: anything else is a 400 naming the key.
_NEUTRAL = {"min_new_tokens": 0, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
            "repetition_penalty": 1.0, "stop_regex": None, "json_schema": None, "regex": None, "ebnf": None,
            "structural_tag": None, "logit_bias": None, "stream_interval": None, "custom_params": None}


class BadRequest(Exception):
    """A request the server refuses; becomes a 400 (or ``status``) JSON error."""

    def __init__(self, message: str, status: int = 400, plain: bool = False) -> None:
        super().__init__(message)
        self.status, self.plain = status, plain


def parse_json_body(raw: bytes, *, allow_empty: bool = False) -> dict[str, Any]:
    if not raw.strip():
        if allow_empty:
            return {}
        raise BadRequest("the request body is empty; send a JSON object")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"the request body is not valid JSON ({e}); send a JSON object") from e
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def check_type(name: str, value: Any, kinds: tuple[type, ...], what: str) -> None:
    if isinstance(value, bool) and bool not in kinds:
        raise BadRequest(f"{name} must be {what}, got {value!r}")
    if not isinstance(value, kinds):
        raise BadRequest(f"{name} must be {what}, got {type(value).__name__} {value!r}")


def parse_sampling(sp: Any, *, prompt_len: int, context_length: int) -> dict[str, Any]:
    """Validate one ``sampling_params`` object for a prompt of ``prompt_len`` tokens.

    Returns ``{"sampling": SamplingParams, "n", "no_stop_trim", "skip_special_tokens"}``.
    """
    if sp is None:
        sp = {}
    if not isinstance(sp, dict):
        raise BadRequest(f"sampling_params must be an object, got {type(sp).__name__}")
    for key in sp:
        if key not in SAMPLING_KEYS:
            raise BadRequest(f"unknown field `{key}`, expected one of {', '.join(f'`{k}`' for k in SAMPLING_KEYS)}",
                             plain=True)
    for key, neutral in _NEUTRAL.items():
        if key in sp and sp[key] != neutral and sp[key] is not None:
            raise BadRequest(f"sampling_params.{key}={sp[key]!r} is not supported by agentrl serve "
                             f"(leave it out, or use SGLang on a GPU)")
    out: dict[str, Any] = {}
    ctx = context_length
    if prompt_len >= ctx:
        raise BadRequest(f"The input ({prompt_len} tokens) is longer than the model's context length "
                         f"({ctx} tokens).")
    max_new = sp.get("max_new_tokens", 128)
    if max_new is None:
        max_new = ctx - prompt_len
    check_type("sampling_params.max_new_tokens", max_new, (int,), "an integer >= 0")
    if max_new < 0:
        raise BadRequest(f"sampling_params.max_new_tokens must be >= 0, got {max_new}")
    if prompt_len + max_new > ctx:
        raise BadRequest(f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
                         f"You requested a total of {prompt_len + max_new} tokens: {prompt_len} tokens from "
                         f"the input messages and {max_new} tokens for the completion. Please reduce the "
                         "number of tokens in the input messages or the completion to fit within the limit.")
    out["max_new_tokens"] = max_new
    t = sp.get("temperature", 1.0)
    check_type("sampling_params.temperature", t, (int, float), "a number >= 0")
    if not (t >= 0 and t == t and t != float("inf")):
        raise BadRequest(f"sampling_params.temperature must be a finite number >= 0, got {t}")
    out["temperature"] = float(t)
    p = sp.get("top_p", 1.0)
    check_type("sampling_params.top_p", p, (int, float), "a number in (0, 1]")
    if not 0 < p <= 1:
        raise BadRequest(f"sampling_params.top_p must be in (0, 1], got {p}")
    out["top_p"] = float(p)
    k = sp.get("top_k", -1)
    check_type("sampling_params.top_k", k, (int,), "-1 (all) or an integer >= 1")
    if k == 0 or k < -1:
        raise BadRequest(f"sampling_params.top_k must be -1 (no cut) or >= 1, got {k}")
    out["top_k"] = k
    stop = sp.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise BadRequest("sampling_params.stop must be a string or a list of strings")
    if len(stop) > 32:
        raise BadRequest(f"sampling_params.stop holds {len(stop)} strings; at most 32 are allowed")
    out["stop"] = [s for s in stop if s]
    ids = sp.get("stop_token_ids") or []
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise BadRequest("sampling_params.stop_token_ids must be a list of token ids (integers)")
    out["stop_token_ids"] = ids
    ignore_eos = sp.get("ignore_eos", False)
    check_type("sampling_params.ignore_eos", ignore_eos, (bool,), "true or false")
    out["ignore_eos"] = ignore_eos
    seed = sp.get("sampling_seed")
    if seed is not None:
        check_type("sampling_params.sampling_seed", seed, (int,), "an integer")
    out["seed"] = seed
    n = sp.get("n", 1)
    check_type("sampling_params.n", n, (int,), "an integer >= 1")
    if n < 1:
        raise BadRequest(f"sampling_params.n must be >= 1, got {n}")
    return {"sampling": SamplingParams(**out), "n": n, "no_stop_trim": bool(sp.get("no_stop_trim", False)),
            "skip_special_tokens": sp.get("skip_special_tokens", True) is not False}


def parse_prompt_ids(value: Any, vocab_size: int, name: str = "input_ids") -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise BadRequest(f"{name} must be a list of token ids (integers)")
    if not value:
        raise BadRequest(f"{name} cannot be empty")
    bad = [i for i in value if not 0 <= i < vocab_size]
    if bad:
        raise BadRequest(f"{name} holds ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")
    return value


def finish_text(tokenizer: Any, req: EngineRequest, no_stop_trim: bool, skip_special: bool = True) -> str:
    """The output text with SGLang's stop trimming."""
    reason = req.finish_reason or {}
    return output_text(lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special), req.output_ids,
                       reason.get("type"), reason.get("matched"), no_stop_trim)


def output_text(decode: Any, ids: list[int], finish: str | None, matched: int | str | None,
                no_stop_trim: bool = False) -> str:
    """``decode(ids)`` trimmed as SGLang does: without the stop token or the text from the stop string on."""
    if finish == "stop" and isinstance(matched, int) and not isinstance(matched, bool) and not no_stop_trim and ids:
        ids = ids[:-1]
    text = decode(ids)
    if finish == "stop" and isinstance(matched, str) and matched in text:
        cut = text.index(matched)
        text = text[: cut + len(matched)] if no_stop_trim else text[:cut]
    return text


def version_spans(versions: list[str]) -> list[dict[str, Any]]:
    spans: list[dict[str, Any]] = []
    for i, v in enumerate(versions):
        if spans and spans[-1]["version"] == v:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": v, "start": i, "end": i + 1})
    return spans


def generate_result(req: EngineRequest, tokenizer: Any, *, weight_version: str, n_tokens: int | None = None,
                    return_logprob: bool = False, text_in_logprobs: bool = False,
                    no_stop_trim: bool = False, skip_special: bool = True) -> dict[str, Any]:
    """One ``/generate`` result object (final, or a cumulative stream chunk of ``n_tokens``).

    ``weight_version`` is the server's current one, reported while no token exists yet."""
    final = n_tokens is None
    n = len(req.output_ids) if final else n_tokens
    out_ids = req.output_ids[:n]
    reason = req.finish_reason if final else None
    current = req.versions[n - 1] if n else weight_version
    meta: dict[str, Any] = {"id": req.rid, "finish_reason": reason}
    queued_abort = final and reason is not None and reason.get("message") == "Abort in waiting queue"
    if not queued_abort:
        meta.update({"prompt_tokens": len(req.input_ids), "cached_tokens": req.cached_tokens,
                     "reasoning_tokens": 0})
    meta.update({"weight_version": current, "num_retractions": req.num_retractions, "completion_tokens": n})
    if final:
        meta["weight_versions"] = version_spans(req.versions)
        meta["e2e_latency"] = time.time() - req.created
    meta["response_sent_to_client_ts"] = time.time()
    if return_logprob:
        texts = [tokenizer.decode([t]) for t in out_ids] if text_in_logprobs else [None] * n
        meta["input_token_logprobs"] = []
        meta["output_token_logprobs"] = [[lp, t, s] for lp, t, s in zip(req.logprobs[:n], out_ids, texts, strict=True)]
        meta["output_token_logprobs_length"] = n
        if req.top_logprobs_num:
            meta["input_top_logprobs"] = []
            meta["output_top_logprobs"] = [[[lp, t, None] for lp, t in row] for row in req.top_logprobs[:n]]
    if final:
        text = finish_text(tokenizer, req, no_stop_trim, skip_special)
    else:
        text = tokenizer.decode(out_ids, skip_special_tokens=skip_special)
    return {"text": text, "output_ids": list(out_ids), "meta_info": meta}


def error_response(e: BadRequest) -> JSONResponse:
    if e.plain:
        return JSONResponse({"error": str(e)}, status_code=e.status)
    return JSONResponse({"error": {"message": str(e)}}, status_code=e.status)
