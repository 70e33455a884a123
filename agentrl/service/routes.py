"""The Tinker API's routes, as the ``tinker`` SDK 0.38 calls them (``tinker/resources/*.py``).

What it is: ``build_app(service)`` — one FastAPI app behind ``agentrl.http_edge.ApiKey`` (the
SDK sends its key as ``X-API-Key``; every route needs it). The routes, all under ``/api/v1``:

  * the client's start: ``healthz``, ``client/config`` (flags: no JWT exchange, plain httpx, no
    zstd, per-request polling), ``client/dynamic_config``, ``create_session``,
    ``session_heartbeat``, ``telemetry`` (accepted, dropped), ``get_server_capabilities`` (the
    one base model);
  * training: ``create_model``, ``get_info``, ``forward_backward`` (protobuf), ``optim_step``,
    ``save_weights``, ``save_weights_for_sampler``, ``load_weights``,
    ``training_runs/{id}/checkpoints``;
  * sampling: ``create_sampling_session``, ``samplers/{id}``, ``asample``;
  * ``retrieve_future``: the long poll every asynchronous call above ends in — the result
    (JSON, or protobuf when the SDK's ``Accept`` asks for it), a ``RequestFailedResponse``, or
    ``{"type": "try_again"}`` while it runs.

A request the service cannot take is refused at once (4xx, the shared error body; the SDK raises
its ``BadRequestError``/``NotFoundError``); a request whose fault shows only when it runs fails
its future (the SDK raises ``RequestFailedError``). What it is not: the work
(``learner``, ``sampler``) or the bookkeeping (``registry``, ``futures``).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from agentrl.errors import Refused
from agentrl.http_edge import ApiKey, install_errors, read_body, read_json
from agentrl.service.futures import Futures, Proto
from agentrl.service.learner import Learner, LoraSettings
from agentrl.service.proto import forward_backward_output, read_forward_backward
from agentrl.service.registry import ServiceState
from agentrl.service.sampler import Sampler

PROTO = "application/x-protobuf"
ADAM = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0, "grad_clip_norm": 0.0}
"""The SDK's ``AdamParams`` defaults (``tinker/types/optimizer.py``)."""
CLIENT_CONFIG = {"pjwt_auth_enabled": False, "use_pyqwest_transport": False, "proto_compress_fwdbwd": False,
                 "sample_use_retrieve_futures": False, "custom_loss_server_side": False,
                 "sample_join_sampling_session": False}


@dataclass
class Service:
    """Everything the routes use."""

    state: ServiceState
    learner: Learner
    sampler: Sampler
    futures: Futures
    key: str
    max_request_bytes: int = 64 << 20
    poll_s: float = 20.0
    context_length: int = 1024


def build_app(service: Service) -> FastAPI:
    app = FastAPI(title="agentrl service (Tinker API)", docs_url=None, redoc_url=None)
    app.add_middleware(ApiKey, key=service.key)
    install_errors(app)
    _client_routes(app, service)
    _training_routes(app, service)
    _checkpoint_routes(app, service)
    _sampling_routes(app, service)

    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request):
        body = await _body(service, request)
        result = await service.futures.wait(body.get("request_id"), service.poll_s)
        if result is None:
            return {"type": "try_again", "request_id": body.get("request_id"), "queue_state": "active"}
        if isinstance(result, Proto):
            return Response(result.body, media_type=PROTO)
        return result

    return app


async def _body(service: Service, request: Request) -> dict[str, Any]:
    return await read_json(request, service.max_request_bytes, "--max-request-bytes")


async def _model_body(service: Service, request: Request) -> tuple[dict[str, Any], str, Any]:
    """A body naming a training client: the body, its ``model_id`` and the client's session
    (an unknown client is refused by ``model_session``)."""
    body = await _body(service, request)
    model_id = body.get("model_id")
    return body, model_id, service.state.model_session(model_id)


def _client_routes(app: FastAPI, service: Service) -> None:
    state = service.state

    @app.get("/api/v1/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.post("/api/v1/client/config")
    async def client_config():
        return CLIENT_CONFIG

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config():
        return {}

    @app.post("/api/v1/telemetry")
    async def telemetry():
        return {"status": "accepted"}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities():
        return {"supported_models": [{"model_name": state.base_model, "max_context_length": service.context_length,
                                      "trainable": True, "sampleable": True}]}

    @app.post("/api/v1/create_session")
    async def create_session():
        return {"type": "create_session", "session_id": state.new_session()}

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request):
        body = await _body(service, request)
        state.session(body.get("session_id"))
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str):
        if session_id in state.sessions:  # one that expired already is ended: nothing to do
            free(service, [state.end(session_id)])
        return {}


