"""The OpenAI-compatible gateway: agents in any process or language, recorded as training data.

What it is: ``build_app(gateway)``, the HTTP face of a ``Gateway`` (``agentrl.rollout.gateway``),
served by ``agentrl gateway`` or in-process (``agentrl.process.services.background_server``).
An agent gets a session, points any OpenAI client at it, plays its episode, posts a reward::

    POST /v1/sessions            {"metadata": {...}}  -> {"session_id", "api_key", "base_url"}
    GET  /v1/models                                      (the session's key as the bearer token)
    POST /v1/chat/completions    non-streaming and stream=true (SSE), tools/tool_calls, logprobs
    POST /v1/responses           the Responses API's basic shape (what the Agents SDK calls)
    POST /v1/sessions/{id}/reward  {"reward": r} (the last call) or {"completion_id": ..., "reward": r}
    POST /v1/sessions/{id}/end     {"discount": γ, "style": "concat"|"individual"} -> trajectories
    POST /v1/sessions/{id}/step    {"completion_id"?}: the reply, stepped in the session's env
    POST /sessions/{id}/mcp        the session's env tools as an MCP server (streamable HTTP;
                                   ``agentrl.rollout.gateway_mcp``), the session's key as bearer
    GET  /v1/sessions/{id}, GET /v1/gateway/stats, GET /health

The session is found from its key (``Authorization: Bearer <api_key>``) or from the path
``/sessions/{id}/v1/...`` for clients that cannot change keys. Every call goes through the
session's ``ChatClient``: exact token ids, logprobs and policy versions per call, one segment
per history rewrite. Ended sessions' trajectories go to ``OUT/trajectories.jsonl`` and to the
gateway's ``on_episode`` hook. ``stream=true`` is answered once the completion is done
(generation goes through ``RemoteEngine``, which hides weight-update interruptions).

A client that hangs up before its answer goes out abandons the call: it is taken out of the
session (``Gateway.call``'s ``deliver``; the module docstring of ``agentrl.rollout.gateway``),
never exported as training data, and the session goes on from what the client saw. Seen:
a connection closed by the time the answer is ready (a client timeout, a killed agent — the
usual case, streamed or not) and a stream cut before its last event. Not seen: a client that
goes in the instant its answer is being written (the bytes are in its socket, as for one that
read them).

In a training run: ``Gateway(engine, tokenizer, config, on_episode=hook)`` receives each ended
episode's trajectories in-process; ``gateway.admission`` (a training run's staleness bound) makes
``POST /v1/sessions`` answer 429 with ``Retry-After`` while it says no (backpressure).

Trust boundary. Covered: with ``api_key`` set, every route but ``/health`` (the docs routes
``/openapi.json``, ``/docs``, ``/redoc`` included: ``agentrl.http_edge.ApiKey``) answers 401
without the admin key or a session key, and a session key reaches only its own session
(403 elsewhere; only the admin key opens sessions and reads stats); request bodies over
``max_body_bytes`` get 413 and sessions past their token budget 400; malformed JSON, fields of
the wrong type, unknown sessions or completions get a 4xx JSON error naming the problem and
the gateway keeps serving; concurrent sessions never share state. An upstream that dies is
retried on the others (``RemoteEngine``); when none answers the call gets 503 and the session
ends as failed data unless a retry succeeds. Not covered: TLS (put it behind a proxy), rate
limits per key, keys that outlive the process, isolation between agents that share a key.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from agentrl import http_edge
from agentrl.errors import Refused, RequestRejected, RolloutError, ServerError, ServerUnavailable
from agentrl.http_edge import body_schema, install_errors, json_body
from agentrl.inference.chat_format import answer_chunks, sse
from agentrl.rollout.chat_client import ChatClient
from agentrl.rollout.episode import status_for
from agentrl.rollout.gateway import Gateway, Session
from agentrl.rollout.gateway_bodies import EndSession, OpenSession, SetReward, Step
from agentrl.rollout.gateway_mcp import MCPEndpoint

T = TypeVar("T")
log = logging.getLogger(__name__)


def build_app(gateway: Gateway, *, api_key: str | None = None, max_body_bytes: int | None = None,
              retry_after_s: int = 2) -> FastAPI:
    """The gateway's FastAPI app over ``gateway``; see the module docstring. Shutting the app
    down ends the open sessions as failed data (``gateway.aclose``). ``max_body_bytes``: None
    is the gateway's ``config.max_body_bytes``."""
    shared = Shared(gateway, api_key, gateway.config.max_body_bytes if max_body_bytes is None else max_body_bytes,
                    retry_after_s)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        try:
            yield
        finally:
            try:
                await gateway.aclose()
            finally:
                await mcp.aclose()

    mcp = shared.mcp
    app = FastAPI(title="agentrl gateway", lifespan=lifespan)
    app.state.gateway = gateway

    async def on_error(_: Request, e: Exception) -> JSONResponse:
        return error_response(e, retry_after_s)

    # each expected kind by name: Starlette answers a handler for bare Exception from its outermost
    # layer and then re-raises (a traceback in the log), which only an unexpected error should get
    for kind in (Refused, RequestRejected, RolloutError, ServerUnavailable, ServerError, TimeoutError,
                 Exception):
        app.add_exception_handler(kind, on_error)
    session_routes(app, shared)
    hot = openai_routes(app, shared)
    app.add_middleware(HotPath, shared=shared, hot=hot)
    if api_key is not None:  # outermost: no route, the docs included, answers an unknown key
        app.add_middleware(http_edge.ApiKey, key=lambda key: shared.is_admin(key) or gateway.by_key(key) is not None)
    install_errors(app)
    return app


