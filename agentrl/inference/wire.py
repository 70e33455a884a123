"""SGLang's ``/generate`` wire format, as ``agentrl serve`` reads and writes it.

What it is: reading request bodies (JSON objects within a size limit, prompt token ids; each
failure a ``BadRequest`` whose message names the field and what is allowed) and the shapes
of results (``text``, ``output_ids``, ``meta_info`` with ``finish_reason``,
``output_token_logprobs`` and ``input_token_logprobs`` triples, ``weight_versions`` spans),
following sglang 0.5.23 (``python/sglang/srt/managers/io_struct.py``). The functions take the
few values they need (vocabulary size, tokenizer), not the server. What it is not: the
checks of sampling and logprob fields (``validation``), the routes (``native_routes``,
``openai_routes``) or the engine.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import JSONResponse

if TYPE_CHECKING:  # annotations only: the format itself needs no torch
    from agentrl.inference.scheduler import GenRequest

class BadRequest(Exception):
    """A request the server refuses; becomes a 400 (or ``status``) JSON error."""

    def __init__(self, message: str, status: int = 400, plain: bool = False) -> None:
        super().__init__(message)
        self.status, self.plain = status, plain


LARGE_BODY = 1 << 20
"""Bodies above this many bytes are parsed on a worker thread (the event loop keeps serving)."""


async def read_json(http: Request, limit: int, *, allow_empty: bool = False) -> dict[str, Any]:
    """The request's JSON object; a body over ``limit`` bytes is refused (413) as soon as it
    is seen to be, without reading the rest."""
    length = http.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise BadRequest(f"the request body is {length} bytes, above this server's limit of {limit} "
                         "(--max-request-bytes)", status=413)
    data = bytearray()
    async for chunk in http.stream():
        data += chunk
        if len(data) > limit:
            raise BadRequest(f"the request body is over this server's limit of {limit} bytes "
                             "(--max-request-bytes)", status=413)
    if len(data) > LARGE_BODY:
        return await asyncio.to_thread(parse_json_body, bytes(data), allow_empty=allow_empty)
    return parse_json_body(bytes(data), allow_empty=allow_empty)


SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate: half of a pair (valid), or alone (no Unicode text)."""


def parse_json_body(raw: bytes, *, allow_empty: bool = False) -> dict[str, Any]:
    """The JSON object in ``raw``, or a ``BadRequest``: not UTF-8, not JSON, an integer of more
    than 4,300 digits (Python's limit), nesting deeper than the parser's recursion limit, a
    lone surrogate escape (``"\\ud800"``: a string no UTF-8 answer could echo), not an object."""
    if not raw.strip():
        if allow_empty:
            return {}
        raise BadRequest("the request body is empty; send a JSON object")
    try:
        body = json.loads(raw)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer too long to convert
        raise BadRequest(f"the request body is not valid JSON ({e}); send a JSON object") from e
    except RecursionError:
        raise BadRequest("the request body is not valid JSON (nested too deeply); send a JSON object") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, got {type(body).__name__}")
    if SURROGATE_ESCAPE.search(raw):  # rare: look whether a surrogate came without its pair
        try:
            json.dumps(body, ensure_ascii=False).encode()
        except (UnicodeEncodeError, RecursionError):
            raise BadRequest("the request body holds a lone surrogate escape (one of \\ud800-\\udfff without "
                             "its pair), which is not Unicode text; send valid Unicode") from None
    return body


def check_type(name: str, value: Any, kinds: tuple[type, ...], what: str) -> None:
    if isinstance(value, bool) and bool not in kinds:
        raise BadRequest(f"{name} must be {what}, got {value!r}")
    if not isinstance(value, kinds):
        raise BadRequest(f"{name} must be {what}, got {type(value).__name__} {value!r}")


def parse_prompt_ids(value: Any, vocab_size: int, name: str = "input_ids") -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise BadRequest(f"{name} must be a list of token ids (integers)")
    if not value:
        raise BadRequest(f"{name} cannot be empty")
    bad = [i for i in value if not 0 <= i < vocab_size]
    if bad:
        raise BadRequest(f"{name} holds ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")
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


def error_response(e: BadRequest) -> JSONResponse:
    if e.plain:
        return JSONResponse({"error": str(e)}, status_code=e.status)
    return JSONResponse({"error": {"message": str(e)}}, status_code=e.status)