def free(service: Service, sessions: list[Any]) -> None:
    """Queue the freeing of ended sessions' adapters and optimizers (after their pending calls)."""
    for session in sessions:
        for model_id in session.models:
            service.futures.submit(lambda m=model_id: service.learner.drop(m))


def _check_base(state: ServiceState, base: Any) -> None:
    if base not in (None, state.base_model):
        raise Refused(f"base_model {str(base)[:120]!r} is not served here; this service serves {state.base_model!r}")


def _training_routes(app: FastAPI, service: Service) -> None:
    state, learner, futures = service.state, service.learner, service.futures

    @app.post("/api/v1/create_model")
    async def create_model(request: Request):
        body = await _body(service, request)
        session = state.session(body.get("session_id"))
        _check_base(state, body.get("base_model"))
        lora = body.get("lora_config") or {}
        if not isinstance(lora.get("rank"), int):
            raise Refused("create_model needs lora_config.rank (an integer): this service trains LoRA adapters only")
        settings = LoraSettings(rank=lora["rank"], seed=lora.get("seed"), train_attn=bool(lora.get("train_attn", True)),
                                train_mlp=bool(lora.get("train_mlp", True)),
                                train_unembed=bool(lora.get("train_unembed", True)))
        model_id = f"{session.session_id}:train:{body.get('model_seq_id', len(session.models))}"
        if model_id in state.models:
            raise Refused(f"training client {model_id!r} exists already; model_seq_id must be new in its session")

        def job() -> dict[str, Any]:
            learner.create(model_id, settings)
            state.models[model_id] = session.session_id
            session.models.add(model_id)
            return {"model_id": model_id, "type": "create_model"}

        return {"request_id": futures.submit(job), "model_id": model_id}

    @app.post("/api/v1/get_info")
    async def get_info(request: Request):
        body, model_id, _ = await _model_body(service, request)
        s = learner.settings[model_id]
        return {"type": "get_info", "model_id": model_id, "is_lora": True, "lora_rank": s.rank,
                "model_name": state.base_model,
                "model_data": {"arch": type(learner.base).__name__, "model_name": state.base_model,
                               "tokenizer_id": str(learner.model_dir.resolve())}}

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request):
        if request.headers.get("content-encoding", "identity") != "identity":
            raise Refused("compressed forward_backward bodies are not read here; this service's client config "
                          "asks for none (proto_compress_fwdbwd is false)", 415)
        if PROTO not in request.headers.get("content-type", ""):
            raise Refused(f"forward_backward takes a protobuf body ({PROTO}), as the tinker SDK sends it", 415)
        fb = read_forward_backward(await read_body(request, service.max_request_bytes, "--max-request-bytes"))
        state.model_session(fb.model_id)

        def job() -> Proto:
            outputs, metrics = learner.forward_backward(fb)
            return Proto(forward_backward_output(outputs, metrics))

        return {"request_id": futures.submit(job), "model_id": fb.model_id}

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request):
        body, model_id, _ = await _model_body(service, request)
        given = body.get("adam_params")
        if not isinstance(given, dict):
            raise Refused("optim_step needs adam_params (tinker.AdamParams): this service's optimizer is AdamW")
        adam = {**ADAM, **{k: v for k, v in given.items() if k in ADAM}}
        bad = [k for k, v in adam.items() if not isinstance(v, (int, float)) or v != v or v < 0]
        if bad or not 0 <= adam["beta1"] < 1 or not 0 <= adam["beta2"] < 1:
            raise Refused(f"adam_params must hold numbers >= 0 with beta1 and beta2 below 1; got {given}")
        return {"request_id": futures.submit(lambda: {"metrics": learner.optim_step(model_id, adam)}),
                "model_id": model_id}


