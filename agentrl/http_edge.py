"""The edge every agentrl HTTP service shares: ``agentrl serve``, the gateway, the sandbox service.

What it is: what happens to a request before a route's own work, written once.
  * ``ApiKey`` — ASGI middleware: with a key set, every route but the probes (``PROBES``:
    ``/health*`` and ``/ready``) and CORS preflights (``OPTIONS``) needs the key, sent as
    ``Authorization: Bearer KEY`` or ``X-Api-Key: KEY``; the docs routes (``/openapi.json``,
    ``/docs``, ``/redoc``) included. The key is a string, or a check (the gateway accepts its
    admin key and any open session's key);
  * ``read_json(request, limit, setting)`` — the body within ``limit`` bytes (413 as soon as it
    is seen to be over, without reading the rest), then ``parse_json``: a JSON object or a 400
    (not UTF-8, not JSON, an integer of more than 4,300 digits, nesting deeper than the
    parser's recursion limit, a lone surrogate escape that no UTF-8 answer could echo);
  * one error body: every refusal is an ``agentrl.errors.Refused``, answered in OpenAI's shape
    ``{"error": {"message", "type", "param": null, "code"}}`` (``error_response``);
    ``install_errors(app)`` does the same for FastAPI's own 404/405 and validation errors;
  * a request body declared once, as a dataclass of ``agentrl.config.option`` fields (types,
    bounds, help): ``parse_body(cls, data, maxima)`` checks a parsed body against it (and the
    operator's ceilings), ``body_schema(cls, maxima)`` is its JSON Schema for the OpenAPI
    document. The sandbox service's ``ExecRequest`` is declared so.

  * the key of the inference servers (``SERVER_KEY_ENV``, ``$AGENTRL_SERVE_API_KEY``):
    ``agentrl serve`` reads it, ``RemoteEngine`` and the gateway send it (``server_key``,
    ``server_auth``), and ``agentrl train`` generates one for the servers it starts when it is
    unset (``agentrl.run.local_launcher.ensure_server_key``).

What it is not: a route's own checks of field values (each service's), TLS, rate limits.
Main hooks: ``app.add_middleware(ApiKey, key=...)``, ``await read_json(...)``, ``install_errors(app)``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import math
import os
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from agentrl.config import bound_problem, choices_of
from agentrl.errors import Refused

T = TypeVar("T")

PROBES = ("/health", "/ready")
"""Path prefixes that need no key: liveness and readiness probes carry no secret (SGLang's rule)."""

SERVER_KEY_ENV = "AGENTRL_SERVE_API_KEY"
"""The environment variable holding the inference servers' key (out of process listings)."""

LARGE_BODY = 1 << 20
"""Bodies above this many bytes are parsed on a worker thread (the event loop keeps serving)."""

SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate: half of a pair (valid), or alone (no Unicode text)."""


def error_body(e: Refused) -> dict[str, Any]:
    """OpenAI's error object for ``e``."""
    return {"error": {"message": e.message, "type": e.type, "param": None, "code": e.code}}


def error_response(e: Refused) -> JSONResponse:
    return JSONResponse(error_body(e), status_code=e.status, headers=e.headers)


def bearer(headers: dict[bytes, bytes] | Any) -> str:
    """The key a request carries: ``Authorization: Bearer KEY``, else ``X-Api-Key``, else ``""``.
    ``headers`` is Starlette's ``Headers`` or an ASGI scope's headers as a dict of bytes."""
    if isinstance(headers, dict):
        auth = headers.get(b"authorization", b"").decode("latin-1")
        other = headers.get(b"x-api-key", b"").decode("latin-1")
    else:
        auth, other = headers.get("authorization", ""), headers.get("x-api-key", "")
    return auth[7:].strip() if auth[:7].lower() == "bearer " else other


def server_key() -> str | None:
    """The inference servers' key from ``$AGENTRL_SERVE_API_KEY`` (None when unset or empty)."""
    return os.environ.get(SERVER_KEY_ENV) or None


def server_auth() -> dict[str, str]:
    """The header that carries ``server_key()`` (none without a key), for a plain httpx call."""
    key = server_key()
    return {"Authorization": f"Bearer {key}"} if key else {}


def same_key(given: str, key: str) -> bool:
    """Constant-time comparison; an empty key never matches."""
    return bool(given) and hmac.compare_digest(given.encode(), key.encode())


class ApiKey:
    """ASGI middleware: every request but probes and preflights needs the key (see the module).

    Args:
        key: the key itself, or a check that says whether a given key is accepted.
    """

    def __init__(self, app: Any, key: str | Callable[[str], bool]) -> None:
        self.app = app
        self.accepts = key if callable(key) else (lambda given: same_key(given, key))

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if (scope["type"] == "http" and scope.get("method") != "OPTIONS"
                and not scope.get("path", "").startswith(PROBES)
                and not self.accepts(bearer(dict(scope["headers"])))):
            refusal = Refused("missing or wrong API key: send the header 'Authorization: Bearer KEY' with the "
                              "service's API key", 401)
            await error_response(refusal)(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def read_body(request: Request, limit: int, setting: str) -> bytes:
    """The request's body, refused (413) as soon as it is seen to pass ``limit`` bytes;
    ``setting`` names the limit in the message (``--max-request-bytes``)."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise Refused(f"the request body is {length} bytes, above this service's limit of {limit} ({setting})", 413)
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > limit:
            raise Refused(f"the request body is over this service's limit of {limit} bytes ({setting})", 413)
    return bytes(data)


async def read_json(request: Request, limit: int, setting: str, *, allow_empty: bool = False,
                    expected: str = "a JSON object") -> dict[str, Any]:
    """``parse_json`` of ``read_body``; a large body is parsed on a worker thread."""
    raw = await read_body(request, limit, setting)
    if len(raw) > LARGE_BODY:
        return await asyncio.to_thread(parse_json, raw, allow_empty=allow_empty, expected=expected)
    return parse_json(raw, allow_empty=allow_empty, expected=expected)


def parse_json(raw: bytes, *, allow_empty: bool = False, expected: str = "a JSON object") -> dict[str, Any]:
    """The JSON object in ``raw`` (``{}`` for an empty body if ``allow_empty``), or a 400
    ``Refused`` that says what came; ``expected`` names what to send instead."""
    if not raw.strip():
        if allow_empty:
            return {}
        raise Refused(f"the request body is empty; send {expected}")
    try:
        body = json.loads(raw)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer too long to convert
        raise Refused(f"the request body is not valid JSON ({e}); send {expected}") from e
    except RecursionError:
        raise Refused(f"the request body is not valid JSON (nested too deeply); send {expected}") from None
    if not isinstance(body, dict):
        raise Refused(f"the request body must be {expected}, got {type(body).__name__}")
    if SURROGATE_ESCAPE.search(raw):  # rare: look whether a surrogate came without its pair
        try:
            json.dumps(body, ensure_ascii=False).encode()
        except (UnicodeEncodeError, RecursionError):
            raise Refused("the request body holds a lone surrogate escape (one of \\ud800-\\udfff without its "
                          "pair), which is not Unicode text; send valid Unicode") from None
    return body


def install_errors(app: FastAPI) -> None:
    """Answer ``Refused``, FastAPI's own HTTP errors (an unknown route: 404, a wrong method: 405)
    and its validation errors in the one error body."""

    async def refused(_: Request, e: Refused) -> JSONResponse:
        return error_response(e)

    async def http_error(_: Request, e: HTTPException) -> JSONResponse:
        return error_response(Refused(str(e.detail), e.status_code, headers=dict(e.headers or {}) or None))

    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        return error_response(Refused(f"the request does not fit the route: {e.errors()}", 400))

    app.add_exception_handler(Refused, refused)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid)


# --------------------------------------------------------------------------- declared bodies

Maxima = Mapping[str, tuple[str, float]]
"""Field name -> (the ceiling's name, its value): the most a number, or a list's length, may be."""


def _kind(tp: Any) -> tuple[Callable[[Any], bool], str, dict[str, Any]]:
    """(a check, what it expects in words, the JSON Schema) of a field type."""
    def text(v: Any) -> bool:
        return isinstance(v, str)

    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp):
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]  # X | None
        ok, expected, schema = _kind(inner)
        nullable = {**schema, "type": [schema["type"], "null"]} if "type" in schema else {"anyOf": [schema, {"type": "null"}]}
        return (lambda v: v is None or ok(v)), f"{expected} or null", nullable
    if tp is bool:
        return (lambda v: isinstance(v, bool)), "true or false", {"type": "boolean"}
    if tp is str:
        return text, "a string", {"type": "string"}
    if tp is int:
        return (lambda v: isinstance(v, int) and not isinstance(v, bool)), "an integer", {"type": "integer"}
    if tp is float:
        return ((lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                 and (isinstance(v, int) or math.isfinite(v))),  # (an int may be too large for a float)
                "a finite number", {"type": "number"})
    if typing.get_origin(tp) is typing.Literal:
        return (lambda v: True), "", {"enum": list(typing.get_args(tp))}  # the choices say it
    if typing.get_origin(tp) is dict and typing.get_args(tp) == (str, str):
        return ((lambda v: isinstance(v, dict) and all(text(k) and text(x) for k, x in v.items())),
                "an object of file name -> string", {"type": "object", "additionalProperties": {"type": "string"}})
    if typing.get_origin(tp) is dict and typing.get_args(tp) == (str, Any):
        return (lambda v: isinstance(v, dict)), "an object", {"type": "object"}
    if typing.get_origin(tp) is list and typing.get_args(tp) == (str,):
        return ((lambda v: isinstance(v, list) and all(map(text, v))), "a list of strings",
                {"type": "array", "items": {"type": "string"}})
    raise TypeError(f"a declared body field cannot be {tp!r}; use str, int, float, bool, Literal, "
                    "dict[str, str], dict[str, Any], list[str] or one of them | None")


def parse_body(cls: type[T], data: Mapping[str, Any], maxima: Maxima | None = None, *, status: int = 422,
               sglang: bool = False) -> T:
    """``cls`` built from a parsed body, or a ``Refused`` (``status``) naming the first field that
    is unknown, missing, of the wrong type, above its ceiling in ``maxima`` or out of bounds.
    ``sglang``: SGLang's rules for its bodies instead — unknown keys are ignored and a null is
    the field's default."""
    maxima = maxima or {}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    what = cls.__name__
    if sglang:
        data = {k: v for k, v in data.items() if k in fields and v is not None}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise Refused(f"unknown field(s) {unknown} in the {what}; its fields are {list(fields)}", status)
    hints = typing.get_type_hints(cls)
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise Refused(f'the {what} has no {name}: send at least {{"{name}": ...}}', status)
            continue
        value, (ok, expected, _) = data[name], _kind(hints[name])
        if not ok(value):
            raise Refused(f"{name} must be {expected}, got {type(value).__name__} {str(value)[:40]!r}", status)
        if name in maxima:
            ceiling, most = maxima[name]
            size = len(value) if isinstance(value, list) else value
            if size > most:
                said = f"{name} holds {size} items" if isinstance(value, list) else f"{name}={value}"
                raise Refused(f"{said}, above this service's ceiling {ceiling}={most} (set by its operator); "
                              "ask for less", status)
        problem = bound_problem(value, hints[name], f.metadata)
        if problem:
            raise Refused(f"{name} {problem}, got {str(value)[:40]!r}", status)
    return cls(**data)


def body_schema(cls: type, maxima: Maxima | None = None) -> dict[str, Any]:
    """The JSON Schema of the body ``cls`` declares, within ``maxima``: for the OpenAPI document
    (client generators, the fuzz tests). It describes; ``parse_body`` enforces."""
    maxima = maxima or {}
    hints = typing.get_type_hints(cls)
    props: dict[str, Any] = {}
    required = []
    for f in dataclasses.fields(cls):
        schema = {**_kind(hints[f.name])[2], "description": f.metadata.get("help", "")}
        choices = choices_of(hints[f.name], f.metadata)
        if choices is not None:
            schema["enum"] = list(choices)
        for bound, key in (("ge", "minimum"), ("gt", "exclusiveMinimum"), ("le", "maximum"),
                           ("lt", "exclusiveMaximum")):
            if f.metadata.get(bound) is not None:
                schema[key] = f.metadata[bound]
        if f.name in maxima:
            schema["maxItems" if schema.get("type") == "array" else "maximum"] = maxima[f.name][1]
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
        props[f.name] = schema
    return {"type": "object", "required": required, "additionalProperties": False, "properties": props}


def json_body(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    """``openapi_extra`` for a route that reads a JSON body of ``schema`` (FastAPI's own body
    parsing is not used: the route reads and checks the body itself)."""
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": schema}}}}
