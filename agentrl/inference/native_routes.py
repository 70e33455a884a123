"""``agentrl serve``: an HTTP server that answers like SGLang, backed by the embedded engine.

What it is: a FastAPI app exposing SGLang's native routes with SGLang's field names and
response shapes, so that a client tested against it is tested against SGLang:
``POST /generate``, ``/pause_generation``, ``/continue_generation``, ``/abort_request``,
``/update_weights_from_disk``, ``/update_weight_version``, ``GET|POST /flush_cache``,
``GET /model_info`` (+ ``/get_model_info``), ``/server_info`` (+ ``/get_server_info``),
``/health``, ``/health_generate``, ``/ready``, ``/v1/loads``; the OpenAI routes live in
``agentrl.openai_server``, request validation and result shapes in ``agentrl.protocol``. The engine (``agentrl.engine``) runs on its own thread; handlers
only await its news, so the event loop never blocks on the model.

Matched version: **sglang 0.5.23** (``http_server.py``, ``io_struct.py``, ``api_types.py``),
as written down in SGLANG_API.md. Deliberate choices and 0.5.10 differences:
  * unknown ``sampling_params`` keys are rejected with 400 ``{"error": "unknown field ..."}``
    (0.5.23's contract; 0.5.10 answered 500); unknown top-level keys are ignored (both);
  * ``meta_info.num_retractions`` (0.5.10 called it ``total_retractions``; ``agentrl.inference``
    reads either) and ``meta_info.weight_versions`` spans (0.5.23 only; the client falls back
    to ``weight_version``);
  * a weight update swaps weights between two decode steps instead of waiting on SGLang's
    writer lock; with the client's pause (abort) first, as DESIGN.md §4 orders, the two are
    indistinguishable;
  * logprobs are those of the distribution actually sampled from (after temperature, top-k,
    top-p; 0.0 for greedy), see ``agentrl.sampling``; SGLang reports them before the top-k/p
    filter. Input (prompt) logprobs (``logprob_start_len >= 0``), penalties, min-p, grammars,
    LoRA, sessions and multimodal inputs are refused with a 400 that says so;
  * no prefix cache: ``cached_tokens`` is always 0 and ``/flush_cache`` only checks idleness.

Trust boundary: the server is meant for localhost and trusted networks. Covered: every
malformed or out-of-range request gets a 4xx JSON error naming the field, never a 500 or a
hang; a client that disconnects frees its slot. Not covered: authentication, rate limits,
request-size limits beyond the model's context length.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from agentrl.config import option
from agentrl.engine import Engine
from agentrl.engine import Request as EngineRequest
from agentrl.errors import ModelError
from agentrl.protocol import (
    BadRequest,
    check_type,
    error_response,
    generate_result,
    parse_json_body,
    parse_prompt_ids,
    parse_sampling,
)

log = logging.getLogger(__name__)

SGLANG_API_VERSION = "0.5.23"
HEALTH_CHECK_TIMEOUT_S = 20.0

@dataclass
class ServeConfig:
    """Settings of one ``agentrl serve`` process (the CLI flags)."""

    model: str = option(help="Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer)")
    host: str = option("127.0.0.1", help="address to listen on")
    port: int = option(30000, help="port to listen on (SGLang's default)", ge=0, le=65535)
    device: str = option("cpu", help="where the model runs", choices=("cpu", "cuda"))
    max_running_requests: int = option(64, help="KV-cache slots: requests decoded together", ge=1)
    context_length: int | None = option(
        None, help="longest prompt + output in tokens; default min(model's max positions, 4096)", ge=2)
    threads: int | None = option(None, help="torch CPU threads (default: torch's choice)", ge=1)
    weight_version: str = option("default", help="initial weight version (SGLang's --weight-version)")
    served_model_name: str | None = option(None, help="model id in /v1/models (default: the model path)")
    seed: int = option(0, help="seed of the engine's RNG for requests without a sampling_seed")


class ServerState:
    """What the route handlers share: the engine, the tokenizer and the served model's facts."""

    def __init__(self, config: ServeConfig) -> None:
        import torch
        from transformers import AutoTokenizer, GenerationConfig

        from agentrl.decoder import Decoder, read_config

        if config.threads:
            torch.set_num_threads(config.threads)
        self.config = config
        self.model_path = config.model
        hf_config = read_config(config.model)
        context = config.context_length or min(hf_config.max_position_embeddings, 4096)
        self.decoder = Decoder(config.model, num_slots=config.max_running_requests, max_len=context,
                               device=config.device)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(config.model)
        except Exception as e:
            raise ModelError(f"{config.model}: cannot load its tokenizer ({e})") from e
        eos: set[int] = set()
        for source in (hf_config, _generation_config(GenerationConfig, config.model)):
            ids = getattr(source, "eos_token_id", None) if source is not None else None
            eos.update([ids] if isinstance(ids, int) else list(ids or []))
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = eos
        self.vocab_size = hf_config.vocab_size
        self.model_type = hf_config.model_type
        self.architectures = list(getattr(hf_config, "architectures", None) or [])
        self.engine = Engine(self.decoder, eos_token_ids=eos, decode_text=self.decode,
                             weight_version=config.weight_version, seed=config.seed)
        self.started = time.time()

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @property
    def served_model_name(self) -> str:
        return self.config.served_model_name or self.model_path

    async def run(self, req: EngineRequest, http: Request | None = None) -> EngineRequest:
        """Submit and wait until finished; a disconnected client aborts the request."""
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        req.notify = lambda r, fin: loop.call_soon_threadsafe(done.set) if fin else None
        self.engine.submit(req)
        try:
            while not done.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await done.wait()
                if not done.is_set() and http is not None and await http.is_disconnected():
                    self.engine.abort(req.rid, message="client disconnected")
                    await done.wait()
        except asyncio.CancelledError:
            self.engine.abort(req.rid, message="client disconnected")
            raise
        return req

    async def stream(self, req: EngineRequest):
        """Yield ``(num_tokens, finished)`` as the engine produces tokens; abort if abandoned."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[int, bool]] = asyncio.Queue()
        req.stream = True
        req.notify = lambda r, fin: loop.call_soon_threadsafe(events.put_nowait, (len(r.output_ids), fin))
        self.engine.submit(req)
        finished = False
        try:
            while not finished:
                n, finished = await events.get()
                while not events.empty() and not finished:  # coalesce a backlog
                    n, finished = events.get_nowait()
                yield n, finished
        finally:
            if not finished:
                self.engine.abort(req.rid, message="client disconnected")


def _generation_config(cls, path: str):
    try:
        return cls.from_pretrained(path)
    except Exception:  # a checkpoint without generation_config.json is fine
        return None


# ----------------------------------------------------------------------------- app


def build_app(config: ServeConfig, state: ServerState | None = None) -> FastAPI:
    """The FastAPI app; the engine thread starts and stops with the app's lifespan."""
    state = state or ServerState(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        state.engine.start()
        try:
            yield
        finally:
            state.engine.shutdown()

    app = FastAPI(title="agentrl serve", lifespan=lifespan)
    app.state.server = state

    @app.exception_handler(BadRequest)
    async def _bad(_: Request, e: BadRequest):
        return error_response(e)

    @app.exception_handler(Exception)
    async def _internal(_: Request, e: Exception):
        log.exception("internal error")
        return JSONResponse({"error": {"message": f"internal error: {e!r}"}}, status_code=500)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError):
        return JSONResponse({"object": "error", "message": str(e.errors()), "type": "Bad Request",
                             "param": None, "code": 400}, status_code=400)

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(http: Request):
        body = parse_json_body(await http.body())
        return await _generate(state, body, http)

    @app.post("/pause_generation")
    async def pause_generation(http: Request):
        body = parse_json_body(await http.body(), allow_empty=True)
        mode = body.get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            raise BadRequest(f"mode must be one of 'abort', 'retract', 'in_place', got {mode!r}")
        await asyncio.wrap_future(state.engine.pause(mode))
        await asyncio.sleep(0)  # let the aborted requests' handlers answer first
        return {"message": "Generation paused successfully.", "status": "ok"}

    @app.post("/continue_generation")
    async def continue_generation(http: Request):
        parse_json_body(await http.body(), allow_empty=True)
        await asyncio.wrap_future(state.engine.resume())
        return {"message": "Generation continued successfully.", "status": "ok"}

    @app.post("/abort_request")
    async def abort_request(http: Request):
        body = parse_json_body(await http.body(), allow_empty=True)
        rid, abort_all = body.get("rid", "") or "", bool(body.get("abort_all", False))
        if not isinstance(rid, str):
            raise BadRequest(f"rid must be a string, got {type(rid).__name__}")
        state.engine.abort(rid, abort_all)
        return Response(status_code=200)

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(http: Request):
        body = parse_json_body(await http.body())
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            raise BadRequest("model_path is required: the directory of an HF checkpoint to load")
        version = body.get("weight_version")
        if version is not None and not isinstance(version, (str, int)):
            raise BadRequest(f"weight_version must be a string, got {type(version).__name__}")
        try:
            weights = await asyncio.to_thread(state.decoder.prepare_weights, path)
        except (ModelError, OSError) as e:
            return JSONResponse({"success": False, "message": f"Failed to update weights: {e}",
                                 "num_paused_requests": 0}, status_code=400)
        version = None if version is None else str(version)
        await asyncio.wrap_future(state.engine.install_weights(weights, version,
                                                               bool(body.get("abort_all_requests", False))))
        state.model_path = path
        message = "Succeeded to update model weights."
        if version is not None:
            message += f" Weight version updated to {version}."
        return {"success": True, "message": message, "num_paused_requests": 0}

    @app.post("/update_weight_version")
    async def update_weight_version(http: Request):
        body = parse_json_body(await http.body())
        new = body.get("new_version")
        if not isinstance(new, str) or not new:
            raise BadRequest("new_version is required (a string)")
        if body.get("abort_all_requests", True):
            state.engine.abort(abort_all=True)
        await asyncio.wrap_future(state.engine.install_weights(state.decoder.weights, new))
        return {"success": True, "message": f"Weight version updated to {new}", "new_version": new}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        load = state.engine.load()
        if load["num_running_reqs"] or load["num_waiting_reqs"]:
            return PlainTextResponse(
                "Cache not flushed. Please check the server log for details. (There are running or "
                "waiting requests.)", status_code=400)
        return PlainTextResponse("Cache flushed.\nPlease check backend logs for more details. "
                                 "(When there are running or waiting requests, the operation will not be performed.)\n")

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info():
        return {"model_path": state.model_path, "served_model_name": state.served_model_name,
                "tokenizer_path": state.config.model, "is_generation": True, "preferred_sampling_params": None,
                "weight_version": state.engine.weight_version, "load_format": "auto", "reasoning_parser": None,
                "tool_call_parser": "qwen25", "disaggregation_mode": "null", "has_image_understanding": False,
                "has_audio_understanding": False, "model_type": state.model_type,
                "architectures": state.architectures}

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info():
        c = state.config
        load = state.engine.load()
        return {"model_path": c.model, "tokenizer_path": c.model, "served_model_name": state.served_model_name,
                "host": c.host, "port": c.port, "device": c.device, "tp_size": 1, "dp_size": 1,
                "context_length": state.engine.context_length, "max_running_requests": c.max_running_requests,
                "max_total_num_tokens": state.engine.context_length * c.max_running_requests,
                "max_req_input_len": state.engine.context_length - 1, "skip_tokenizer_init": False,
                "incremental_streaming_output": False, "weight_version": c.weight_version,
                "disable_radix_cache": True, "random_seed": c.seed, "status": "ready",
                "internal_states": [{**load, "last_gen_throughput": 0.0, "num_decode_steps": state.engine.steps,
                                     "num_generated_tokens": state.engine.generated_tokens,
                                     "num_prefill_calls": state.engine.prefill_calls,
                                     "prefill_seconds": round(state.engine.prefill_s, 3),
                                     "decode_seconds": round(state.engine.decode_s, 3),
                                     "effective_max_running_requests_per_dp": c.max_running_requests}],
                "version": f"{SGLANG_API_VERSION} (agentrl serve)", "frontend": "python",
                "startup_time": state.started}

    @app.get("/health")
    async def health():
        return Response(status_code=200 if state.engine.alive else 503)

    @app.get("/health_generate")
    async def health_generate():
        req = EngineRequest(rid=f"HEALTH_CHECK_{uuid.uuid4().hex}", input_ids=[0], max_new_tokens=1, temperature=0.0)
        try:
            async with asyncio.timeout(HEALTH_CHECK_TIMEOUT_S):
                await state.run(req)
        except TimeoutError:
            state.engine.abort(req.rid)
            return Response(status_code=503)
        return Response(status_code=200)

    @app.get("/ready")
    async def ready():
        return Response(status_code=503 if state.engine.paused else 200)

    @app.get("/v1/loads")
    async def loads():
        load = state.engine.load()
        return {"timestamp": time.time(), "version": SGLANG_API_VERSION, "accelerator": state.config.device,
                "num_accelerators": 1,
                "loads": [{"dp_rank": 0, **load, "num_used_tokens": 0,
                           "max_total_num_tokens": state.engine.context_length * state.config.max_running_requests,
                           "token_usage": 0.0, "gen_throughput": 0.0, "cache_hit_rate": 0.0}]}

    from agentrl.openai_server import add_openai_routes

    add_openai_routes(app, state)
    return app