GenerationRoute = Callable[[ChatClient, dict[str, Any]], Awaitable[dict[str, Any]]]


class Shared:
    """What every route of the gateway shares: the keys (admin, or a session's), the body reader
    and one generation call answered on the wire (``generate``)."""

    def __init__(self, gateway: Gateway, api_key: str | None, max_body_bytes: int, retry_after_s: int) -> None:
        self.gateway, self.api_key = gateway, api_key
        self.max_body_bytes, self.retry_after_s = max_body_bytes, retry_after_s
        self.mcp = MCPEndpoint()  # the sessions' env tools served over MCP

    @staticmethod
    def bearer(request: Request) -> str:
        return http_edge.bearer(request.headers)

    def is_admin(self, key: str) -> bool:
        return self.api_key is not None and http_edge.same_key(key, self.api_key)

    def require_admin(self, request: Request) -> None:
        if self.api_key is not None and not self.is_admin(self.bearer(request)):
            raise Refused("this route needs the gateway's admin API key", 401)

    def session_for_path(self, request: Request, session_id: str) -> Session:
        key, gateway = self.bearer(request), self.gateway
        session = gateway.by_id(session_id)
        if self.api_key is not None and not self.is_admin(key) and (
                session is None or not http_edge.same_key(key, session.key)):
            if gateway.by_key(key) is not None:
                raise Refused("this API key belongs to another session", 403)
            raise Refused("invalid API key: use the admin key or this session's api_key", 401)
        if session is None:
            if gateway.ended_summary(session_id) is not None:
                raise Refused(f"session {session_id} has ended", 409)
            raise Refused(f"no session {session_id!r}; create one with POST /v1/sessions", 404)
        return session

    def session_for_key(self, request: Request) -> Session:
        key = self.bearer(request)
        session = self.gateway.by_key(key) if key else None
        if session is None:
            if self.is_admin(key):
                raise Refused("the admin key belongs to no session: use a session's api_key, or the "
                              "path /sessions/{session_id}/v1/...")
            raise Refused("no open session has this API key; create one with POST /v1/sessions and "
                          "use its api_key", 401)
        return session

    async def body_of(self, request: Request, *, allow_empty: bool = False) -> dict[str, Any]:
        return await http_edge.read_json(request, self.max_body_bytes, "max_body_bytes", allow_empty=allow_empty)

    async def body_as(self, cls: type[T], request: Request, *, allow_empty: bool = False) -> T:
        """The route's body, parsed and checked against its declaration (``gateway_bodies``)."""
        return http_edge.parse_body(cls, await self.body_of(request, allow_empty=allow_empty), status=400)

    async def generate(self, request: Request, session: Session, route: GenerationRoute, send: Any) -> None:
        """One generation call of ``session``, answered on ``send``: the answer, or the error's."""

        async def deliver(answer: dict[str, Any]) -> bool:
            if await request.is_disconnected():
                return False  # abandoned while it was generated
            try:
                if body.get("stream") is True and answer.get("object") == "chat.completion":
                    include = bool((body.get("stream_options") or {}).get("include_usage"))
                    stream = AnswerStream(answer_chunks(answer, include_usage=include))
                    await stream(request.scope, request.receive, send)
                    return stream.delivered
                await JSONResponse(answer)(request.scope, request.receive, send)
                return True
            except (OSError, ClientDisconnect):  # the connection broke while the answer was written
                return False

        try:
            body = await self.body_of(request)
            await self.gateway.call(session, lambda chat: route(chat, body), deliver)
        except ClientDisconnect:
            return  # gone before its request was read: nothing was asked
        except Exception as e:  # noqa: BLE001 (raised before any answer went out: the error is the answer)
            await error_response(e, self.retry_after_s)(request.scope, request.receive, send)


