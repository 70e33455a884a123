"""``agentrl service``: the trainer as a service, speaking the Tinker API (the ``tinker`` SDK 0.38's).

    agentrl service --model DIR --api-key tml-KEY [--port N] [--dir runs/service] [--ttl 600]

Many clients train LoRA adapters of one base model at once: each ``create_lora_training_client``
gets its own adapter and AdamW (``agentrl.service.learner``); sampling goes to an ``agentrl
serve`` the service starts on the same model (or to ``--sampler URL``: an ``agentrl serve`` or
SGLang already running, with ``--sampler-key``; or a vLLM server with ``--sampler-engine vllm``),
each request naming its client's adapter.
Point the SDK at it with ``TINKER_BASE_URL=http://127.0.0.1:PORT`` and ``TINKER_API_KEY=KEY``.
The key must start with ``tml-`` (the SDK sends no other); it can come from
$AGENTRL_SERVICE_API_KEY instead of the command line. Checkpoints go under ``--dir``.
Prints ``agentrl service: ready on http://HOST:PORT`` once it serves. Routes:
``agentrl.service.routes``; guide: docs/guides/tinker_service.md.
"""

from __future__ import annotations

import argparse

READY = "agentrl service: ready on "
API_KEY_ENV = "AGENTRL_SERVICE_API_KEY"
SAMPLERS = {"sglang": "agentrl.service.sampler:Sampler", "vllm": "agentrl.service.vllm_sampler:VllmSampler"}
"""``--sampler-engine``: the class that speaks that server's routes (imported when the service starts)."""


def register(subparsers) -> None:
    p = subparsers.add_parser("service", help="the trainer as a service: the Tinker API, many LoRA clients",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the base model directory (HF format)")
    p.add_argument("--model-name", default=None,
                   help="the base model's name to clients (default: the directory's absolute path, which the "
                        "SDK's and cookbook's get_tokenizer can load)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (0 picks a free one)")
    p.add_argument("--api-key", default=None, help=f"the key clients send (tml-...); default ${API_KEY_ENV}")
    p.add_argument("--dir", default="runs/service", help="where checkpoints are kept (default runs/service)")
    p.add_argument("--ttl", type=float, default=600.0,
                   help="seconds without a heartbeat after which a session's clients are freed (default 600)")
    p.add_argument("--max-rank", type=int, default=128, help="the largest LoRA rank a client may ask for")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where the trainer runs (auto: cuda when a GPU is visible)")
    p.add_argument("--sampler", default=None, metavar="URL",
                   help="an inference server already running (agentrl serve or SGLang with LoRA enabled); "
                        "default: start agentrl serve on --model")
    p.add_argument("--sampler-key", default=None, help="that server's API key")
    p.add_argument("--sampler-engine", default="sglang", choices=tuple(SAMPLERS),
                   help="the --sampler server's routes: sglang (agentrl serve's and SGLang's) or vllm (a vLLM "
                        "server started with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the agentrl serve it starts")
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=run)


def run(args) -> int:
    import asyncio
    import logging
    import os
    import secrets
    from pathlib import Path

    from agentrl.errors import ConfigError
    from agentrl.plugins import load_object
    from agentrl.process.services import ServerProcess, bind, run_app
    from agentrl.service.futures import Futures
    from agentrl.service.learner import Learner
    from agentrl.service.registry import ServiceState
    from agentrl.service.routes import Service, build_app
    from agentrl.service.sampler import Sampler

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    key = args.api_key or os.environ.get(API_KEY_ENV)
    if not key or not key.startswith("tml-"):
        raise ConfigError(f"agentrl service needs an API key starting with 'tml-' (the tinker SDK sends no other): "
                          f"pass --api-key tml-SOMETHING or set ${API_KEY_ENV}")
    sampler_cls = load_object(SAMPLERS[args.sampler_engine])
    if args.sampler is None and sampler_cls is not Sampler:  # the agentrl serve started below speaks Sampler's routes
        raise ConfigError("--sampler-engine vllm needs --sampler URL (a vLLM server already running); without "
                          "--sampler the service starts agentrl serve")
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        raise ConfigError(f"cannot listen on {args.host}:{args.port} ({e.strerror or e}); pick another --port "
                          "(0 picks a free one)") from None
    model_dir = Path(args.model)
    learner = Learner(model_dir, max_rank=args.max_rank, device=args.device)
    server = None
    if args.sampler is None:
        serve_key = secrets.token_hex(16)
        server = ServerProcess(model_dir, "--log-level", args.log_level, threads=args.threads,
                               extra_env={"AGENTRL_SERVE_API_KEY": serve_key})
        url, sampler_key = server.url, serve_key
    else:
        url, sampler_key = args.sampler, args.sampler_key
    sampler = sampler_cls(url, sampler_key)
    try:
        state = ServiceState(args.dir, args.model_name or str(model_dir.resolve()), ttl_s=args.ttl)
        service = Service(state=state, learner=learner, sampler=sampler, futures=Futures(), key=key,
                          context_length=int(getattr(learner.base.config, "max_position_embeddings", 1024)))
        reaper: set[asyncio.Task] = set()

        async def start() -> None:
            reaper.add(asyncio.create_task(reap(service)))

        run_app(build_app(service), sock, ready_line=READY, log_level=args.log_level, before_ready=start,
                timeout_keep_alive=120)
    finally:
        if server is not None:
            server.stop()
    return 0


async def reap(service) -> None:
    """Free the clients of sessions past their TTL, every quarter TTL."""
    import asyncio

    from agentrl.service.routes import free

    while True:
        await asyncio.sleep(max(1.0, service.state.ttl_s / 4))
        free(service, service.state.expired())
