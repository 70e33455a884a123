"""SGLang's ``/generate`` wire format, as ``agentrl serve`` reads and writes it.

What it is: reading request bodies (JSON objects within ``--max-request-bytes`` through
``agentrl.http_edge``, prompt token ids; each failure an ``agentrl.errors.Refused`` whose message
names the field and what is allowed) and the shapes of results (``text``, ``output_ids``, ``meta_info`` with ``finish_reason``,
``output_token_logprobs`` and ``input_token_logprobs`` triples, ``weight_versions`` spans),
following sglang 0.5.23 (``python/sglang/srt/managers/io_struct.py``). The functions take the
few values they need (vocabulary size, tokenizer), not the server. What it is not: the
checks of sampling and logprob fields (``validation``), the routes (``native_routes``,
``openai_routes``) or the engine.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import Request

from agentrl import http_edge
from agentrl.errors import Refused

if TYPE_CHECKING:  # annotations only: the format itself needs no torch
    from agentrl.inference.scheduler import GenRequest


async def read_json(http: Request, limit: int, *, allow_empty: bool = False) -> dict[str, Any]:
    """The request's JSON object within ``limit`` bytes (``--max-request-bytes``); see
    ``agentrl.http_edge.read_json``."""
    return await http_edge.read_json(http, limit, "--max-request-bytes", allow_empty=allow_empty)


def check_type(name: str, value: Any, kinds: tuple[type, ...], what: str) -> None:
    if isinstance(value, bool) and bool not in kinds:
        raise Refused(f"{name} must be {what}, got {value!r}")
    if not isinstance(value, kinds):
        raise Refused(f"{name} must be {what}, got {type(value).__name__} {value!r}")


def parse_prompt_ids(value: Any, vocab_size: int, name: str = "input_ids") -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise Refused(f"{name} must be a list of token ids (integers)")
    if not value:
        raise Refused(f"{name} cannot be empty")
    bad = [i for i in value if not 0 <= i < vocab_size]
    if bad:
        raise Refused(f"{name} holds ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")
    return value


def finish_text(tokenizer: Any, req: GenRequest, no_stop_trim: bool, skip_special: bool = True,
                spaces_between_special: bool = True) -> str:
    """The output text with SGLang's stop trimming."""
    reason = req.finish_reason or {}
    return output_text(lambda ids: decode(tokenizer, ids, skip_special, spaces_between_special), req.output_ids,
                       reason.get("type"), reason.get("matched"), no_stop_trim)


def decode(tokenizer: Any, ids: list[int], skip_special: bool = True, spaces_between_special: bool = True) -> str:
    if spaces_between_special:
        return tokenizer.decode(ids, skip_special_tokens=skip_special)
    return tokenizer.decode(ids, skip_special_tokens=skip_special, spaces_between_special_tokens=False)


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


def generate_result(req: GenRequest, tokenizer: Any, *, weight_version: str, n_tokens: int | None = None,
                    return_logprob: bool = False, text_in_logprobs: bool = False,
                    no_stop_trim: bool = False, skip_special: bool = True,
                    spaces_between_special: bool = True) -> dict[str, Any]:
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
        def text(t: int) -> str | None:
            return tokenizer.decode([t]) if text_in_logprobs else None

        def tops(rows: list) -> list:
            return [None if row is None else [[lp, t, text(t)] for lp, t in row] for row in rows]
        # (empty until computed: a request aborted in the queue has none)
        given = req.input_ids[req.logprob_start:] if req.logprob_start >= 0 and req.input_logprobs else []
        meta["input_token_logprobs"] = [[lp, t, text(t)] for lp, t in zip(req.input_logprobs, given, strict=True)]
        meta["output_token_logprobs"] = [[lp, t, text(t)] for lp, t in zip(req.logprobs[:n], out_ids, strict=True)]
        meta["output_token_logprobs_length"] = n
        if req.top_logprobs_num:
            meta["input_top_logprobs"] = tops(req.input_top_logprobs)
            meta["output_top_logprobs"] = tops(req.top_logprobs[:n])
    if final:
        text = finish_text(tokenizer, req, no_stop_trim, skip_special, spaces_between_special)
    else:
        text = decode(tokenizer, out_ids, skip_special, spaces_between_special)
    return {"text": text, "output_ids": list(out_ids), "meta_info": meta}