def session_routes(app: FastAPI, shared: Shared) -> None:
    """``/health``, ``/v1/sessions`` (open, read, reward, end, step) and ``/v1/gateway/stats``."""
    gateway, retry_after_s = shared.gateway, shared.retry_after_s

    @app.get("/health")
    async def health():
        return {"status": "ok", "open_sessions": gateway.open_sessions}

    @app.post("/v1/sessions", openapi_extra=json_body(body_schema(OpenSession), required=False))
    async def open_session(request: Request):
        shared.require_admin(request)
        metadata = (await shared.body_as(OpenSession, request, allow_empty=True)).metadata or {}
        if not gateway.admits(metadata):
            gateway.stats["sessions_refused"] += 1
            raise Refused("the gateway is not admitting new sessions right now (the trainer is catching "
                          "up); retry later", 429, headers={"Retry-After": str(retry_after_s)})
        try:
            session = gateway.open_session(metadata)
        except RolloutError as e:
            raise Refused(str(e), 429, headers={"Retry-After": str(retry_after_s)}) from None
        base = str(request.base_url).rstrip("/")
        return JSONResponse({"session_id": session.id, "api_key": session.key, "base_url": f"{base}/v1",
                             "session_base_url": f"{base}/sessions/{session.id}/v1"})

    @app.get("/v1/sessions/{session_id}")
    async def get_session(request: Request, session_id: str):
        try:
            return shared.session_for_path(request, session_id).summary()
        except Refused as e:
            if e.status == 409:
                shared.require_admin(request)
                return gateway.ended_summary(session_id)
            raise

    @app.post("/v1/sessions/{session_id}/reward", openapi_extra=json_body(body_schema(SetReward), required=True))
    async def reward(request: Request, session_id: str):
        session = shared.session_for_path(request, session_id)
        body = await shared.body_as(SetReward, request)
        r, cid = body.reward, body.completion_id
        if cid is None:
            if not session.chat.conversation.calls:
                raise Refused("this session has made no completion yet; reward it after a call", 409)
            session.chat.set_last_reward(r)
            cid = session.chat.conversation.calls[-1].id
        else:
            try:
                session.chat.set_reward(cid, r)
            except RolloutError as e:
                raise Refused(str(e), 404) from None
        return JSONResponse({"session_id": session.id, "completion_id": cid, "reward": float(r)})

    @app.post("/v1/sessions/{session_id}/end", openapi_extra=json_body(body_schema(EndSession), required=False))
    async def end(request: Request, session_id: str):
        session = shared.session_for_path(request, session_id)
        body = await shared.body_as(EndSession, request, allow_empty=True)
        trajectories = await gateway.end_session(session.id, discount=body.discount, style=body.style)
        out = {"session_id": session.id, "status": session.status, "num_trajectories": len(trajectories),
               "rewards": [t.reward for t in trajectories]}
        if body.return_trajectories:
            out["trajectories"] = [t.to_dict() for t in trajectories]
        return JSONResponse(out)  # plain JSON already: no need for FastAPI's encoder

    @app.post("/v1/sessions/{session_id}/step", openapi_extra=json_body(body_schema(Step), required=False))
    async def step_route(request: Request, session_id: str):
        return await step(shared, request, session_id)

    async def mcp_route(request: Request, session_id: str):
        session = shared.session_for_path(request, session_id)
        key = shared.bearer(request)
        if not (shared.is_admin(key) or http_edge.same_key(key, session.key)):  # a key even on a gateway without one
            raise Refused("the MCP endpoint needs this session's api_key as the bearer token", 401)
        return Deferred(lambda send: shared.mcp.handle(session, request.scope, request.receive, send))

    for method in ("GET", "POST", "DELETE"):  # one route a method: an operation id each in the OpenAPI document
        app.add_api_route("/sessions/{session_id}/mcp", mcp_route, methods=[method],
                          operation_id=f"session_mcp_{method.lower()}",
                          summary="the session's env tools as an MCP server (streamable HTTP)")

    @app.get("/v1/gateway/stats")
    async def stats(request: Request):
        shared.require_admin(request)
        return {**gateway.stats, "open_sessions": gateway.open_sessions}


