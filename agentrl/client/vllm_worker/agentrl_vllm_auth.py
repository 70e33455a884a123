"""Runs inside a vLLM server that agentrl starts, not in agentrl: the key on every route.

vLLM's own ``--api-key`` (``VLLM_API_KEY``) guards only the OpenAI routes (``/v1``, ``/v2``,
``/inference``), while the routes a run needs vLLM's dev mode for — ``/collective_rpc``,
``/update_weight_version``, ``/pause``, ``/sleep``, ``/weight_info`` — answer anyone who can
reach the port. A vLLM server that ``agentrl train`` starts is launched with ``--middleware
agentrl_vllm_auth.RequireKey`` (this directory on its ``PYTHONPATH``) and its key in
``VLLM_API_KEY`` (the environment, out of process listings), so every route but ``/health``
needs ``Authorization: Bearer KEY``, as ``agentrl serve``'s key does (``agentrl.http_edge``).

Covered: every HTTP and websocket route, the dev routes and the docs included. Not covered:
TLS, rate limits; a server started with no key refuses to start (the run always sends one).
This module imports nothing of agentrl's (vLLM's environment has no agentrl).
"""

from __future__ import annotations

import hmac
import json
import os

KEY_ENV = "VLLM_API_KEY"
OPEN = ("/health",)


class RequireKey:
    """Pure ASGI middleware (vLLM adds it with no arguments): the key comes from ``VLLM_API_KEY``."""

    def __init__(self, app, key: str | None = None) -> None:
        self.app = app
        self.key = (key if key is not None else os.environ.get(KEY_ENV, "")).encode()
        if not self.key:
            raise RuntimeError(f"agentrl_vllm_auth.RequireKey needs a key in ${KEY_ENV}")

    def _allowed(self, scope) -> bool:
        path = scope.get("path", "")
        if scope.get("method") == "OPTIONS" or any(path == p or path.startswith(p + "/") for p in OPEN):
            return True
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"")
        given = auth[7:].strip() if auth[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"")
        return bool(given) and hmac.compare_digest(given, self.key)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": {"message": "invalid API key: this server needs 'Authorization: Bearer KEY' "
                                     "(the key of the run that started it)", "type": "authentication_error",
                                     "param": None, "code": "invalid_api_key"}}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
