"""SGLang's native routes of ``agentrl serve``, as one FastAPI router.

What it is: ``native_routes(state)`` — ``POST /generate`` (single, batched, ``n`` > 1,
streamed), ``/pause_generation``, ``/continue_generation``, ``/abort_request``,
``/update_weights_from_disk``, ``/update_weight_version``, ``/load_lora_adapter``,
``/unload_lora_adapter`` (a request's ``lora_path`` names a loaded adapter, applied to its
rows at run time: ``Decoder.forward``), ``GET|POST /flush_cache``,
``/release_memory_occupation`` and ``/resume_memory_occupation`` (colocated training:
``agentrl.api.MEMORY_TAGS`` says what each tag frees here),
``GET /model_info`` (+ ``/get_model_info``), ``/server_info`` (+ ``/get_server_info``),
``/health``, ``/health_generate``, ``/ready``, ``/v1/loads``, ``/get_load`` (0.5.10's, which
sglang-router polls) — with SGLang's field names and response shapes (``agentrl.inference.server``
lists where we knowingly differ). ``/flush_cache`` empties the prefix cache; ``/get_server_info``
and ``/v1/loads`` report its hit rate. Validation and result shapes come from
``agentrl.inference.wire``. What it is not: the OpenAI routes (``openai_routes``).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from agentrl.api import SamplingParams
from agentrl.errors import ModelError, Refused
from agentrl.http_edge import body_schema, json_body, parse_body
from agentrl.ids import unique_hex
from agentrl.inference import openapi
from agentrl.inference.control_bodies import (
    AbortRequest,
    LoadLoraAdapter,
    MemoryOccupation,
    PauseGeneration,
    UnloadLoraAdapter,
    UpdateWeightsFromDisk,
    UpdateWeightVersion,
)
from agentrl.inference.scheduler import GenRequest
from agentrl.inference.state import ServerState
from agentrl.inference.validation import parse_logprob_fields, parse_sampling
from agentrl.inference.wire import (
    check_type,
    generate_result,
    parse_prompt_ids,
    read_json,
)

SGLANG_API_VERSION = "0.5.23"
HEALTH_CHECK_TIMEOUT_S = 20.0

T = TypeVar("T")


def native_routes(state: ServerState) -> APIRouter:
    """SGLang's native HTTP API over ``state``'s engine, in three groups: generation (``/generate``,
    pause, continue, abort), weights and memory (disk updates, the version label, the cache, memory
    release), LoRA adapters, and information (model and server info, health, load)."""
    router = APIRouter()
    generation_routes(router, state)
    weight_routes(router, state)
    adapter_routes(router, state)
    info_routes(router, state)
    return router


async def control_body(state: ServerState, cls: type[T], http: Request, *, allow_empty: bool = False) -> T:
    """A control route's body, checked against its declaration (``control_bodies``)."""
    raw = await read_json(http, state.config.max_request_bytes, allow_empty=allow_empty)
    return parse_body(cls, raw, status=400, sglang=True)


def generation_routes(router: APIRouter, state: ServerState) -> None:
    """``/generate`` (POST and PUT), ``/pause_generation``, ``/continue_generation``, ``/abort_request``."""
    generate_body = json_body(openapi.generate(state.bounds))

    @router.post("/generate", openapi_extra=generate_body)
    @router.put("/generate", openapi_extra=generate_body, operation_id="generate_put")
    async def generate(http: Request):
        body = await read_json(http, state.config.max_request_bytes)
        return await _generate(state, body, http)

    @router.post("/pause_generation", openapi_extra=json_body(body_schema(PauseGeneration), required=False))
    async def pause_generation(http: Request):
        body = await control_body(state, PauseGeneration, http, allow_empty=True)
        await asyncio.wrap_future(state.scheduler.pause(body.mode))
        await asyncio.sleep(0)  # let the aborted requests' handlers answer first
        return {"message": "Generation paused successfully.", "status": "ok"}

    @router.post("/continue_generation", openapi_extra=json_body({"type": "object"}, required=False))
    async def continue_generation(http: Request):
        await read_json(http, state.config.max_request_bytes, allow_empty=True)
        await asyncio.wrap_future(state.scheduler.resume())
        return {"message": "Generation continued successfully.", "status": "ok"}

    @router.post("/abort_request", openapi_extra=json_body(body_schema(AbortRequest), required=False))
    async def abort_request(http: Request):
        body = await control_body(state, AbortRequest, http, allow_empty=True)
        state.scheduler.abort(body.rid, body.abort_all)
        return Response(status_code=200)