async def step(shared: Shared, request: Request, session_id: str) -> dict[str, Any]:
    """``POST /v1/sessions/{id}/step``: the session's env steps on a call's reply (the last by default)."""
    session = shared.session_for_path(request, session_id)
    if session.stepper is None:
        raise Refused("this session has no environment to step (only ExternalAgentWorkflow's do)", 404)
    body = await shared.body_as(Step, request, allow_empty=True)
    conv = session.chat.conversation
    if body.completion_id is not None:
        try:
            call = conv.call(body.completion_id)
        except RolloutError as e:
            raise Refused(str(e), 404) from None
    elif conv.calls:
        call = conv.calls[-1]
    else:
        raise Refused("this session has made no completion yet; step after a call", 409)
    reply = session.chat.renderer.decode(call.completion.tokens, skip_special_tokens=True)
    try:
        result = await session.stepper(reply)
    except Exception as e:  # the env failed: the episode is failed data
        session.failure = (status_for(e), f"{type(e).__name__}: {e}"[:2000])
        raise Refused(f"the environment failed: {e}", 500) from None
    session.chat.set_reward(call.id, float(result.get("reward", 0.0)))
    return result


def openai_routes(app: FastAPI, shared: Shared) -> dict[str, GenerationRoute]:
    """``/v1/models``, ``/v1/chat/completions`` and ``/v1/responses``, by a session's key or under
    ``/sessions/{id}``; returns the generation routes by path (``HotPath`` serves them by key)."""
    gateway = shared.gateway

    def models_list() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": gateway.model, "object": "model", "created": 0,
                                            "owned_by": "agentrl"}]}

    @app.get("/v1/models")
    async def models(request: Request):
        key = shared.bearer(request)
        if shared.api_key is not None and not shared.is_admin(key) and gateway.by_key(key) is None:
            raise Refused("invalid API key", 401)
        return models_list()

    @app.get("/sessions/{session_id}/v1/models")
    async def session_models(request: Request, session_id: str):
        shared.session_for_path(request, session_id)
        return models_list()

    def by_key(route: GenerationRoute):
        async def endpoint(request: Request):
            session = shared.session_for_key(request)
            return Deferred(lambda send: shared.generate(request, session, route, send))
        return endpoint

    def by_path(route: GenerationRoute):
        async def endpoint(request: Request, session_id: str):
            session = shared.session_for_path(request, session_id)
            return Deferred(lambda send: shared.generate(request, session, route, send))
        return endpoint

    hot: dict[str, GenerationRoute] = {"/v1/chat/completions": ChatClient.complete, "/v1/responses": ChatClient.respond}
    for path, route in hot.items():
        app.add_api_route(path, by_key(route), methods=["POST"])  # the session from the bearer key
        app.add_api_route(f"/sessions/{{session_id}}{path}", by_path(route), methods=["POST"])  # or the path
    return hot


