"""``agentrl serve``: run the embedded inference server (SGLang's HTTP API) on a checkpoint.

    agentrl serve --model examples/tiny-model [--host 127.0.0.1] [--port 30000] [--device cpu]

Prints one line ``agentrl serve: ready on http://HOST:PORT`` once the model is loaded and the
socket listens (tests and scripts wait for it). See ``agentrl.inference.server`` for the routes.
The port is taken before the model loads: a port in use, or a checkpoint that fails validation,
ends the command with one line on stderr and exit code 2, and no "ready" line.

With ``--api-key KEY`` (or the key in $AGENTRL_SERVE_API_KEY, which keeps it out of process
listings) every route but ``/health*`` and ``/ready`` needs ``Authorization: Bearer KEY``.
"""

from __future__ import annotations

import argparse

API_KEY_ENV = "AGENTRL_SERVE_API_KEY"


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve a model over SGLang's HTTP API (continuous batching)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="Hugging Face checkpoint directory")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="port (default 30000; 0 picks a free one)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the model runs")
    p.add_argument("--max-running-requests", type=int, default=64, help="KV-cache slots (default 64)")
    p.add_argument("--context-length", type=int, default=None,
                   help="longest prompt + output (default min(model max positions, 4096))")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--weight-version", default="default", help="initial weight version (default 'default')")
    p.add_argument("--served-model-name", default=None, help="model id in /v1/models (default: --model)")
    p.add_argument("--seed", type=int, default=0, help="engine RNG seed for unseeded requests")
    p.add_argument("--disable-radix-cache", action="store_true",
                   help="no prefix cache: compute every prompt in full (SGLang's flag)")
    p.add_argument("--prefix-cache-tokens", type=int, default=None,
                   help="tokens of KV the prefix cache keeps (default min(slots x context, 32768))")
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on every route but /health* and /ready "
                        f"(default: ${API_KEY_ENV}, else none)")
    p.add_argument("--max-n", type=int, default=256, help="most samples one request may ask for (default 256)")
    p.add_argument("--max-top-logprobs-num", type=int, default=64,
                   help="most alternatives per position in top_logprobs_num (default 64)")
    p.add_argument("--max-queued-requests", type=int, default=4096,
                   help="most requests waiting or running; more are refused with 503 (default 4096)")
    p.add_argument("--max-request-bytes", type=int, default=64 << 20,
                   help="largest request body in bytes (default 64 MiB)")
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=run)


def run(args) -> int:
    import gc
    import logging
    import os

    from agentrl.config import from_dict
    from agentrl.errors import ConfigError
    from agentrl.inference.server import build_app
    from agentrl.inference.state import ServeConfig, ServerState
    from agentrl.process.services import SERVE_READY, bind, run_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = from_dict(ServeConfig, {
        "model": args.model, "host": args.host, "port": args.port, "device": args.device,
        "max_running_requests": args.max_running_requests, "context_length": args.context_length,
        "threads": args.threads, "weight_version": args.weight_version,
        "served_model_name": args.served_model_name, "seed": args.seed,
        "disable_radix_cache": args.disable_radix_cache, "prefix_cache_tokens": args.prefix_cache_tokens,
        "api_key": args.api_key or os.environ.get(API_KEY_ENV) or None, "max_n": args.max_n,
        "max_top_logprobs_num": args.max_top_logprobs_num, "max_queued_requests": args.max_queued_requests,
        "max_request_bytes": args.max_request_bytes,
    })
    try:  # the port first: a port in use should not cost a model load to find out
        sock = bind(config.host, config.port)
    except OSError as e:
        raise ConfigError(f"cannot listen on {config.host}:{config.port} ({e.strerror or e}); pick another "
                          "--port (0 picks a free one)") from None
    config.port = sock.getsockname()[1]
    try:
        state = ServerState(config)
    except BaseException:
        sock.close()
        raise
    # Everything loaded so far (torch, transformers, the model) lives as long as the server:
    # keep it out of the cyclic GC, whose full passes over it took 0.1-0.6 s each.
    gc.freeze()
    # keep idle connections 120 s: a trainer step between two rollouts outlasts uvicorn's 5 s default
    run_app(build_app(config, state), sock, ready_line=SERVE_READY, log_level=args.log_level,
            timeout_keep_alive=120)
    return 0
