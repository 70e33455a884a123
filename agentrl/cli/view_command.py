"""``agentrl view``: look at a run in a browser — its curves, and every sampled token it trained on.

    agentrl view RUN_DIR [--port N] [--host 127.0.0.1]          serve the page (live while the run goes on)
    agentrl view RUN_DIR --compare OTHER_RUN [--compare ...]     the curves of several runs on the same axes
    agentrl view RUN_DIR --export report.html [--max-mb 20]      one self-contained file, opens offline

RUN_DIR is the run_dir of ``agentrl train`` (metrics.jsonl, trajectories/) or the output of
``agentrl eval`` (eval/eval.jsonl, or a directory holding eval.jsonl). The page needs nothing
but this server: no CDN, no other asset. Served, it prints ``agentrl view: ready on
http://HOST:PORT`` and polls for new steps; exported, it is a snapshot whose longest
trajectories are cut (and marked) to keep the file under --max-mb.
"""

from __future__ import annotations

import argparse

VIEW_READY = "agentrl view: ready on "


def register(subparsers) -> None:
    p = subparsers.add_parser("view", help="look at a run in a browser: its curves, its tokens",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (of agentrl train or agentrl eval)")
    p.add_argument("--compare", action="append", default=[], metavar="RUN_DIR",
                   help="another run whose curves are drawn beside it (repeatable)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    p.add_argument("--export", metavar="OUT.html", default=None, help="write one self-contained HTML file and exit")
    p.add_argument("--max-mb", type=float, default=20.0, help="size bound of --export in MiB (default 20)")
    p.set_defaults(func=run)


def run(args) -> int:
    from agentrl.errors import ConfigError
    from agentrl.view.rundata import RunData

    runs = [RunData(args.run_dir), *(RunData(path) for path in args.compare)]
    if args.export:
        import json

        from agentrl.view.export import export_report

        if args.max_mb <= 0:
            raise ConfigError(f"--max-mb must be > 0, got {args.max_mb}")
        report = export_report(runs, args.export, max_bytes=int(args.max_mb * 1024 * 1024))
        for note in report["notes"]:
            print(f"agentrl view: {note}")
        print(json.dumps(report), flush=True)
        return 0
    from agentrl.process.services import bind, run_app
    from agentrl.view.viewer import build_app

    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        raise ConfigError(f"cannot listen on {args.host}:{args.port} ({e.strerror}); pick another with --port "
                          "(0 picks a free one)") from None
    run_app(build_app(runs), sock, ready_line=VIEW_READY)
    return 0