def weight_routes(router: APIRouter, state: ServerState) -> None:
    """``/update_weights_from_disk``, ``/update_weight_version``, ``/flush_cache``,
    ``/release_memory_occupation``, ``/resume_memory_occupation``."""
    @router.post("/update_weights_from_disk", openapi_extra=json_body(body_schema(UpdateWeightsFromDisk)))
    async def update_weights_from_disk(http: Request):
        raw = await read_json(http, state.config.max_request_bytes)
        version, abort_all = update_options(raw)
        body = parse_body(UpdateWeightsFromDisk, {**raw, "weight_version": version}, status=400, sglang=True)
        path = body.model_path
        if not path:
            raise Refused("model_path is required: the directory of an HF checkpoint to load")
        if body.agentrl_stage_only and (version is not None or abort_all):
            raise Refused("weight_version and abort_all_requests go with the update that serves the staged weights, "
                          "not with agentrl_stage_only")
        async with state.weight_lock:  # one staging copy at a time
            staged = state.take_staged(path)
            try:
                weights = staged or await asyncio.to_thread(state.decoder.prepare_weights, path)
            except (ModelError, OSError) as e:
                return JSONResponse({"success": False, "message": f"Failed to update weights: {e}",
                                     "num_paused_requests": 0}, status_code=400)
            if body.agentrl_stage_only:
                state.stage(path, weights)
                return {"success": True, "message": "Staged the weights; /update_weights_from_disk with the same "
                                                    "model_path serves them.", "num_paused_requests": 0}
            await asyncio.wrap_future(state.scheduler.install_weights(weights, version, abort_all))
        state.model_path = path
        message = "Succeeded to update model weights" + (" (staged before)." if staged else ".")
        if version is not None:
            message += f" Weight version updated to {version}."
        return {"success": True, "message": message, "num_paused_requests": 0}

    @router.post("/update_weight_version", openapi_extra=json_body(body_schema(UpdateWeightVersion)))
    async def update_weight_version(http: Request):
        body = await control_body(state, UpdateWeightVersion, http)
        new = body.new_version
        if not new:
            raise Refused("new_version is required (a non-empty string)")
        if body.abort_all_requests:
            state.scheduler.abort(abort_all=True)
        await asyncio.wrap_future(state.scheduler.install_weights(state.decoder.weights, new))
        return {"success": True, "message": f"Weight version updated to {new}", "new_version": new}

    @router.get("/flush_cache")
    @router.post("/flush_cache", operation_id="flush_cache_post")
    async def flush_cache():
        if not await asyncio.wrap_future(state.scheduler.flush_cache()):
            return PlainTextResponse(
                "Cache not flushed. Please check the server log for details. (There are running or "
                "waiting requests.)", status_code=400)
        return PlainTextResponse("Cache flushed.\nPlease check backend logs for more details. "
                                 "(When there are running or waiting requests, the operation will not be performed.)\n")

    memory_body = json_body(body_schema(MemoryOccupation), required=False)

    async def memory_tags(http: Request) -> set[str]:
        if http.method == "GET":
            return MemoryOccupation().chosen()
        return (await control_body(state, MemoryOccupation, http, allow_empty=True)).chosen()

    @router.get("/release_memory_occupation")
    @router.post("/release_memory_occupation", openapi_extra=memory_body, operation_id="release_memory_post")
    async def release_memory_occupation(http: Request):
        await asyncio.wrap_future(state.scheduler.release_memory(await memory_tags(http)))
        return None  # SGLang's handler answers nothing: 200, null

    @router.get("/resume_memory_occupation")
    @router.post("/resume_memory_occupation", openapi_extra=memory_body, operation_id="resume_memory_post")
    async def resume_memory_occupation(http: Request):
        await asyncio.wrap_future(state.scheduler.resume_memory(await memory_tags(http)))
        return None


