"""``agentrl serve``: an HTTP server that answers like SGLang, backed by the embedded engine.

What it is: ``build_app(config)`` — one FastAPI app made of three routers over one
``ServerState``: SGLang's native routes (``native_routes``), its weight updates over
torch.distributed (``weight_sync``) and the OpenAI routes (``openai_routes``), with SGLang's
field names and response shapes, so that a client tested against it is tested against SGLang.
The engine (``engine``) runs on its own thread, started and stopped by the app's lifespan;
handlers only await its news, so the event loop never blocks on the model.

Matched version: **sglang 0.5.23** (``python/sglang/srt/entrypoints/http_server.py``,
``managers/io_struct.py``, ``entrypoints/openai/protocol.py``). Deliberate choices and
0.5.10 differences:
  * every refusal answers OpenAI's error body ``{"error": {"message", "type", "param", "code"}}``
    (``agentrl.http_edge``), a superset of SGLang's ``{"error": {"message"}}``; where SGLang
    answers another shape (its OpenAI routes' flat ``{"object": "error", "message", ...}``, a
    bare string for unknown ``sampling_params`` keys) clients read the same ``message`` here;
  * unknown ``sampling_params`` keys are rejected with 400 ``unknown field ...`` (0.5.23's
    contract; 0.5.10 answered 500); unknown top-level keys are ignored (both);
  * ``meta_info.num_retractions`` (0.5.10 called it ``total_retractions``; the client reads
    either) and ``meta_info.weight_versions`` spans (0.5.23 only; the client falls back to
    ``weight_version``);
  * a weight update swaps weights between two decode steps instead of waiting on SGLang's
    writer lock; with the client's pause (abort) first, as DESIGN.md §4 orders, the two are
    indistinguishable. Updates over torch.distributed (``weight_sync``, gloo only on CPU) need
    no 0.5.23 ``/begin_weight_update`` session (the route is absent: 404), take no
    ``load_format`` but SGLang's ``flattened_bucket``, and always empty the prefix cache;
  * ours, absent from SGLang: ``/update_weights_from_distributed``'s ``agentrl_stage_only``
    field (receive and check a bucket into a staging copy while generation goes on, without
    serving it), ``POST /agentrl/commit_staged_weights`` (swap the staged copy in, with its
    version) and ``/server_info``'s ``agentrl_staged_weight_updates: true`` that advertises
    them; a request without the field behaves as SGLang's;
  * logprobs are those of the distribution actually sampled from (after temperature, top-k,
    top-p; 0.0 for greedy), see ``sampling``; SGLang reports them before the top-k/p filter.
    Grammars (a non-null ``regex``, ``json_schema``, ``ebnf`` or ``structural_tag``), LoRA,
    sessions and multimodal inputs are refused with a 400 that says so;
  * the prefix cache (``prefix_cache``; SGLang's radix cache, ``--disable-radix-cache`` turns it
    off) copies a matched prefix into the request's own KV slot instead of sharing it in place,
    and the ``n`` samples of one prompt (any requests with equal tokens admitted together) also
    share the prompt's last-token logits, so those samples report ``cached_tokens`` equal to the
    whole prompt where SGLang recomputes the last token; ``cache_hit_rate`` (``/get_server_info``,
    ``/v1/loads``) is cumulative since start. Every weight update empties the cache, and
    ``/flush_cache`` empties it when no request is running or waiting (400 otherwise, as SGLang).

Trust boundary: the server is meant for localhost and trusted networks. Covered: every
malformed or out-of-range request gets a 4xx JSON error naming the field, never a 500 or a
hang (``tests/inference/test_fuzz.py`` fuzzes every route from ``GET /openapi.json``, whose
body schemas are ``openapi``'s); bodies above ``--max-request-bytes`` are refused (413) and
requests beyond ``--max-queued-requests`` wait nowhere (503); a client that disconnects frees
its slot; with ``--api-key`` every route but ``/health*`` and ``/ready`` needs the key, the docs
routes included (``agentrl.http_edge.ApiKey``). Not covered: TLS, per-client rate limits or quotas.
"""

from __future__ import annotations

import contextlib
import logging

from fastapi import FastAPI, Request

from agentrl.errors import Refused
from agentrl.http_edge import ApiKey, error_response, install_errors
from agentrl.inference.native_routes import native_routes
from agentrl.inference.openai_routes import openai_routes
from agentrl.inference.serve_config import ServeConfig
from agentrl.inference.state import ServerState
from agentrl.inference.weight_sync import weight_sync_routes

log = logging.getLogger(__name__)


def build_app(config: ServeConfig, state: ServerState | None = None) -> FastAPI:
    """The FastAPI app; the scheduler thread starts and stops with the app's lifespan."""
    state = state or ServerState(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        state.scheduler.start()
        try:
            yield
        finally:
            state.scheduler.shutdown()

    app = FastAPI(title="agentrl serve", lifespan=lifespan)
    app.state.server = state
    if config.api_key:
        app.add_middleware(ApiKey, key=config.api_key)
    install_errors(app)

    @app.exception_handler(Exception)
    async def _internal(_: Request, e: Exception):
        log.exception("internal error")
        return error_response(Refused(f"internal error: {e!r}", 500))

    app.include_router(native_routes(state))
    app.include_router(weight_sync_routes(state))
    app.include_router(openai_routes(state))
    return app