async def _generate(state: ServerState, body: dict[str, Any], http: Request):
    for key in ("input_embeds", "image_data", "video_data", "audio_data", "lora_path", "session_id", "session_params"):
        if body.get(key) is not None:
            raise BadRequest(f"{key} is not supported by agentrl serve")
    if (body.get("text") is None) == (body.get("input_ids") is None):
        raise BadRequest("Either text or input_ids should be provided (exactly one of them).")
    if body.get("text") is not None:
        texts = body["text"]
        batch = isinstance(texts, list)
        texts = texts if batch else [texts]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise BadRequest("text must be a string or a non-empty list of strings")
        prompts = [state.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        if any(not p for p in prompts):
            raise BadRequest("text cannot be empty")
    else:
        ids = body["input_ids"]
        batch = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
        prompts = [parse_prompt_ids(p, state) for p in (ids if batch else [ids])]
    sps = body.get("sampling_params")
    if isinstance(sps, list):
        if not batch or len(sps) != len(prompts):
            raise BadRequest(f"sampling_params is a list of {len(sps)} but there are {len(prompts)} prompts")
    else:
        sps = [sps] * len(prompts)
    parsed = [parse_sampling(sp, state, len(p)) for sp, p in zip(sps, prompts, strict=True)]
    n = parsed[0]["n"]
    if any(p["n"] != n for p in parsed):
        raise BadRequest("all sampling_params of a batch must have the same n")
    return_logprob = body.get("return_logprob", False)
    if isinstance(return_logprob, list):
        return_logprob = any(return_logprob)
    if body.get("logprob_start_len", -1) not in (-1, None):
        raise BadRequest("logprob_start_len >= 0 (prompt logprobs) is not supported by agentrl serve; use -1")
    top_n = body.get("top_logprobs_num", 0) or 0
    check_type("top_logprobs_num", top_n, (int,), "an integer >= 0")
    rid = body.get("rid")
    expanded = batch or n > 1
    if rid is None:
        rids = [uuid.uuid4().hex for _ in range(len(prompts) * n)]
    elif isinstance(rid, str):
        if n > 1:
            rids = [uuid.uuid4().hex for _ in range(len(prompts) * n)]
        else:
            rids = [f"{rid}_{i}" for i in range(len(prompts))] if batch else [rid]
    elif isinstance(rid, list) and len(rid) == len(prompts) and all(isinstance(r, str) for r in rid) and n == 1:
        rids = list(rid)
    else:
        raise BadRequest("rid must be a string, or a list of strings with one per prompt (and n == 1)")
    for r in rids:
        if state.engine.is_live(r):
            raise BadRequest(f"Duplicate request ID detected: {r}")
    reqs, opts = [], []
    for i, (prompt, p) in enumerate(zip(prompts, parsed, strict=True)):
        for j in range(n):
            reqs.append(EngineRequest(rid=rids[i * n + j], input_ids=list(prompt), top_logprobs_num=top_n, **p["engine"]))
            opts.append(p)
    kw = {"return_logprob": bool(return_logprob), "text_in_logprobs": bool(body.get("return_text_in_logprobs"))}
    if body.get("stream"):
        return StreamingResponse(_sse(state, reqs, opts, kw, expanded), media_type="text/event-stream")
    done = await asyncio.gather(*(state.run(r, http) for r in reqs))
    for r in done:
        reason = r.finish_reason or {}
        if reason.get("status_code") and reason["status_code"] >= 400:
            raise BadRequest(reason.get("message", "request failed"), status=reason["status_code"])
    results = [generate_result(state, r, no_stop_trim=o["no_stop_trim"], skip_special=o["skip_special_tokens"], **kw)
               for r, o in zip(done, opts, strict=True)]
    return results if expanded else results[0]


async def _sse(state: ServerState, reqs, opts, kw, expanded: bool):
    """Cumulative SSE chunks (SGLang's default), ``index`` per chunk for batches, then [DONE]."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, r: EngineRequest) -> None:
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
            o = opts[i]
            chunk = generate_result(state, r, n_tokens=n, no_stop_trim=o["no_stop_trim"],
                                    skip_special=o["skip_special_tokens"], **kw)
            if expanded:
                chunk["index"] = i
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        for t in tasks:
            t.cancel()
