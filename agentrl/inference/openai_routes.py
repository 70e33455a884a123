"""The OpenAI-compatible routes of ``agentrl serve``: ``/v1/models``, ``/v1/chat/completions``,
``/v1/completions``, shaped like SGLang 0.5.23's (``protocol.py``, ``serving_chat.py``).

What it is: request translation onto the engine that ``/generate`` uses (the format itself —
request checks, message, ``tool_calls`` and ``logprobs`` shapes — is ``chat_format``, shared
with the rollout gateway). Chat prompts are
rendered with the tokenizer's own chat template (tools included); the output is read with
``agentrl.toolcalls.parse`` in the formats ``--tool-call-parser`` (default ``qwen25``:
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``) and ``--reasoning-parser``
(default none) name, as SGLang names them: reasoning into ``reasoning_content``, calls into
OpenAI ``tool_calls`` with ``finish_reason`` ``"tool_calls"``. Works with the unmodified ``openai`` SDK. Responses also carry SGLang's
``metadata.weight_version`` and, on request (``return_token_ids``), the raw token ids.
A LoRA adapter loaded by ``/load_lora_adapter`` is selected as SGLang selects it: ``model``
``"base:adapter"`` (unless that is the served name itself), else the body's ``lora_path``;
``/v1/models`` lists each adapter as a card whose ``parent`` is the served model.

What it is not: ``tool_choice`` "required" or a named function (refused with a 400),
``echo``, logit bias. When tools are offered or a reasoning parser is set and streaming is
on, ``reasoning_content`` and ``content`` stream as soon as they are final and the parsed calls
come in one delta at the end (``agentrl.toolcalls.StreamParser``); otherwise content streams
token by token.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from agentrl.errors import Refused
from agentrl.http_edge import error_response, json_body
from agentrl.ids import unique_hex
from agentrl.inference import openapi
from agentrl.inference.chat_format import (
    assistant_message,
    chat_request,
    chunk,
    keep_special_tokens,
    plain_messages,
    sampling_fields,
    sse,
    token_logprobs,
    usage,
)
from agentrl.inference.lora_adapter import LoraWeights
from agentrl.inference.request_template import render_bounded, requested_template
from agentrl.inference.scheduler import GenRequest
from agentrl.inference.state import LONG_TEXT, ServerState
from agentrl.inference.validation import LOGPROB_FIELDS, SAMPLING, parse_sampling
from agentrl.inference.wire import check_type, finish_text, parse_prompt_ids, read_json
from agentrl.toolcalls import StreamDelta, StreamParser


async def _run_all(state: ServerState, prompt: list[int], body: dict[str, Any], http: Request,
                   default_max: int | None, top_n: int) -> tuple[list[GenRequest], dict[str, Any]]:
    parsed = parse_sampling(sampling_fields(body, default_max), prompt_len=len(prompt), bounds=state.bounds)
    n = _n(state, body)
    state.admit(n)
    base = body.get("rid") if isinstance(body.get("rid"), str) else unique_hex()
    lora = _lora(state, body)
    reqs = [GenRequest(rid=base if n == 1 else f"{base}_{i}", input_ids=list(prompt), sampling=parsed["sampling"],
                       top_logprobs_num=top_n, lora=lora) for i in range(n)]
    done = await state.run_all(reqs, http)
    for r in done:
        reason = r.finish_reason or {}
        if reason.get("status_code") and reason["status_code"] >= 400:
            raise Refused(reason.get("message", "request failed"), status=reason["status_code"])
    return list(done), parsed


def _lora(state: ServerState, body: dict[str, Any]) -> LoraWeights | None:
    """The adapter a request selects: ``model`` ``"base:adapter"`` (not the served name itself),
    else ``lora_path``; None: the served weights alone."""
    model, name = body.get("model"), body.get("lora_path")
    check_type("lora_path", name, (str, type(None)), "an adapter name")
    served = state.served_model_name
    if isinstance(model, str) and ":" in model and model != served:
        # the served name itself may hold a colon (a URI): it is matched whole first, as SGLang does
        adapter = model[len(served) + 1:] if model.startswith(served + ":") else model.split(":", 1)[1]
        name = adapter.strip() or name
    return state.lora(name)


def _n(state: ServerState, body: dict[str, Any]) -> int:
    return SAMPLING["n"].read("n", body.get("n"), state.bounds)


def _chat_top_logprobs(state: ServerState, body: dict[str, Any]) -> tuple[bool, int]:
    """``logprobs`` (bool) and ``top_logprobs`` (an integer in [0, cap], only with logprobs)."""
    want = body.get("logprobs") or False
    check_type("logprobs", want, (bool,), "true or false")
    top = body.get("top_logprobs")
    if top is not None:
        top = LOGPROB_FIELDS["top_logprobs_num"].read("top_logprobs", top, state.bounds)
        if top and not want:
            raise Refused("top_logprobs needs logprobs: true")
    return want, top or 0


def _reader_deltas(delta: StreamDelta) -> list[dict[str, str]]:
    """A ``StreamParser`` delta as chunk deltas: reasoning first, then content; none when empty."""
    out = [{"reasoning_content": delta.reasoning}] if delta.reasoning else []
    return out + ([{"content": delta.content}] if delta.content else [])


def _message(text: str, reading: dict[str, Any], req: GenRequest) -> tuple[dict[str, Any], str, int | str | None]:
    return assistant_message(text, reading["use_tools"], *_finish_reason(req), tool_parser=reading["tool_parser"],
                             reasoning_parser=reading["reasoning_parser"], tools=reading["tools"])


def _finish_reason(req: GenRequest) -> tuple[str, int | str | None]:
    reason = req.finish_reason or {}
    kind = reason.get("type", "stop")
    return kind, reason.get("matched") if kind == "stop" else None


def _chat_logprobs(state: ServerState, req: GenRequest) -> dict[str, Any]:
    return token_logprobs(lambda t: state.tokenizer.decode([t]), req.output_ids, req.logprobs, req.top_logprobs)


async def _render_chat(state: ServerState, body: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
    """The prompt's ids, and how to read the answer (``assistant_message``'s keyword arguments)."""
    messages, tools, use_tools = chat_request(body)
    messages = plain_messages(messages)  # content parts as text, never their Python repr
    reading = {"use_tools": use_tools, "tool_parser": state.config.tool_call_parser,
               "reasoning_parser": state.config.reasoning_parser, "tools": tools}
    keep_special_tokens(body, state.config.tool_call_parser, state.config.reasoning_parser)
    if body.get("input_ids") is not None:
        return parse_prompt_ids(body["input_ids"], state.vocab_size), reading
    if not getattr(state.tokenizer, "chat_template", None):
        raise Refused("this model's tokenizer has no chat template; use /v1/completions or /generate")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise Refused(f"chat_template_kwargs must be an object, got {type(kwargs).__name__}")
    template = requested_template(body, kwargs, state.config.trust_request_chat_template)
    kwargs = {**kwargs, "chat_template": template} if template is not None else kwargs

    def render() -> str:
        return state.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False,
                                                   **kwargs)
    if template is not None:  # the client's template: in a child process, bounded in time and memory
        return await state.tokenize(await render_bounded(render)), reading
    try:  # a long conversation is rendered on a worker thread (the event loop keeps serving)
        long = sum(len(str(m.get("content"))) for m in messages) > LONG_TEXT
        text = await asyncio.to_thread(render) if long else render()
    except Exception as e:  # a template error is the request's fault (bad message shape)
        raise Refused(f"the chat template could not render these messages: {type(e).__name__}: "
                         f"{str(e)[:200]}") from e
    return await state.tokenize(text), reading


def openai_routes(state: ServerState) -> APIRouter:
    """The OpenAI routes over ``state``'s engine."""
    router = APIRouter()

    @router.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_card(state), *(_card(state, name) for name in state.loras)]}

    @router.get("/v1/models/{model:path}")
    async def model(model: str):
        if model != state.served_model_name and model not in state.loras:
            return JSONResponse({"error": {"message": f"The model `{model}` does not exist.",
                                           "type": "invalid_request_error", "param": "model",
                                           "code": "model_not_found"}}, status_code=404)
        return _card(state, None if model == state.served_model_name else model)

    @router.post("/v1/chat/completions", openapi_extra=json_body(openapi.chat_completion(state.bounds)))
    async def chat_completions(http: Request):
        try:
            body = await read_json(http, state.config.max_request_bytes)
            want_lp, top_n = _chat_top_logprobs(state, body)
            stream = body.get("stream") or False
            check_type("stream", stream, (bool,), "true or false")
            prompt, reading = await _render_chat(state, body)
            if stream:
                if _n(state, body) != 1:
                    raise Refused("n > 1 is not supported with stream=true by agentrl serve")
                parsed = parse_sampling(sampling_fields(body, None), prompt_len=len(prompt), bounds=state.bounds)
                lora = _lora(state, body)
                state.admit(1)
                return StreamingResponse(_chat_stream(state, body, prompt, parsed, reading, top_n, lora),
                                         media_type="text/event-stream")
            reqs, parsed = await _run_all(state, prompt, body, http, None, top_n)
        except Refused as e:
            return error_response(e)
        choices = []
        for i, r in enumerate(reqs):
            text = finish_text(state.tokenizer, r, parsed["no_stop_trim"], parsed["skip_special_tokens"])
            message, kind, matched = _message(text, reading, r)
            choice = {"index": i, "message": message, "logprobs": _chat_logprobs(state, r) if want_lp else None,
                      "finish_reason": kind, "matched_stop": matched}
            if body.get("return_token_ids"):
                choice["prompt_token_ids"], choice["response_token_ids"] = list(prompt), list(r.output_ids)
            choices.append(choice)
        return _response(state, body, reqs, prompt, "chat.completion", choices)

    @router.post("/v1/completions", openapi_extra=json_body(openapi.completion(state.bounds)))
    async def completions(http: Request):
        try:
            body = await read_json(http, state.config.max_request_bytes)
            if body.get("echo"):
                raise Refused("echo is not supported by agentrl serve")
            if body.get("stream"):
                raise Refused("stream is not supported on /v1/completions by agentrl serve; use /generate")
            prompt = body.get("prompt")
            if isinstance(prompt, str):
                if not prompt:
                    raise Refused("prompt cannot be empty")
                ids = await state.tokenize(prompt)
            elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                ids = parse_prompt_ids(prompt, state.vocab_size, "prompt")
            else:
                raise Refused("prompt must be a string or a list of token ids (one prompt per request)")
            top_n = LOGPROB_FIELDS["top_logprobs_num"].read("logprobs", body.get("logprobs"), state.bounds)
            reqs, parsed = await _run_all(state, ids, body, http, 16, top_n or 0)
        except Refused as e:
            return error_response(e)
        choices = []
        for i, r in enumerate(reqs):
            kind, matched = _finish_reason(r)
            lp = None
            if top_n is not None:
                toks = [state.tokenizer.decode([t]) for t in r.output_ids]
                lp = {"tokens": toks, "token_logprobs": list(r.logprobs),
                      "top_logprobs": [{state.tokenizer.decode([t]): v for v, t in row} for row in r.top_logprobs]
                      if top_n else None,
                      "text_offset": [sum(len(t) for t in toks[:j]) for j in range(len(toks))]}
            choices.append({"index": i, "text": finish_text(state.tokenizer, r, parsed["no_stop_trim"]), "logprobs": lp,
                            "finish_reason": kind, "matched_stop": matched})
        return _response(state, body, reqs, ids, "text_completion", choices)

    return router

