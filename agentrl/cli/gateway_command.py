"""``agentrl gateway``: the OpenAI-compatible gateway that records agents' episodes as training data.

    agentrl gateway --model DIR --upstream URL [--upstream URL ...] [--host 127.0.0.1] [--port N]
                    [--api-key KEY] [--out DIR] [--session-timeout S]

An agent asks for a session (``POST /v1/sessions``), points any OpenAI client at the
``base_url`` and ``api_key`` it gets, plays its episode, posts a reward and ends the session;
its calls become exact trajectories in ``DIR/trajectories.jsonl``. ``--model`` gives the
tokenizer and chat template; generation goes to the ``--upstream`` servers (``agentrl serve``
or SGLang) through ``RemoteEngine``. Prints ``agentrl gateway: ready on http://HOST:PORT`` once
it serves. The admin key can also come from ``$AGENTRL_GATEWAY_API_KEY`` (or the variable
``--api-key-env`` names). The upstream servers' key (``agentrl serve --api-key``, SGLang's) comes
from ``$AGENTRL_SERVE_API_KEY`` and goes with every upstream call; an upstream that refuses it is
answered 502 (never 401: the agent's own key is fine). The settings' flags are generated from ``GatewayConfig``
(``agentrl.rollout.gateway_config``), the same type as a training run's ``gateway`` section;
``--model``, ``--upstream``, ``--out`` and ``--api-key`` are this command's wiring. Routes and
the trust boundary: ``agentrl.rollout.gateway_routes``.
"""

from __future__ import annotations

import argparse

READY = "agentrl gateway: ready on "


def register(subparsers) -> None:
    from agentrl.config import add_arguments
    from agentrl.rollout.gateway_config import GatewayConfig

    p = subparsers.add_parser("gateway", help="OpenAI-compatible gateway: agents' calls become trajectories",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model directory: the tokenizer and chat template")
    p.add_argument("--upstream", action="append", required=True, metavar="URL",
                   help="inference server (agentrl serve or SGLang); repeat for several")
    p.add_argument("--out", default=None, help="folder for trajectories.jsonl (default: not written)")
    p.add_argument("--api-key", default=None,
                   help="admin key: opens sessions, reads stats (default: the variable --api-key-env names; "
                        "none: no auth)")
    add_arguments(p, GatewayConfig)
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=run)


def run(args) -> int:
    import logging
    import os

    from agentrl.client.remote_engine import RemoteEngine
    from agentrl.config import from_args
    from agentrl.process.services import bind, run_app
    from agentrl.rollout.gateway import Gateway
    from agentrl.rollout.gateway_config import GatewayConfig
    from agentrl.rollout.gateway_routes import build_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = from_args(GatewayConfig, args)
    engine = RemoteEngine(args.upstream)
    gateway = Gateway(engine, args.model, config, out=args.out, close_engine=True)
    app = build_app(gateway, api_key=args.api_key or os.environ.get(config.api_key_env) or None)

    async def learn_context_length() -> None:
        if gateway.config.context_length is None:
            gateway.config.context_length = await upstream_context_length(args.upstream)

    sock = bind(config.host, config.port)
    run_app(app, sock, ready_line=READY, log_level=args.log_level, before_ready=learn_context_length,
            timeout_keep_alive=120)
    return 0


async def upstream_context_length(upstreams: list[str]) -> int | None:
    """The smallest ``max_model_len`` the upstreams' ``/v1/models`` report (None: none reports one)."""
    import httpx

    from agentrl.http_edge import server_auth

    found = []
    async with httpx.AsyncClient(timeout=10.0, headers=server_auth()) as http:
        for url in upstreams:
            base = url.rstrip("/") if "://" in url else f"http://{url.rstrip('/')}"
            try:
                data = (await http.get(f"{base}/v1/models")).json()["data"]
                found += [int(m["max_model_len"]) for m in data if m.get("max_model_len")]
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                continue
    return min(found) if found else None