def _checkpoint_routes(app: FastAPI, service: Service) -> None:
    state, learner, futures = service.state, service.learner, service.futures

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request):
        body, model_id, _ = await _model_body(service, request)
        path, directory = state.checkpoint(model_id, "weights", body.get("path"))
        if directory.exists() and not body.get("overwrite"):
            raise Refused(f"a checkpoint {path!r} exists; pick another name or pass overwrite=True", 409)

        def job() -> dict[str, Any]:
            if directory.exists():
                shutil.rmtree(directory)
            directory.parent.mkdir(parents=True, exist_ok=True)
            learner.save_state(model_id, directory)
            return {"path": path, "type": "save_weights"}

        return {"request_id": futures.submit(job), "model_id": model_id}

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request: Request):
        body, model_id, session = await _model_body(service, request)
        path, directory = state.checkpoint(model_id, "sampler_weights", body.get("path"))
        if directory.exists():
            raise Refused(f"a checkpoint {path!r} exists; pick another name", 409)
        named = body.get("path") is not None

        def job() -> dict[str, Any]:
            directory.parent.mkdir(parents=True, exist_ok=True)
            learner.export(model_id, directory)
            if named:
                return {"path": path, "type": "save_weights_for_sampler"}
            sampler_id = _new_sampler(state, session.session_id, path, directory)
            return {"path": path, "sampling_session_id": sampler_id, "type": "save_weights_for_sampler"}

        return {"request_id": futures.submit(job), "model_id": model_id}

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request):
        body = await _body(service, request)
        directory = state.resolve(body.get("path"))
        optimizer = bool(body.get("optimizer"))
        if body.get("model_id") is not None:
            model_id = body["model_id"]
            session = state.model_session(model_id)
        else:  # create-via-load: the load is the new client's first request
            session = state.session(body.get("session_id"))
            _check_base(state, body.get("base_model"))
            model_id = f"{session.session_id}:train:{body.get('model_seq_id')}"
            if model_id in state.models:
                raise Refused(f"training client {model_id!r} exists already; model_seq_id must be new")

        def job() -> dict[str, Any]:
            learner.load_state(model_id, directory, optimizer=optimizer)
            state.models[model_id] = session.session_id
            session.models.add(model_id)
            return {"path": body["path"], "model_id": model_id, "type": "load_weights"}

        return {"request_id": futures.submit(job), "model_id": model_id}

    @app.get("/api/v1/training_runs/{model_id}/checkpoints")
    async def checkpoints(model_id: str):
        return {"checkpoints": state.list_checkpoints(model_id), "cursor": None}


def _new_sampler(state: ServiceState, session_id: str, model_path: str | None, adapter_dir: Any) -> str:
    from agentrl.service.registry import SamplingSession

    sampler_id = f"{session_id}:sample:{len(state.samplers)}"
    state.samplers[sampler_id] = SamplingSession(sampler_id, session_id, model_path, adapter_dir)
    if session_id in state.sessions:
        state.sessions[session_id].samplers.add(sampler_id)
    return sampler_id


def _sampling_routes(app: FastAPI, service: Service) -> None:
    state, futures, sampler = service.state, service.futures, service.sampler

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request):
        body = await _body(service, request)
        session = state.session(body.get("session_id"))
        model_path = body.get("model_path")
        if model_path is None:
            _check_base(state, body.get("base_model"))
            if body.get("base_model") is None:
                raise Refused(f"create_sampling_session needs base_model ({state.base_model!r}) or model_path")
            adapter_dir = None
        else:
            adapter_dir = state.resolve(model_path, "sampler_weights")
        return {"type": "create_sampling_session",
                "sampling_session_id": _new_sampler(state, session.session_id, model_path, adapter_dir)}

    @app.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str):
        s = _sampling_session(state, sampler_id)
        return {"sampler_id": s.sampler_id, "base_model": state.base_model, "model_path": s.model_path}

    @app.post("/api/v1/asample")
    async def asample(request: Request):
        body = await _body(service, request)
        if body.get("sampling_session_id") is not None:
            s = _sampling_session(state, body["sampling_session_id"])
            state.session(s.session_id)
            adapter_dir = s.adapter_dir
        elif body.get("model_path") is not None:
            adapter_dir = state.resolve(body["model_path"], "sampler_weights")
        else:
            _check_base(state, body.get("base_model"))
            adapter_dir = None

        async def job() -> Proto:
            name = await sampler.adapter(adapter_dir) if adapter_dir is not None else None
            return Proto(await sampler.sample(body, name))

        n = body.get("num_samples", 1)
        rid = futures.spawn(job())
        return {"request_id": rid, "sample_sequence_ids": [f"{rid}:{i}" for i in range(n if isinstance(n, int) else 1)]}


def _sampling_session(state: ServiceState, sampler_id: Any) -> Any:
    s = state.samplers.get(sampler_id) if isinstance(sampler_id, str) else None
    if s is None:
        raise Refused(f"no sampling session {str(sampler_id)[:80]!r} on this service (never created, or its "
                      "session expired); create a sampling client", 404)
    return s
