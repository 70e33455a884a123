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
  * unknown ``sampling_params`` keys are rejected with 400 ``{"error": "unknown field ..."}``
    (0.5.23's contract; 0.5.10 answered 500); unknown top-level keys are ignored (both);
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
its slot; with ``--api-key`` every route but ``/health*`` and ``/ready`` needs the key. Not
covered: TLS, per-client rate limits or quotas.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from agentrl.inference.native_routes import native_routes
from agentrl.inference.openai_routes import openai_routes
from agentrl.inference.state import ServeConfig, ServerState
from agentrl.inference.weight_sync import weight_sync_routes
from agentrl.inference.wire import BadRequest, error_response

log = logging.getLogger(__name__)


class _ApiKey:
    """ASGI middleware: with a key set, every route but ``/health*`` and ``/ready`` needs
    ``Authorization: Bearer KEY`` (SGLang's rule for its ``--api-key``: probes need no secret)."""

    def __init__(self, app: Any, key: str) -> None:
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and scope.get("method") != "OPTIONS" and not path.startswith(("/health", "/ready")):
            header = dict(scope["headers"]).get(b"authorization", b"")
            given = header[7:] if header[:7].lower() == b"bearer " else b""
            if not hmac.compare_digest(given, self.key):
                response = JSONResponse({"error": {"message": "missing or wrong API key: send the header "
                                                   "'Authorization: Bearer KEY' with the server's --api-key"}},
                                        status_code=401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


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
        app.add_middleware(_ApiKey, key=config.api_key)

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

    app.include_router(native_routes(state))
    app.include_router(weight_sync_routes(state))
    app.include_router(openai_routes(state))
    return app