class HotPath:
    """``POST /v1/chat/completions`` and ``/v1/responses`` by key, answered before FastAPI's
    routing, dependency and exception layers (14% less gateway CPU per call in
    ``benchmarks/gateway.py``); the same handler and error answers as the routes of
    ``openai_routes``, which serve them in the OpenAPI document and for the path form."""

    def __init__(self, app: Any, shared: Shared, hot: dict[str, GenerationRoute]) -> None:
        self.app, self.shared, self.hot = app, shared, hot

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        route = self.hot.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if route is None:
            return await self.app(scope, receive, send)
        request = Request(scope, receive)
        try:
            session = self.shared.session_for_key(request)
        except Refused as e:  # the same answer as the routes'
            return await error_response(e, self.shared.retry_after_s)(scope, receive, send)
        await self.shared.generate(request, session, route, send)


class AnswerStream(StreamingResponse):
    """A chat completion as server-sent events; ``delivered`` once its last event went out to a
    client still connected (one that hangs up mid-stream stops it: Starlette listens for the
    disconnect; the server drops what is sent after, so the end checks again)."""

    def __init__(self, chunks: list[dict[str, Any]]) -> None:
        self.delivered = False
        self._request: Request | None = None
        super().__init__(self._events(chunks), media_type="text/event-stream")

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self._request = Request(scope, receive)
        await super().__call__(scope, receive, send)

    async def _events(self, chunks: list[dict[str, Any]]):  # async: Starlette would move a sync one to a thread
        for c in chunks:
            yield sse(c)
        yield sse("[DONE]")
        # here once [DONE] was handed to the server, with no wait since: a client gone now was gone then
        self.delivered = self._request is not None and not await self._request.is_disconnected()


class Deferred(Response):
    """What a generation route returns to FastAPI: the call itself, made when the response is
    sent, so that the answer goes out while the call is in flight (``Gateway.call``)."""

    def __init__(self, respond: Callable[[Any], Awaitable[None]]) -> None:
        super().__init__()
        self.respond = respond

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.respond(send)


def error_response(e: Exception, retry_after_s: int) -> JSONResponse:
    """The answer to an exception a route raised, in OpenAI's error shape (``agentrl.http_edge``)."""
    return http_edge.error_response(refusal(e, retry_after_s))


def refusal(e: Exception, retry_after_s: int) -> Refused:
    """The HTTP refusal an exception a route raised stands for."""
    if isinstance(e, Refused):
        return e
    if isinstance(e, RequestRejected) and e.status_code in (401, 403):  # the gateway's key, not the agent's
        return Refused(f"the inference server refused the gateway's key (HTTP {e.status_code}): start the gateway "
                       f"with the server's key in ${http_edge.SERVER_KEY_ENV}", 502)
    if isinstance(e, RequestRejected):
        return Refused(str(e), e.status_code if 400 <= e.status_code < 500 else 400)
    if isinstance(e, RolloutError):
        return Refused(str(e))
    if isinstance(e, ServerUnavailable):
        return Refused(f"no inference server could take the call: {e}", 503,
                       headers={"Retry-After": str(retry_after_s)})
    if isinstance(e, ServerError):
        return Refused(f"the inference server failed: {e}", 502)
    if isinstance(e, TimeoutError):
        return Refused("the generation call ran past its timeout", 504)
    log.error("internal error in the gateway", exc_info=e)
    return Refused(f"internal error: {e!r}", 500)
