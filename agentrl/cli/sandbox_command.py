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

CEILINGS = "sandboxes.ceilings:Ceilings"
"""The service's ceilings, whose fields are ``serve``'s ``--max-*`` flags (``GET /health``
shows the values in force). By import path: the core never imports ``sandboxes`` by name."""


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
    s.add_argument("--backend", choices=("local", "docker"), default="docker", help="backend (default docker)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8100, help="port (default 8100; 0 picks a free one)")
    s.add_argument("--api-key", default=None, help="require this key (default: $AGENTRL_SANDBOX_API_KEY, or none)")
    s.add_argument("--max-concurrency", type=int, default=8, help="executions at once (default 8)")
    s.add_argument("--max-queue", type=int, default=256, help="requests waiting before 503 (default 256)")
    s.add_argument("--pool-size", type=int, default=None, help="docker: warm containers (default = max-concurrency)")
    s.add_argument("--cgroup-parent", default="", help="cgroup the jails or containers nest under")
    s.add_argument("--uid-base", type=int, default=0,
                   help="first uid programs run as (local: one per jail slot; docker: one per container; 0 = default)")
    s.add_argument("--insecure", action="store_true",
                   help="allow a non-loopback --host without an API key (anyone reaching it runs code)")
    s.add_argument("--max-processes", type=int, default=64, help="processes one program may have (default 64)")
    s.add_argument("--python", default="", help="local: interpreter programs run under (default: this one)")
    s.add_argument("--local-mode", choices=("auto", "root", "rootless"), default="auto",
                   help="local: root jails, or rootless ones in bubblewrap (default: root when root)")
    add_arguments(s.add_argument_group("ceilings of one request"), load_object(CEILINGS))
    s.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
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
    import logging
    import os

    from agentrl.config import from_args
    from agentrl.errors import ConfigError
    from agentrl.plugins import load_object, make_sandbox
    from agentrl.process.services import bind, run_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    api_key = args.api_key if args.api_key is not None else os.environ.get("AGENTRL_SANDBOX_API_KEY", "")
    if not api_key and not _loopback(args.host) and not args.insecure:
        raise ConfigError(
            f"refusing to listen on {args.host} without an API key: anyone who reaches it could run code "
            "on this machine; pass --api-key (or set AGENTRL_SANDBOX_API_KEY), or --insecure if the "
            "network is yours alone"
        )
    ceilings = from_args(load_object(CEILINGS), args)
    options = {"cgroup_parent": args.cgroup_parent, "max_processes": args.max_processes}
    if args.backend == "docker":
        options["pool_size"] = args.pool_size or args.max_concurrency
        if args.uid_base:
            options["uid"] = args.uid_base
    else:
        options.update(max_concurrency=args.max_concurrency, uid_base=args.uid_base, python=args.python,
                       mode=args.local_mode)
    sandbox = make_sandbox(args.backend, **options)
    build_app = load_object("sandboxes.service:build_app")
    app = build_app(sandbox, backend=args.backend, api_key=api_key, max_concurrency=args.max_concurrency,
                    max_queue=args.max_queue, ceilings=ceilings)
    run_app(app, bind(args.host, args.port), ready_line="agentrl sandbox serve: ready on ",
            log_level=args.log_level, before_ready=getattr(sandbox, "start", None))
    return 0
