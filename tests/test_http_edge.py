"""The edge the three HTTP services share (``agentrl.http_edge``): ``agentrl serve``, the gateway
and the sandbox service, each built in-process and called over ASGI.

The bug stories: each service had its own API-key check, body reader and error body — the
sandbox service answered FastAPI's ``{"detail": ...}``, ``agentrl serve`` ``{"error": {"message"}}``
and the gateway OpenAI's full object — and the gateway served ``/openapi.json``, ``/docs`` and
``/redoc`` without a key although its docstring said every route but ``/health`` needs one.
"""

from __future__ import annotations

import contextlib

import httpx
import pytest

from agentrl.api import ExecRequest, ExecResult, ExecStatus
from agentrl.errors import Refused
from agentrl.http_edge import parse_json

KEY = "edge-key"
LIMIT = 2048


class EchoSandbox:
    async def run(self, request: ExecRequest) -> ExecResult:
        return ExecResult(status=ExecStatus.OK, stdout=request.code)

    @contextlib.asynccontextmanager
    async def session(self):
        yield self


@pytest.fixture(scope="module", params=["serve", "gateway", "sandbox"])
def service(request, untrained_model_dir):
    """(the app, a route that reads a JSON body) for each service, with key ``KEY`` and a body
    limit of ``LIMIT`` bytes."""
    if request.param == "serve":
        from agentrl.inference.serve_config import ServeConfig
        from agentrl.inference.server import build_app

        config = ServeConfig(model=str(untrained_model_dir), api_key=KEY, max_request_bytes=LIMIT)
        return build_app(config), "/generate"
    if request.param == "gateway":
        from agentrl.rollout.gateway import Gateway
        from agentrl.rollout.gateway_routes import build_app

        return build_app(Gateway(None, untrained_model_dir), api_key=KEY, max_body_bytes=LIMIT), "/v1/sessions"
    from sandboxes.ceilings import Ceilings
    from sandboxes.service import build_app

    return build_app(EchoSandbox(), api_key=KEY, ceilings=Ceilings(max_request_bytes=LIMIT)), "/run"


def assert_error(r: httpx.Response, status: int, kind: str, says: str) -> None:
    """OpenAI's error body, the same from every service."""
    assert r.status_code == status, r.text
    body = r.json()
    assert list(body) == ["error"] and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert (body["error"]["type"], body["error"]["code"]) == (kind, status), body
    assert says in body["error"]["message"], body


async def test_every_refusal_has_one_error_body(service):
    app, route = service
    good = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://edge", timeout=30) as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            r = await http.post(route, headers=headers, json={})
            assert_error(r, 401, "authentication_error", "API key")
        # the docs describe every route: they need the key too
        for path in ("/openapi.json", "/docs", "/redoc"):
            assert_error(await http.get(path), 401, "authentication_error", "API key")
        assert (await http.get("/openapi.json", headers=good)).json()["paths"]
        # X-Api-Key is the other spelling of the key
        assert (await http.get("/openapi.json", headers={"X-Api-Key": KEY})).status_code == 200
        r = await http.post(route, headers={**good, "content-type": "application/json"}, content=b"{not json")
        assert_error(r, 400, "invalid_request_error", "not valid JSON")
        r = await http.post(route, headers=good, json={"padding": "x" * LIMIT})
        assert_error(r, 413, "invalid_request_error", f"limit of {LIMIT}")
        assert_error(await http.get("/no-such-route", headers=good), 404, "invalid_request_error", "Not Found")


async def test_probes_need_no_key():
    from sandboxes.service import build_app

    app = build_app(EchoSandbox(), api_key=KEY)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://edge") as http:
        assert (await http.get("/health")).status_code == 200
        assert (await http.post("/run", json={"code": "1"}, headers={"X-Api-Key": KEY})).json()["stdout"] == "1"


@pytest.mark.parametrize(("raw", "says"), [
    (b"", "empty"), (b"[1]", "must be a JSON object, got list"), (b"\xff", "not valid JSON"),
    (b"[" * 100_000, "nested too deeply"), (b'{"n": 1' + b"0" * 5000 + b"}", "not valid JSON"),
    (b'{"s": "\\ud800"}', "lone surrogate"),
])
def test_hardened_json_refuses_with_a_400(raw, says):
    with pytest.raises(Refused) as e:
        parse_json(raw)
    assert (e.value.status, e.value.type, says in e.value.message) == (400, "invalid_request_error", True), e.value
    assert parse_json(b'{"s": "\\ud83d\\ude00"}') == {"s": "\U0001f600"}  # a pair is one character
    assert parse_json(b" ", allow_empty=True) == {}


def test_the_exec_request_is_declared_once():
    """The sandbox service's body schema, its parser and ``ExecRequest`` itself read the same
    declaration: a bound in the schema is the bound the parser and the constructor enforce."""
    from agentrl.http_edge import body_schema, parse_body
    from sandboxes.admission import maxima
    from sandboxes.ceilings import Ceilings

    limits = maxima(Ceilings(max_time_s=5, max_fetch=2))
    schema = body_schema(ExecRequest, limits)
    props = schema["properties"]
    assert (schema["required"], schema["additionalProperties"]) == (["code"], False)
    assert props["language"]["enum"] == ["python", "bash"]
    assert (props["time_limit_s"]["exclusiveMinimum"], props["time_limit_s"]["maximum"]) == (0, 5)
    assert (props["memory_limit_mb"]["minimum"], props["fetch"]["maxItems"]) == (16, 2)
    for body, says in [({"code": "x", "memory_limit_mb": 15}, "memory_limit_mb must be >= 16"),
                       ({"code": "x", "time_limit_s": 6}, "ceiling max_time_s=5"),
                       ({"code": "x", "fetch": ["a", "b", "c"]}, "ceiling max_fetch=2"),
                       ({"code": "x", "language": "ruby"}, "language must be one of ['python', 'bash']"),
                       ({"code": "x", "files": {"a": 1}}, "files must be an object"),
                       ({"code": 5}, "code must be a string"), ({}, "has no code"),
                       ({"code": "x", "cod": "y"}, "unknown field(s) ['cod'] in the ExecRequest")]:
        with pytest.raises(Refused) as e:
            parse_body(ExecRequest, body, limits)
        assert (e.value.status, says in e.value.message) == (422, True), (body, e.value.message)
    with pytest.raises(ValueError, match="memory_limit_mb must be >= 16"):
        ExecRequest("x", memory_limit_mb=15)
    assert parse_body(ExecRequest, {"code": "x", "time_limit_s": 5}, limits) == ExecRequest("x", time_limit_s=5)
