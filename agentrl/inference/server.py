"""``agentrl serve``: an HTTP server that answers like SGLang, backed by the embedded engine.

What it is: ``build_app(config)`` — one FastAPI app made of three routers over one
``ServerState``: SGLang's native routes (``native_routes``), its weight updates over
torch.distributed (``weight_sync``) and the OpenAI routes (``openai_routes``), with SGLang's
field names and response shapes, so that a client tested against it is tested against SGLang.
The scheduler (``scheduler``) runs on its own thread, started and stopped by the app's lifespan;
handlers only await its news, so the event loop never blocks on the model.

Matched version: sglang 0.5.23 (``python/sglang/srt/entrypoints/http_server.py``,
``managers/io_struct.py``, ``entrypoints/openai/protocol.py``); where it knowingly differs
(error bodies, logprobs after the top-k/p filter, staged weight updates, the prefix cache's
copying) is listed in docs/DESIGN.md §4 "Inference server". What it is not: the client
(``agentrl.client``) or a general-purpose inference server (no grammars, sessions, multimodal).

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