def adapter_routes(router: APIRouter, state: ServerState) -> None:
    """``/load_lora_adapter`` and ``/unload_lora_adapter`` (read from disk off the worker pool:
    ``ServerState.read_adapter_files``)."""
    @router.post("/load_lora_adapter", openapi_extra=json_body(body_schema(LoadLoraAdapter)))
    async def load_lora_adapter(http: Request):
        body = await control_body(state, LoadLoraAdapter, http)
        name, path = body.lora_name, body.lora_path
        if not name or not path:
            raise Refused("lora_name and lora_path are required: a name for the adapter and its directory")
        taken = f"Failed to load LoRA adapter {name[:200]} because it is already loaded (unload it first)"
        if name in state.loras:
            return JSONResponse(_lora_update(state, taken), status_code=400)
        try:
            lora = await state.read_adapter_files(state.decoder.load_adapter, path, name)
        except (ModelError, OSError) as e:
            return JSONResponse(_lora_update(state, f"Failed to load LoRA adapter {name[:200]}: {e}"), status_code=400)
        if name in state.loras:  # loaded under this name meanwhile
            return JSONResponse(_lora_update(state, taken), status_code=400)
        state.loras[name] = lora
        return _lora_update(state)

    @router.post("/unload_lora_adapter", openapi_extra=json_body(body_schema(UnloadLoraAdapter)))
    async def unload_lora_adapter(http: Request):
        body = await control_body(state, UnloadLoraAdapter, http)
        if state.loras.pop(body.lora_name, None) is None:
            return JSONResponse(_lora_update(state, f"LoRA with name {body.lora_name[:200]} does not exist. Loaded "
                                                    f"LoRAs: {sorted(state.loras)}"), status_code=400)
        return _lora_update(state)


def info_routes(router: APIRouter, state: ServerState) -> None:
    """``/model_info``, ``/server_info`` (and their ``get_`` names), ``/health``, ``/health_generate``,
    ``/ready``, ``/get_load``, ``/v1/loads``."""
    @router.get("/model_info")
    @router.get("/get_model_info")
    async def model_info():
        return {"model_path": state.model_path, "served_model_name": state.served_model_name,
                "tokenizer_path": state.config.model, "is_generation": True, "preferred_sampling_params": None,
                "weight_version": state.scheduler.weight_version, "load_format": "auto", "reasoning_parser": None,
                "tool_call_parser": "qwen25", "disaggregation_mode": "null", "has_image_understanding": False,
                "has_audio_understanding": False, "model_type": state.model_type,
                "architectures": state.architectures}

    @router.get("/server_info")
    @router.get("/get_server_info")
    async def server_info():
        c = state.config
        load = state.scheduler.load()
        return {"model_path": c.model, "tokenizer_path": c.model, "served_model_name": state.served_model_name,
                "host": c.host, "port": c.port, "device": c.device, "tp_size": 1, "dp_size": 1,
                "context_length": state.scheduler.context_length, "max_running_requests": c.max_running_requests,
                "max_total_num_tokens": state.scheduler.context_length * c.max_running_requests,
                "max_req_input_len": state.scheduler.context_length - 1, "skip_tokenizer_init": False,
                "incremental_streaming_output": False, "weight_version": state.scheduler.weight_version,
                "disable_radix_cache": state.scheduler.cache is None, "random_seed": c.seed, "status": "ready",
                "enable_deterministic_inference": state.decoder.batch_invariant,
                "internal_states": [{**load, **state.scheduler.cache_stats(), "last_gen_throughput": 0.0,
                                     "num_decode_steps": state.scheduler.steps,
                                     "num_generated_tokens": state.scheduler.generated_tokens,
                                     "num_prefill_calls": state.scheduler.prefill_calls,
                                     "prefill_seconds": round(state.scheduler.prefill_s, 3),
                                     "decode_seconds": round(state.scheduler.decode_s, 3),
                                     "effective_max_running_requests_per_dp": c.max_running_requests,
                                     # SGLang's key (GB); ours adds the spare weight copies
                                     "memory_usage": {k: round(v / 2 ** 30, 6)
                                                      for k, v in state.decoder.memory_bytes().items()}}],
                "version": f"{SGLANG_API_VERSION} (agentrl serve)", "frontend": "python",
                # ours: buckets can be staged while generating, then committed (weight_sync)
                "agentrl_staged_weight_updates": True,
                "startup_time": state.started}

    @router.get("/health")
    async def health():
        return Response(status_code=200 if state.scheduler.alive else 503)

    @router.get("/health_generate")
    async def health_generate():
        req = GenRequest(rid=f"HEALTH_CHECK_{unique_hex()}", input_ids=[0],
                            sampling=SamplingParams(max_new_tokens=1, temperature=0.0))
        try:
            async with asyncio.timeout(HEALTH_CHECK_TIMEOUT_S):
                await state.run(req)
        except TimeoutError:
            state.scheduler.abort(req.rid)
            return Response(status_code=503)
        return Response(status_code=200)

    @router.get("/ready")
    async def ready():
        return Response(status_code=503 if state.scheduler.paused else 200)

    @router.get("/get_load")
    async def get_load():
        # SGLang 0.5.10's shape, one entry per data-parallel rank; sglang-router polls it for its
        # load-aware policies and GET /get_loads (num_tokens: prompt + output of running requests)
        load = state.scheduler.load()
        return [{"dp_rank": 0, "num_reqs": load["num_running_reqs"] + load["num_waiting_reqs"],
                 "num_waiting_reqs": load["num_waiting_reqs"], "num_tokens": state.scheduler.tokens_in_use()}]

    @router.get("/v1/loads")
    async def loads():
        load = state.scheduler.load()
        return {"timestamp": time.time(), "version": SGLANG_API_VERSION, "accelerator": state.config.device,
                "num_accelerators": 1,
                "loads": [{"dp_rank": 0, **load, "num_used_tokens": 0,
                           "max_total_num_tokens": state.scheduler.context_length * state.config.max_running_requests,
                           "token_usage": 0.0, "gen_throughput": 0.0,
                           "cache_hit_rate": state.scheduler.cache_stats()["cache_hit_rate"]}]}


