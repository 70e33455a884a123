"""``agentrl eval``: run a workflow without training; pass@1 and pass@k with 95% intervals.

    agentrl eval CONFIG [key=value ...] [--k K] [--out DIR] [--curate OUT.jsonl]

Uses the run config's model, inference servers (started like ``agentrl train`` does, or
``inference.servers``), workflow and ``eval`` section (dataset, sampling, limit). Results per
problem go to ``DIR/eval.jsonl`` as they finish (with the tokens of ``--samples`` episodes
each, for ``agentrl view DIR``): the same command again resumes where it stopped.
``--curate`` writes the dataset without the problems solved in all K samples. The last line
printed is the report as one JSON object, also written to ``DIR/eval_summary.json`` when the
evaluation finishes. If ``rollout.max_failed_fraction`` (0.9) of the episodes failed, it exits
with code 1, giving the first error on stderr.
"""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser("eval", help="evaluate a model with a workflow (pass@k), without training",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("items", nargs="*", metavar="CONFIG|key=value", help="the YAML config, then overrides")
    p.add_argument("--k", type=int, default=None, help="samples per problem (default: eval.k)")
    p.add_argument("--out", default=None, help="directory for eval.jsonl (default: RUN_DIR/eval)")
    p.add_argument("--curate", default=None, metavar="OUT.jsonl", help="write the rows not always solved")
    p.add_argument("--samples", type=int, default=1, metavar="N",
                   help="episodes per problem whose tokens are kept in eval.jsonl for `agentrl view` (default 1)")
    p.set_defaults(func=run)


def run(args) -> int:
    import json
    from dataclasses import asdict
    from pathlib import Path

    from agentrl.cli.run_setup import split_items
    from agentrl.client.remote_engine import RemoteEngine
    from agentrl.config import load_config
    from agentrl.env.datasets import dataset_rows
    from agentrl.errors import ConfigError
    from agentrl.process.services import exit_on_signals, run_async
    from agentrl.rollout.evaluate import RESULTS, SUMMARY, curate, evaluate
    from agentrl.rollout.renderer import token_decoder
    from agentrl.rollout.workflow_inputs import close_workflow
    from agentrl.run.local_launcher import Run
    from agentrl.run.run_config import RunConfig, build_workflow, check_run_config
    from agentrl.run.run_lock import RunLock, describe

    config_path, overrides = split_items(args.items)
    if config_path is None:
        raise ConfigError("give a config file: agentrl eval CONFIG [key=value ...]")
    cfg = load_config(RunConfig, config_path, overrides)
    if not cfg.eval.dataset:
        raise ConfigError("config key 'eval.dataset' is empty: name the rows to evaluate on")
    k = args.k or cfg.eval.k
    if k < 1:
        raise ConfigError(f"--k must be >= 1, got {k}")
    if args.samples < 0:
        raise ConfigError(f"--samples must be >= 0, got {args.samples}")
    check_run_config(cfg)
    out = Path(args.out) if args.out else Path(cfg.run_dir) / "eval"
    if args.curate and not Path(args.curate).resolve().parent.is_dir():
        raise ConfigError(f"--curate: the directory of {args.curate!r} does not exist")
    rows = dataset_rows(cfg.eval.dataset, cfg.seed)[: cfg.eval.limit]
    if k > 1 and cfg.eval.sampling.temperature == 0:
        print(f"agentrl eval: note: k={k} greedy samples are identical; set eval.sampling.temperature > 0")
    lock = RunLock(out, "agentrl eval", what="--out" if args.out else "config key 'run_dir'").acquire()
    if lock.taken_over:
        print(f"agentrl eval: took over the lock of {describe(lock.taken_over)}, which ended without releasing it")
    try:
        same_settings(out, {"model": str(Path(cfg.model).resolve()), "dataset": cfg.eval.dataset,
                            "limit": cfg.eval.limit, "k": k, "sampling": asdict(cfg.eval.sampling),
                            "workflow": cfg.rollout.workflow,
                            "workflow_args": {**cfg.rollout.workflow_args, **cfg.eval.workflow_args}})
    except BaseException:
        lock.release()
        raise
    run = Run(cfg, out, name="agentrl eval")

    async def main() -> dict:
        async with RemoteEngine(urls, cfg.inference.client) as engine:
            workflow = build_workflow(cfg, cfg.eval.sampling, cfg.eval.workflow_args)
            try:
                report = await evaluate(workflow, engine, rows, k=k, concurrency=cfg.rollout.max_concurrent,
                                        out=out / RESULTS, samples=args.samples, decode=token_decoder(cfg.model))
            finally:
                await close_workflow(workflow)
        return report

    try:
        with exit_on_signals("agentrl eval"):  # a SIGTERM stops the servers it started, too
            urls = run.start_servers()
            report = run_async(main())
    finally:
        run.stop()
        lock.release()
    result = {"model": cfg.model, "dataset": cfg.eval.dataset, "k": k, **report.summary(),
              "out": str(out / RESULTS)}
    if report.first_error is not None:
        result["first_error"] = report.first_error
    if args.curate:
        result["curated"] = curate(rows, report, args.curate)
        result["curated_path"] = args.curate
    (out / SUMMARY).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result), flush=True)
    return 1 if mostly_failed(report, out, cfg.rollout.max_failed_fraction) else 0



def mostly_failed(report, out, threshold: float) -> bool:
    """Whether nearly every episode failed; if so, say so on stderr with the first error — such
    scores measure the failures, not the model, and a script should know."""
    import sys

    played = report.problems * report.k
    if not played or report.failed_episodes < threshold * played:
        return False
    print(f"agentrl eval: {report.failed_episodes} of {played} episodes failed; the scores measure the failures, "
          f"not the model. The first error: {report.first_error or '?'}. All of them: {out}/eval.jsonl, "
          f"`agentrl view {out}`", file=sys.stderr, flush=True)
    return True


def same_settings(out, settings: dict) -> None:
    """Resume ``out``'s results only if they were measured with these settings: refuse, naming
    what differs, when they were not (mixing them would report a score of no model at all)."""
    import json

    from agentrl.errors import ConfigError
    from agentrl.rollout.evaluate import RESULTS, SETTINGS, SUMMARY

    path, results = out / SETTINGS, out / RESULTS
    settings = json.loads(json.dumps(settings, default=str))
    if results.is_file() and results.stat().st_size and path.is_file():
        before = json.loads(path.read_text())
        differ = sorted(k for k in settings.keys() | before.keys() if settings.get(k) != before.get(k))
        if differ:
            shown = "; ".join(f"{k}: {before.get(k)!r} then, {settings.get(k)!r} now" for k in differ)
            raise ConfigError(f"{results} holds results measured with other settings ({shown}); "
                              f"evaluate into another --out, or delete {results} to start afresh")
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings, indent=1) + "\n")
    (out / SUMMARY).unlink(missing_ok=True)  # written again when this evaluation finishes