def _card(state: ServerState, lora: str | None = None) -> dict[str, Any]:
    """The served model's card, or a loaded adapter's (``root``: its directory, ``parent``: the served model)."""
    base = state.served_model_name
    return {"id": lora or base, "object": "model", "created": int(state.started), "owned_by": "sglang",
            "root": state.loras[lora].path if lora else base, "parent": base if lora else None,
            "max_model_len": state.scheduler.context_length}


def _response(state: ServerState, body, reqs, prompt, obj: str, choices) -> dict[str, Any]:
    completion = sum(len(r.output_ids) for r in reqs)
    versions = reqs[0].versions if reqs else []
    return {"id": reqs[0].rid, "object": obj, "created": int(time.time()),
            "model": body.get("model") or state.served_model_name, "choices": choices,
            "usage": usage(len(prompt), completion),
            "metadata": {"weight_version": versions[-1] if versions else state.scheduler.weight_version}}


async def _chat_stream(state: ServerState, body, prompt, parsed, reading: dict[str, Any], top_n: int,
                       lora: LoraWeights | None):
    """``chat.completion.chunk`` events (one choice; the request was validated before). Without
    tools or a reasoning parser, content streams token by token. With them, the reply is read as
    it comes (``agentrl.toolcalls.StreamParser``): ``reasoning_content`` and ``content`` deltas as
    soon as they are final, the calls in one delta at the end; a request with stop strings or
    stop patterns is read whole at the end (the text they cut is known only then)."""
    req = GenRequest(rid=unique_hex(), input_ids=list(prompt), sampling=parsed["sampling"],
                     top_logprobs_num=top_n, lora=lora)
    base = {"id": req.rid, "created": int(time.time()), "model": body.get("model") or state.served_model_name}
    yield sse(chunk(base, {"role": "assistant", "content": ""}))
    reads = reading["use_tools"] or reading["reasoning_parser"] is not None
    reader = StreamParser(reading["tool_parser"], reading["reasoning_parser"], reading["tools"]) \
        if reads and not (req.sampling.stop or req.sampling.stop_regex) else None
    skip_special = parsed["skip_special_tokens"]
    sent = ""
    async for n, finished in state.stream(req):
        if finished:
            break
        if not reads or reader is not None:  # the last token is held back: it may be the stop token
            text = state.tokenizer.decode(req.output_ids[:n] if not reads else req.output_ids[:n - 1],
                                          skip_special_tokens=skip_special if reads else True)
            if text.startswith(sent) and len(text) > len(sent) and "\ufffd" not in text[len(sent):]:
                if reader is None:
                    yield sse(chunk(base, {"content": text[len(sent):]}))
                else:
                    for delta in _reader_deltas(reader.feed(text[len(sent):])):
                        yield sse(chunk(base, delta))
                sent = text
    text = finish_text(state.tokenizer, req, parsed["no_stop_trim"], parsed["skip_special_tokens"])
    delta: dict[str, Any] = {}
    if reads:
        message, kind, matched = _message(text, reading, req)
        if reader is not None:
            if text.startswith(sent):  # else what streamed stands: it cannot be taken back
                for part in (reader.feed(text[len(sent):]), reader.close()[0]):  # the held-back tail, then the rest
                    for d in _reader_deltas(part):
                        yield sse(chunk(base, d))
            if message.get("tool_calls"):
                delta = {"tool_calls": message["tool_calls"]}
        else:  # read whole: reasoning, content and calls in one delta
            delta = {k: message[k] for k in ("reasoning_content", "content", "tool_calls")
                     if message.get(k) is not None}
    else:
        kind, matched = _finish_reason(req)
        if text.startswith(sent) and len(text) > len(sent):
            delta["content"] = text[len(sent):]
    if delta:
        yield sse(chunk(base, delta))
    yield sse(chunk(base, {}, kind, matched))
    yield sse("[DONE]")
