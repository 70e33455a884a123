"""``agentrl gateway``: the OpenAI-compatible gateway that records agents' episodes as training data.

    agentrl gateway --model DIR --upstream URL [--upstream URL ...] [--host 127.0.0.1] [--port N]
                    [--api-key KEY] [--out DIR] [--session-timeout S]

An agent asks for a session (``POST /v1/sessions``), points any OpenAI client at the
``base_url`` and ``api_key`` it gets, plays its episode, posts a reward and ends the session;
its calls become exact trajectories in ``DIR/trajectories.jsonl``. ``--model`` gives the
tokenizer and chat template; generation goes to the ``--upstream`` servers (``agentrl serve``
or SGLang) through ``RemoteEngine``. Prints ``agentrl gateway: ready on http://HOST:PORT`` once
it serves. The admin key can also come from ``$AGENTRL_GATEWAY_API_KEY``. Routes and the trust
boundary: ``agentrl.rollout.gateway_routes``.
"""

from __future__ import annotations

import argparse

READY = "agentrl gateway: ready on "


def register(subparsers) -> None:
    p = subparsers.add_parser("gateway", help="OpenAI-compatible gateway: agents' calls become trajectories",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model directory: the tokenizer and chat template")
    p.add_argument("--upstream", action="append", required=True, metavar="URL",
                   help="inference server (agentrl serve or SGLang); repeat for several")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=30100, help="port (default 30100; 0 picks a free one)")
    p.add_argument("--api-key", default=None,
                   help="admin key: opens sessions, reads stats (default $AGENTRL_GATEWAY_API_KEY; none: no auth)")
    p.add_argument("--out", default=None, help="folder for trajectories.jsonl (default: not written)")
    p.add_argument("--session-timeout", type=float, default=600.0,
                   help="idle seconds before a session is ended as failed data (default 600)")
    p.add_argument("--max-sessions", type=int, default=4096, help="sessions open at once (default 4096)")
    p.add_argument("--max-session-tokens", type=int, default=65536, help="tokens one session may hold (default 65536)")
    p.add_argument("--max-body-bytes", type=int, default=4 << 20, help="largest request body (default 4 MiB)")
    p.add_argument("--default-max-tokens", type=int, default=1024,
                   help="completion budget of a call that gives none (default 1024)")
    p.add_argument("--context-length", type=int, default=None,
                   help="prompt + completion limit (default: the upstream's max_model_len, when it reports one)")
    p.add_argument("--served-model-name", default=None, help="model id in /v1/models (default: --model)")
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=run)


def run(args) -> int:
    import logging
    import os

    from agentrl.client.remote_engine import RemoteEngine
    from agentrl.process.services import bind, run_app
    from agentrl.rollout.gateway import Gateway
    from agentrl.rollout.gateway_routes import build_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for name in ("session_timeout", "max_sessions", "max_session_tokens", "max_body_bytes", "default_max_tokens"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"agentrl gateway: --{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    engine = RemoteEngine(args.upstream)
    gateway = Gateway(engine, args.model, out=args.out, model=args.served_model_name or args.model,
                      max_session_tokens=args.max_session_tokens, default_max_tokens=args.default_max_tokens,
                      context_length=args.context_length, session_timeout_s=args.session_timeout,
                      max_sessions=args.max_sessions, close_engine=True)
    app = build_app(gateway, api_key=args.api_key or os.environ.get("AGENTRL_GATEWAY_API_KEY") or None,
                    max_body_bytes=args.max_body_bytes)

    async def learn_context_length() -> None:
        if gateway.context_length is None:
            gateway.context_length = await upstream_context_length(args.upstream)

    sock = bind(args.host, args.port)
    run_app(app, sock, ready_line=READY, log_level=args.log_level, before_ready=learn_context_length,
            timeout_keep_alive=120)
    return 0


async def upstream_context_length(upstreams: list[str]) -> int | None:
    """The smallest ``max_model_len`` the upstreams' ``/v1/models`` report (None: none reports one)."""
    import httpx

    found = []
    async with httpx.AsyncClient(timeout=10.0) as http:
        for url in upstreams:
            base = url.rstrip("/") if "://" in url else f"http://{url.rstrip('/')}"
            try:
                data = (await http.get(f"{base}/v1/models")).json()["data"]
                found += [int(m["max_model_len"]) for m in data if m.get("max_model_len")]
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                continue
    return min(found) if found else None