UNSUPPORTED = ("input_embeds", "image_data", "video_data", "audio_data", "session_id",
               "session_params", "custom_logit_processor", "token_ids_logprob", "return_hidden_states",
               "return_routed_experts")


def _lora_update(state: ServerState, error: str | None = None) -> dict[str, Any]:
    """SGLang's answer to a LoRA load or unload (``LoRAUpdateOutput``)."""
    return {"success": error is None, "error_message": error,
            "loaded_adapters": {name: lora.path for name, lora in state.loras.items()}}


def lora_names(value: Any, count: int, batch: bool) -> list[str | None]:
    """A ``/generate`` body's ``lora_path``, one adapter name (or None) per prompt: a name for
    all, or (a batch) a list of one name or null per prompt."""
    if value is None or isinstance(value, str):
        return [value] * count
    if (batch and isinstance(value, list) and len(value) == count
            and all(v is None or isinstance(v, str) for v in value)):
        return list(value)
    raise Refused(f"lora_path must be an adapter name (a string), or for a batch of {count} prompts a list of "
                  f"{count} names or nulls")


def update_options(body: dict[str, Any]) -> tuple[str | None, bool]:
    """A weight update's ``weight_version`` (None: unchanged) and ``abort_all_requests``."""
    version = body.get("weight_version")
    if version is not None and (not isinstance(version, (str, int)) or isinstance(version, bool)):
        raise Refused(f"weight_version must be a string, got {type(version).__name__}")
    abort_all = body.get("abort_all_requests") or False
    check_type("abort_all_requests", abort_all, (bool,), "true or false")
    return None if version is None else str(version), abort_all


async def _prompts(state: ServerState, body: dict[str, Any]) -> tuple[list[list[int]], bool]:
    """The prompts of a ``/generate`` body as token ids, and whether it is a batch."""
    if (body.get("text") is None) == (body.get("input_ids") is None):
        raise Refused("Either text or input_ids should be provided (exactly one of them).")
    if body.get("text") is not None:
        texts = body["text"]
        batch = isinstance(texts, list)
        texts = texts if batch else [texts]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise Refused("text must be a string or a non-empty list of strings")
        prompts = []
        for t in texts:  # a group's copies of one prompt are tokenized once
            prompts.append(prompts[-1] if prompts and t == texts[len(prompts) - 1] else await state.tokenize(t))
        if any(not p for p in prompts):
            raise Refused("text cannot be empty")
        return prompts, batch
    ids = body["input_ids"]
    batch = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
    prompts = []
    for p in ids if batch else [ids]:  # a group's copies of one prompt are checked once
        prompts.append(prompts[-1] if prompts and p == prompts[-1] else parse_prompt_ids(p, state.vocab_size))
    return prompts, batch


