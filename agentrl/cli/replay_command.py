"""``agentrl replay``: score a finished run's recorded episodes again with another reward function.

    agentrl replay RUN_DIR --reward MODULE:FN [--out DIR]

Nothing is generated and no environment is stepped: each episode's record (``RUN_DIR/record/``,
written by ``agentrl train`` with ``logging.record``, the default) gives the reply, task,
transcript and facts its env's rubric scored, and ``MODULE:FN`` — a function of one
``agentrl.env.RewardInput`` returning a number (async allowed), or a ``Rubric`` — scores them
again. The run's rows with the new rewards go to ``--out`` (default
``RUN_DIR/replay/MODULE.FN/``, the same shape as ``record/``: ``rollout.source=DIR`` trains on
them); the run's own files are never written. The last line is one JSON object: episodes,
rescored, changed (how many rewards differ from the recorded ones), unscored (failed episodes,
records cut by ``logging.record_max_bytes``), the mean rewards before and after, and out.
"""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser("replay", help="re-score a run's recorded episodes with another reward function",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory of agentrl train (or its record/ folder)")
    p.add_argument("--reward", required=True, metavar="MODULE:FN",
                   help="the reward function (RewardInput -> number) or Rubric to score with")
    p.add_argument("--out", default=None, metavar="DIR", help="where the re-scored rows go "
                                                              "(default RUN_DIR/replay/MODULE.FN; new or empty)")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out (an earlier replay's rows)")
    p.set_defaults(func=run)


def run(args) -> int:
    import json

    from agentrl.run.replay import run_replay

    summary = run_replay(args.run_dir, args.reward, args.out, force=args.force)
    print(f"agentrl replay: {summary['changed']} of {summary['rescored']} rescored episodes changed reward "
          f"({summary['unscored']} not rescored); rows in {summary['out']}")
    print(json.dumps(summary), flush=True)
    return 0
