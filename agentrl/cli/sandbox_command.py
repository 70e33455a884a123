"""``agentrl sandbox``: run a file in a sandbox, or serve a sandbox backend over HTTP.

    agentrl sandbox run [--backend local|docker|URL] [--timeout S] [--memory MB] FILE
    agentrl sandbox serve --backend docker|local [--host 127.0.0.1] [--port N] [--api-key K]
                          [--max-time-s S] [--max-memory-mb MB] [--max-code-bytes N] ...

``run`` prints the ExecResult as one JSON object and exits 0 when the program's status is
``ok``, 1 otherwise. ``serve`` prints ``agentrl sandbox serve: ready on http://HOST:PORT``
once it listens (``--port 0`` picks a free port); the key may also come from
``AGENTRL_SANDBOX_API_KEY``. It refuses a non-loopback ``--host`` without a key (anyone who
reaches the port could run code) unless told ``--insecure``. The ``--max-*`` options are the
ceilings of what one request may ask for, generated from ``sandboxes.ceilings.Ceilings``. The
local backend runs rootless (bubblewrap) when not root, or with ``--local-mode rootless``.
Backends are resolved by ``agentrl.plugins.make_sandbox``.
"""

from __future__ import annotations

import argparse

SERVICE = "sandboxes.service_config:SandboxServiceConfig"
LIMITS = "sandboxes.program_limits:BackendLimits"
CEILINGS = "sandboxes.ceilings:Ceilings"
"""``serve``'s flags are the fields of these three: the service's settings, what every program
runs under, and the ceilings of one request (``--max-*``; ``GET /health`` shows them). By
import path: the core never imports ``sandboxes`` by name."""


def register(subparsers) -> None:
    from agentrl.config import add_arguments
    from agentrl.plugins import load_object

    p = subparsers.add_parser("sandbox", help="run code in a sandbox, or serve one over HTTP",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(group_parser=p)
    sub = p.add_subparsers(dest="sandbox_command", metavar="{run,serve}")

    r = sub.add_parser("run", help="run FILE and print its ExecResult as JSON")
    r.add_argument("file", metavar="FILE", help="program to run ('-' reads stdin)")
    r.add_argument("--backend", default="local", help="local, docker, or a sandbox service URL (default local)")
    r.add_argument("--language", choices=("python", "bash"), default=None,
                   help="default: bash for .sh files, python otherwise")
    r.add_argument("--timeout", type=float, default=10.0, help="wall-clock limit in seconds (default 10)")
    r.add_argument("--memory", type=int, default=512, help="memory limit in MB (default 512)")
    r.add_argument("--stdin", default=None, help="file whose contents become the program's stdin")
    r.add_argument("--api-key", default=None, help="key of a sandbox service (default: $AGENTRL_SANDBOX_API_KEY)")
    r.add_argument("--python", default="", help="local: interpreter programs run under (default: this one)")
    r.set_defaults(func=run)

    s = sub.add_parser("serve", help="serve a sandbox backend over HTTP")
    add_arguments(s, load_object(SERVICE))
    add_arguments(s.add_argument_group("what every program runs under"), load_object(LIMITS))
    add_arguments(s.add_argument_group("ceilings of one request"), load_object(CEILINGS))
    s.set_defaults(func=serve)


def run(args) -> int:
    import asyncio
    import json
    import sys

    from agentrl.api import ExecRequest
    from agentrl.errors import ConfigError
    from agentrl.plugins import make_sandbox

    try:
        code = sys.stdin.read() if args.file == "-" else open(args.file, encoding="utf-8").read()
        stdin = open(args.stdin, encoding="utf-8").read() if args.stdin else ""
    except OSError as e:
        raise ConfigError(f"cannot read {e.filename}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{args.file if args.file != '-' else 'stdin'} (or --stdin) is not UTF-8 text "
                          f"({e.reason} at byte {e.start}); pass a Python or bash source file") from e
    language = args.language or ("bash" if args.file.endswith(".sh") else "python")
    try:
        request = ExecRequest(code=code, language=language, stdin=stdin, time_limit_s=args.timeout,
                              memory_limit_mb=args.memory)
    except ValueError as e:
        raise ConfigError(f"{e} (set by --timeout / --memory)") from e
    kwargs: dict = {}
    if args.backend.startswith(("http://", "https://")):
        kwargs["api_key"] = args.api_key
    elif args.backend == "docker":
        kwargs["pool_size"] = 1  # one run: one container
    elif args.backend == "local" and args.python:
        kwargs["python"] = args.python
    sandbox = make_sandbox(args.backend, **kwargs)

    async def main():
        try:
            return await sandbox.run(request)
        finally:
            close = getattr(sandbox, "aclose", None)
            if close is not None:
                await close()

    result = asyncio.run(main())
    print(json.dumps(result.to_dict()))
    return 0 if result.ok else 1


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def serve(args) -> int:
    import dataclasses
    import logging
    import os

    from agentrl.config import from_args
    from agentrl.errors import ConfigError
    from agentrl.plugins import load_object, make_sandbox
    from agentrl.process.services import bind, run_app

    service = from_args(load_object(SERVICE), args)
    limits = from_args(load_object(LIMITS), args)
    ceilings = from_args(load_object(CEILINGS), args)
    logging.basicConfig(level=service.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    api_key = service.api_key if service.api_key is not None else os.environ.get("AGENTRL_SANDBOX_API_KEY", "")
    if not api_key and not _loopback(service.host) and not service.insecure:
        raise ConfigError(
            f"refusing to listen on {service.host} without an API key: anyone who reaches it could run code "
            "on this machine; pass --api-key (or set AGENTRL_SANDBOX_API_KEY), or --insecure if the "
            "network is yours alone"
        )
    sandbox = make_sandbox(service.backend, **dataclasses.asdict(limits), **service.backend_options())
    build_app = load_object("sandboxes.service:build_app")
    app = build_app(sandbox, backend=service.backend, api_key=api_key, max_concurrency=service.max_concurrency,
                    max_queue=service.max_queue, ceilings=ceilings)
    run_app(app, bind(service.host, service.port), ready_line="agentrl sandbox serve: ready on ",
            log_level=service.log_level, before_ready=getattr(sandbox, "start", None))
    return 0