async def _generate(state: ServerState, body: dict[str, Any], http: Request):
    for key in UNSUPPORTED:
        if body.get(key) not in (None, False):
            raise Refused(f"{key} is not supported by agentrl serve (leave it out, or use SGLang on a GPU)")
    stream = body.get("stream") or False
    check_type("stream", stream, (bool,), "true or false")
    prompts, batch = await _prompts(state, body)
    sps = body.get("sampling_params")
    if isinstance(sps, list):
        if not batch or len(sps) != len(prompts):
            raise Refused(f"sampling_params is a list of {len(sps)} but there are {len(prompts)} prompts")
    else:
        sps = [sps] * len(prompts)
    parsed: list[dict[str, Any]] = []
    for i, (sp, p) in enumerate(zip(sps, prompts, strict=True)):  # equal neighbours are parsed once
        same = i and sp == sps[i - 1] and len(p) == len(prompts[i - 1])
        parsed.append(parsed[-1] if same else parse_sampling(sp, prompt_len=len(p), bounds=state.bounds))
    n = parsed[0]["n"]
    if any(p["n"] != n for p in parsed):
        raise Refused("all sampling_params of a batch must have the same n")
    logprob = parse_logprob_fields(body, [len(p) for p in prompts], state.bounds)
    loras = [state.lora(name) for name in lora_names(body.get("lora_path"), len(prompts), batch)]
    rid = body.get("rid")
    expanded = batch or n > 1
    if rid is None:
        rids = [unique_hex() for _ in range(len(prompts) * n)]
    elif isinstance(rid, str):
        if n > 1:
            rids = [unique_hex() for _ in range(len(prompts) * n)]
        else:
            rids = [f"{rid}_{i}" for i in range(len(prompts))] if batch else [rid]
    elif isinstance(rid, list) and len(rid) == len(prompts) and all(isinstance(r, str) for r in rid) and n == 1:
        rids = list(rid)
    else:
        raise Refused("rid must be a string, or a list of strings with one per prompt (and n == 1)")
    if len(set(rids)) != len(rids):
        raise Refused("rid holds the same id twice; request ids must be unique")
    for r in rids:
        if state.scheduler.is_live(r):
            raise Refused(f"Duplicate request ID detected: {r}")
    state.admit(len(rids))
    reqs, opts = [], []
    for i, (prompt, p, lp, lora) in enumerate(zip(prompts, parsed, logprob, loras, strict=True)):
        for j in range(n):
            reqs.append(GenRequest(rid=rids[i * n + j], input_ids=list(prompt), sampling=p["sampling"],
                                   top_logprobs_num=lp["top_n"], logprob_start=lp["logprob_start"],
                                   stream_interval=p["stream_interval"], lora=lora))
            opts.append({**p, **lp})
    text_in_logprobs = bool(body.get("return_text_in_logprobs"))
    if stream:
        return StreamingResponse(_sse(state, reqs, opts, text_in_logprobs, expanded), media_type="text/event-stream")
    done = await state.run_all(reqs, http)
    for r in done:
        reason = r.finish_reason or {}
        if reason.get("status_code") and reason["status_code"] >= 400 and len(done) == 1:
            raise Refused(reason.get("message", "request failed"), status=reason["status_code"])
    results = [_result(state, r, o, text_in_logprobs) for r, o in zip(done, opts, strict=True)]
    # a JSONResponse skips FastAPI's jsonable_encoder walk (plain dicts and lists already)
    return JSONResponse(results if expanded else results[0])


def _result(state: ServerState, r: GenRequest, o: dict[str, Any], text_in_logprobs: bool,
            n_tokens: int | None = None) -> dict[str, Any]:
    return generate_result(r, state.tokenizer, weight_version=state.scheduler.weight_version, n_tokens=n_tokens,
                           return_logprob=o["return_logprob"], text_in_logprobs=text_in_logprobs,
                           no_stop_trim=o["no_stop_trim"], skip_special=o["skip_special_tokens"],
                           spaces_between_special=o["spaces_between_special_tokens"])


async def _sse(state: ServerState, reqs, opts, text_in_logprobs: bool, expanded: bool):
    """Cumulative SSE chunks (SGLang's default), ``index`` per chunk for batches, then [DONE]."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, r: GenRequest) -> None:
        async for n, fin in state.stream(r):
            await queue.put((i, r, None if fin else n))
        await queue.put((i, None, None))

    tasks = [asyncio.create_task(pump(i, r)) for i, r in enumerate(reqs)]
    remaining = len(reqs)
    try:
        while remaining:
            i, r, n = await queue.get()
            if r is None:
                remaining -= 1
                continue
            chunk = _result(state, r, opts[i], text_in_logprobs, n)
            if expanded:
                chunk["index"] = i
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        for t in tasks:
            t.cancel()
