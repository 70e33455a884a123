"""``agentrl sandbox``: run a file in a sandbox, or serve a sandbox backend over HTTP.

    agentrl sandbox run [--backend local|docker|URL] [--timeout S] [--memory MB] FILE
    agentrl sandbox serve --backend docker|local [--host 127.0.0.1] [--port N] [--api-key K]

``run`` prints the ExecResult as one JSON object and exits 0 when the program's status is
``ok``, 1 otherwise. ``serve`` prints ``agentrl sandbox serve: ready on http://HOST:PORT``
once it listens (``--port 0`` picks a free port); the key may also come from
``AGENTRL_SANDBOX_API_KEY``. Backends are resolved by ``agentrl.plugins.make_sandbox``.
"""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
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
    language = args.language or ("bash" if args.file.endswith(".sh") else "python")
    request = ExecRequest(code=code, language=language, stdin=stdin, time_limit_s=args.timeout,
                          memory_limit_mb=args.memory)
    kwargs: dict = {}
    if args.backend.startswith(("http://", "https://")):
        kwargs["api_key"] = args.api_key
    elif args.backend == "docker":
        kwargs["pool_size"] = 1  # one run: one container
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


def serve(args) -> int:
    import logging
    import os

    from agentrl.launch.services import bind, run_app
    from agentrl.plugins import load_object, make_sandbox

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    api_key = args.api_key if args.api_key is not None else os.environ.get("AGENTRL_SANDBOX_API_KEY", "")
    options = {"cgroup_parent": args.cgroup_parent}
    if args.backend == "docker":
        options["pool_size"] = args.pool_size or args.max_concurrency
        if args.uid_base:
            options["uid"] = args.uid_base
    else:
        options["max_concurrency"] = args.max_concurrency
        options["uid_base"] = args.uid_base
    sandbox = make_sandbox(args.backend, **options)
    build_app = load_object("sandboxes.service:build_app")
    app = build_app(sandbox, backend=args.backend, api_key=api_key, max_concurrency=args.max_concurrency,
                    max_queue=args.max_queue)
    run_app(app, bind(args.host, args.port), ready_line="agentrl sandbox serve: ready on ",
            log_level=args.log_level, before_ready=getattr(sandbox, "start", None))
    return 0
