"""``agentrl serve``: run the embedded inference server (SGLang's HTTP API) on a checkpoint.

    agentrl serve --model examples/tiny-model [--host 127.0.0.1] [--port 30000] [--device cpu]

Prints one line ``agentrl serve: ready on http://HOST:PORT`` once the model is loaded and the
socket listens (tests and scripts wait for it). See ``agentrl.inference.server`` for the routes;
the flags are generated from ``ServeConfig`` (``agentrl.inference.serve_config``), which
documents each one.
The port is taken before the model loads: a port in use, or a checkpoint that fails validation,
ends the command with one line on stderr and exit code 2, and no "ready" line.

With ``--api-key KEY`` (or the key in $AGENTRL_SERVE_API_KEY, which keeps it out of process
listings) every route but ``/health*`` and ``/ready`` needs ``Authorization: Bearer KEY``.
"""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    from agentrl.config import add_arguments
    from agentrl.inference.serve_config import ServeConfig

    p = subparsers.add_parser("serve", help="serve a model over SGLang's HTTP API (continuous batching)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p, ServeConfig)
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=run)


def run(args) -> int:
    import gc
    import logging
    import os

    from agentrl.config import from_args
    from agentrl.errors import ConfigError
    from agentrl.inference.serve_config import API_KEY_ENV, ServeConfig
    from agentrl.inference.server import build_app
    from agentrl.inference.state import ServerState
    from agentrl.process.services import SERVE_READY, bind, run_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = from_args(ServeConfig, args, api_key=args.api_key or os.environ.get(API_KEY_ENV) or None)
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
    # out of the cyclic GC's full passes (DESIGN.md §4, the training loop, "Placement")
    gc.freeze()
    # keep idle connections 120 s: a trainer step between two rollouts outlasts uvicorn's 5 s default
    run_app(build_app(config, state), sock, ready_line=SERVE_READY, log_level=args.log_level,
            timeout_keep_alive=120)
    return 0
