"""The training loop of ``agentrl train``: one process per trainer rank, under torchrun.

What it is: ``python -m agentrl.run.loop RUN_DIR`` (the launcher runs it under ``torchrun``
after writing ``RUN_DIR/config.yaml``, while it starts the servers; rank 0 waits for
``RUN_DIR/servers.json``, written when they are ready). Every rank builds the
``Actor``; rank 0 also drives, on one event loop, the rollout side (the executor's episodes
against the inference servers: in a child process, ``rollout.worker: process``, or on this
loop, ``thread``; ``agentrl.run.rollout_side``) and the trainer's side of each step, so
generation never waits for training:

    eval (before) → rollout.start()
    loop: batch = await next_batch()  (B finished groups; generation goes on meanwhile —
          or, with placement colocated, is paused here, the servers' memory released if
          inference.release_memory: in-flight requests resume after the publish)
          → broadcast to every rank → prepare_batch → Actor.train_step (in a thread)
          → WeightPublisher: stage (every rank) → pause → send → continue (rank 0;
            trainer.weight_sync: a checkpoint on disk, or a broadcast over torch.distributed)
          → rollout.set_version(v) (admission moves on) → metrics, samples
          → every N steps: checkpoint (trainer shards + the executor's state)
    eval (after) → final checkpoint → curves.png, summary.json

The other ranks follow rank 0's commands (``train``, ``checkpoint``, ``stop``) broadcast
with ``torch.distributed``. Resuming (``RUN_DIR/checkpoints/latest`` exists): every rank
loads the trainer state, rank 0 restores the executor (data cursor, counters, the groups
admitted but not trained on) and the episode log replays their generations; the restored
weights are published to the servers first, so they serve the checkpoint's policy.

What it is not: the process launcher (``agentrl.run.local_launcher``) or the config
(``agentrl.run.run_config``). Main hook: ``main([RUN_DIR])``.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import gc
import json
import logging
import os
import shutil
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

log = logging.getLogger("agentrl.train")

CHECKPOINTS = "checkpoints"
LATEST = "latest"
TRUNCATION_WARNING = 0.2
"""A step whose completions stopped at the token budget this often or more is warned about (once)."""
PLOT_EVERY_S = 30.0
"""curves.png is redrawn at most this often during a run, by a process of its own that the steps
never wait for (matplotlib takes a core for a second or two, and in the trainer's process it would
hold the GIL the training step needs), and once at the end."""


def keep_freed_memory() -> None:
    """glibc's malloc keeps what the process frees (up to 2 GiB at the top of a heap) for its
    next allocations instead of giving it back to the kernel (``M_TRIM_THRESHOLD``), and serves
    blocks below 32 MiB from its heap rather than from fresh mappings (``M_MMAP_THRESHOLD``): a
    train step frees and allocates the same activations every step, and each page handed back is
    faulted in and zeroed again by the next. The process holds its peak heap from then on, as a
    GPU caching allocator does. Nothing is changed where the C library has no ``mallopt``."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(-1, (1 << 31) - 1)  # M_TRIM_THRESHOLD (a C int): trim only past 2 GiB free at the top
    mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: glibc's largest


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run (``checkpoints/latest`` names it), or None."""
    pointer = run_dir / CHECKPOINTS / LATEST
    if not pointer.is_file():
        return None
    path = run_dir / CHECKPOINTS / pointer.read_text().strip()
    return path if (path / "rollout.json").is_file() else None


class Trainer:
    """Rank-local state of the loop: the actor, the publisher, and (rank 0) the rollout side."""

    def __init__(self, run_dir: Path, cfg: Any) -> None:
        import torch

        from agentrl.trainer.actor import Actor, init_distributed
        from agentrl.trainer.publish import DiskTransport, DistributedTransport, WeightPublisher

        self.run_dir, self.cfg = run_dir, cfg
        torch.set_num_threads(cfg.threads)
        keep_freed_memory()
        # every step's update and checkpoint on one thread: one malloc arena holds their memory
        # (asyncio's default pool hands them to whichever of its threads is free, each with its own)
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agentrl-train")
        self.rank, self.world_size, _ = init_distributed()
        self.actor = Actor(cfg.model, cfg.trainer)
        sync = cfg.trainer.weight_sync
        if sync.transport == "distributed":
            backend = sync.backend_for(cfg.device)
            # torchrun (and the Ray launcher) export rank 0's address as MASTER_ADDR
            address = sync.master_address or os.environ.get("MASTER_ADDR") or cfg.master_addr
            self.transport = DistributedTransport(master_address=address,
                                                  master_port=sync.master_port, backend=backend,
                                                  bucket_bytes=int(sync.bucket_mb * (1 << 20)), flatten=sync.flatten,
                                                  timeout_s=sync.timeout_s, overlap=sync.overlap,
                                                  adapters=sync.adapters)
        else:
            self.transport = DiskTransport(run_dir / "weights", source_dir=cfg.model, keep_last=2,
                                           adapters=sync.adapters)
        self.engine = None
        self.publisher = WeightPublisher(self.transport, None)

    # ------------------------------------------------------------------ collectives

    def command(self, cmd: dict[str, Any] | None) -> dict[str, Any]:
        """Rank 0's command, on every rank."""
        import torch.distributed as dist

        box = [cmd]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def train(self, trajectories: list | None) -> tuple[dict[str, float], list, dict[int, dict[str, Any]]]:
        """One train step on every rank; returns the actor's statistics, the trajectories kept for
        the loss, and per-token facts of the first few for the sample (before the update: the
        trainer's log-probabilities and entropies; the advantage)."""
        from agentrl.trainer.batch import broadcast_trajectories, prepare_batch

        t0 = time.perf_counter()
        trajectories = broadcast_trajectories(trajectories)
        batch = prepare_batch(trajectories, version=self.actor.version, config=self.cfg.trainer)
        t1 = time.perf_counter()
        sample: dict[int, dict[str, Any]] = {}
        n = min(self.cfg.logging.trajectories_per_step, len(batch))
        for i, seq in enumerate(batch.sequences[:n]):
            on = seq["loss_mask"] > 0  # the advantage is one number on the loss tokens
            sample[i] = {"advantage": float(seq["advantages"][on][0]) if bool(on.any()) else 0.0}
        t2 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            stats = self.actor.train_step(batch, token_stats=n)  # the samples' trainer log-probs, before the update
        for w in caught:
            log.warning("step %d: %s", self.actor.version, w.message)
        for i, (lp, ent) in self.actor.last_token_stats.items():
            sample[i].update(trainer_logprobs=lp.tolist(), entropy=ent.tolist())
        stats.update({"perf/train_prepare_s": t1 - t0, "perf/train_sample_s": t2 - t1,
                      "perf/train_update_s": time.perf_counter() - t2})
        return stats, batch.trajectories, sample

    def checkpoint(self, step: int) -> Path:
        from agentrl.trainer.checkpoint import save_checkpoint

        path = self.run_dir / CHECKPOINTS / f"step_{step:06d}"
        save_checkpoint(self.actor, path / "trainer")
        return path

    def restore(self, path: Path) -> dict:
        from agentrl.trainer.checkpoint import load_checkpoint

        return load_checkpoint(self.actor, path / "trainer")

    # ------------------------------------------------------------------ other ranks

    def follow(self) -> None:
        """Ranks > 0: do what rank 0 says until it says stop."""
        while True:
            cmd = self.command(None)
            if cmd["op"] == "train":
                self.train(None)
            elif cmd["op"] == "publish":
                asyncio.run(self.publisher.apublish(self.actor.model, self.actor.version))
            elif cmd["op"] == "checkpoint":
                self.checkpoint(cmd["step"])
            elif cmd["op"] == "stop":
                return


async def lead(tr: Trainer, resume_from: Path | None, worker: Any = None) -> dict[str, Any]:
    """Rank 0: the rollout side (``worker``: a ``RolloutProcess`` already spawned; None: in this
    process) and the schedule of the steps."""
    from rich.console import Console

    from agentrl.api import TrajectoryStatus
    from agentrl.client.remote_engine import RemoteEngine
    from agentrl.plugins import sandbox_counters
    from agentrl.rollout.evaluate import evaluate
    from agentrl.rollout.renderer import token_decoder
    from agentrl.run.metrics import RunLog, batch_metrics, plot_curves
    from agentrl.run.rollout_side import LocalRollout
    from agentrl.run.run_config import build_workflow, dataset_rows, figure_value
    from agentrl.trainer.publish import WeightPublisher

    cfg, run_dir, actor = tr.cfg, tr.run_dir, tr.actor
    console = Console(stderr=True, soft_wrap=True)
    decode = token_decoder(cfg.model)  # each sampled trajectory's tokens, as text

    servers = await servers_ready(run_dir, cfg)
    engine = RemoteEngine(servers["servers"], cfg.inference.client, router=servers.get("router"),
                          version=actor.version)
    tr.engine = engine
    runlog = RunLog(run_dir, tensorboard=cfg.logging.tensorboard, wandb_project=cfg.logging.wandb_project,
                    trajectories_per_step=cfg.logging.trajectories_per_step, record=cfg.logging.record,
                    resume_step=actor.version if resume_from else None)
    resume = str(resume_from) if resume_from else None
    if worker is not None:  # the episodes in a process of their own, with a client of their own
        rollout: Any = worker
        opened = await worker.open(servers, actor.version, resume)
        local = None
    else:
        rollout = local = LocalRollout(cfg, run_dir)
        opened = await local.open(engine, actor.version, resume)
    tr.publisher = WeightPublisher(tr.transport, engine, before_pause=rollout.pause_admission,
                                   after_resume=rollout.resume_admission)
    eval_wf = eval_rows = None
    if cfg.eval.dataset:
        eval_wf = build_workflow(cfg, cfg.eval.sampling, cfg.eval.workflow_args)
        eval_rows = dataset_rows(cfg.eval.dataset, cfg.seed)[: cfg.eval.limit]
    summary: dict[str, Any] = json.loads((run_dir / "summary.json").read_text()) if resume_from and (
        run_dir / "summary.json").exists() else {}

    async def run_eval(step: int, label: str) -> float | None:
        if eval_wf is None:
            return None
        t0 = time.perf_counter()
        report = await evaluate(eval_wf, engine, eval_rows, k=cfg.eval.k, concurrency=cfg.rollout.max_concurrent)
        scores = report.summary()
        summary["eval_s"] = time.perf_counter() - t0
        runlog.log(step, {f"eval/{k}": v for k, v in scores.items()} | {"eval/seconds": time.perf_counter() - t0})
        figures = {name: figure_value(key, scores) for name, key in cfg.eval.figures.items()}
        for name, value in figures.items():  # NAME_before from the first evaluation, NAME_after from the last
            summary.setdefault(f"{name}_before", value)
            summary[f"{name}_after"] = value
        console.print(f"eval {label} (step {step}): pass@1 [bold]{scores['pass@1']:.3f}[/] "
                      f"± {scores['pass@1_ci95']:.3f} on {report.problems} held-out problems"
                      + "".join(f", {name} {'n/a' if v is None else f'{v:.3f}'}" for name, v in figures.items()))
        return scores["pass@1"]

    async def publish(cmd: bool = True) -> Any:
        if cmd and tr.world_size > 1:
            await asyncio.to_thread(tr.command, {"op": "publish"})
        return await tr.publisher.apublish(actor.model, actor.version)

    def set_version() -> None:
        """Admission moves on; a rollout process's client follows the publisher's."""
        rollout.set_version(actor.version, engine.policy() if worker is not None else None)

    async def publish_step() -> tuple[Any, dict[str, Any]]:
        """The step's publish, and the rollout's state right after it (deterministic mode: between
        the rounds the schedule fixes, so the same in every run; otherwise whenever it finishes)."""
        if local is None or local.lockstep is None:
            record = await publish()
            set_version()
            return record, await rollout.snapshot()

        async def between_rounds() -> tuple[Any, dict[str, Any]]:
            record = await publish()
            set_version()
            return record, await local.snapshot()
        return await local.lockstep.publish(actor.version, between_rounds)

    start_step = actor.version
    colocated = cfg.placement == "colocated"
    release = colocated and bool(cfg.inference.release_memory)
    started = time.perf_counter()
    if resume_from is not None:
        console.print(f"resumed from {resume_from.name}: version {actor.version}, "
                      f"{opened['pending']} groups to finish, {opened['logged']} logged episodes")
        await publish()  # the servers start from the base model: give them the checkpoint's weights
    elif "eval_before" not in summary:
        summary["eval_before"] = await run_eval(0, "before")
    summary.setdefault("steps", 0)
    stack = contextlib.AsyncExitStack()
    if local is not None and local.external:
        await serve_gateway(stack, cfg, run_dir, engine, local.executor, console)
    elif local is not None and local.recorded is not None:  # from the step after the checkpoint's
        local.recorded.feed(local.executor, first_step=actor.version, steps=cfg.steps)
        console.print(f"training on the recorded steps of {cfg.rollout.recorded} ({len(local.recorded.steps)} "
                      "steps; nothing generated)")
    else:
        await rollout.start()
    gc.freeze()  # and the rollout side's (workflow, tokenizer, envs, client): the steps' garbage alone is scanned
    t_last = time.perf_counter()
    cpu_last = time.thread_time()  # this thread runs the event loop: logging (rollout.worker thread: the episodes too)
    trainer_idle = 0.0
    gen_busy_last = (await rollout.snapshot())["busy_s"]
    warned_truncation = False
    plotted = time.perf_counter()
    plotter: asyncio.subprocess.Process | None = None  # the redraw of curves.png in progress
    step = start_step
    trained: list = []  # groups trained on since the last checkpoint: the log forgets them there
    try:
        while step < cfg.steps:
            if cfg.max_minutes is not None and (time.perf_counter() - started) / 60 + _eta(summary) > cfg.max_minutes:
                console.print(f"stopping: the next step would pass max_minutes={cfg.max_minutes}")
                break
            batch = await rollout.next_batch()
            trained.extend(batch.groups)
            trainer_idle += batch.wait_s
            trajectories = batch.trajectories
            if colocated:  # the trainer takes the cores (or GPU): generation stops until the publish resumes it
                await rollout.pause_admission()
                await engine.pause()
                if release:  # and the servers' memory, until the weight update (weights) and the resume (the rest)
                    await engine.release_memory()
            if tr.world_size > 1:
                await asyncio.to_thread(tr.command, {"op": "train"})
            t0 = time.perf_counter()
            stats, kept, sample = await asyncio.get_running_loop().run_in_executor(tr.pool, tr.train, trajectories)
            t1 = time.perf_counter()
            if release:
                await engine.occupy_memory(weights_only=True)
            record, rollout_now = await publish_step()
            step = actor.version
            if rollout_now["needs_rejoin"] and not engine.needs_rejoin:  # the rollout process's client saw a
                await engine.check_health()  # server come back without broadcast weights: the next publish rejoins it
            now = time.perf_counter()
            wall = now - t_last
            gen_busy = rollout_now["busy_s"]
            metrics = batch_metrics(trajectories, step - 1)
            metrics.update({(k if k.startswith(("batch/", "perf/")) else f"train/{k}"): v for k, v in stats.items()})
            sampled = metrics.get("rollout/sampled_tokens", 0.0)
            metrics.update({
                "perf/step_s": wall, "perf/train_s": t1 - t0, "perf/trainer_wait_s": batch.wait_s,
                "perf/weight_stage_s": record.stage_s, "perf/weight_pause_s": record.paused_s,
                "perf/weight_deliver_s": record.deliver_s,
                "perf/generation_tokens_per_s": sampled / max(wall, 1e-9),
                "perf/train_tokens_per_s": sum(len(t) for t in kept) / max(t1 - t0, 1e-9),
                "perf/trainer_idle_fraction": batch.wait_s / max(wall, 1e-9),
                "perf/generator_idle_fraction": 1.0 - min(1.0, (gen_busy - gen_busy_last) / max(wall, 1e-9)),
                **rollout_now["metrics"],
                "perf/loop_cpu_s": time.thread_time() - cpu_last,
                "perf/elapsed_min": (now - started) / 60,
            })
            gen_busy_last, t_last, cpu_last = gen_busy, now, time.thread_time()
            runlog.log(step, metrics)
            runlog.sample(step, kept, decode, sample,
                          failed=[t for t in trajectories if t.status is not TrajectoryStatus.OK])
            runlog.record(step, trajectories)
            console.print(f"step {step:>4}  reward {metrics.get('rollout/reward_mean', float('nan')):.3f}  "
                          f"loss {stats.get('loss', float('nan')):+.4f}  stale≤{int(stats.get('batch/staleness_max', 0))}"
                          f"  wait {batch.wait_s:.1f}s  step {wall:.1f}s  [{(now - started) / 60:.1f} min]")
            truncated = metrics.get("rollout/truncation_rate", 0.0)
            if truncated >= TRUNCATION_WARNING and not warned_truncation:
                warned_truncation = True
                console.print(f"[yellow]warning:[/] step {step}: {truncated:.0%} of the completions stopped at "
                              "the token budget (rollout.sampling.max_new_tokens); their answers are cut off — "
                              "raise it, or check the model stops (metric rollout/truncation_rate)")
            summary["steps"] = step
            if "first_error" not in summary:  # what a run whose episodes fail says first
                failed = next((t for t in trajectories if t.status is not TrajectoryStatus.OK), None)
                if failed is not None:
                    summary["first_error"] = f"{failed.status.value}: {(failed.error or '')[:500]}"
            summary["step_s_mean"] = (summary.get("step_s_mean", wall) * 0.8 + wall * 0.2)
            if cfg.eval.every_steps and step % cfg.eval.every_steps == 0 and step < cfg.steps:
                await run_eval(step, "at")
            if cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0:
                await save(tr, rollout, step, summary, trained)
            if now - plotted >= PLOT_EVERY_S and (plotter is None or plotter.returncode is not None):
                plotted = now
                plotter = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "agentrl.run.metrics", str(run_dir),
                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
                # the lowest priority: on a machine with few cores it runs in the generator's idle
                # time, not in the trainer's
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, plotter.pid, 19)
        await rollout.stop()
        summary["eval_after"] = await run_eval(step, "after")
        await save(tr, rollout, step, summary, trained)
    finally:
        if plotter is not None and plotter.returncode is None:
            await plotter.wait()  # its curves.png is redrawn below, after the summary
        await rollout.stop()
        await stack.aclose()
        if tr.world_size > 1:
            await asyncio.to_thread(tr.command, {"op": "stop"})
        closed = await rollout.aclose()
        runlog.close()
        with contextlib.suppress(Exception):  # the servers leave the weight group (distributed transport)
            await tr.transport.close(engine)
        await engine.aclose()
        if eval_wf is not None and hasattr(eval_wf, "aclose"):
            await eval_wf.aclose()
    summary["minutes"] = summary.get("minutes", 0.0) + (time.perf_counter() - started) / 60
    summary["run_dir"] = str(run_dir)
    summary["counters"] = closed["counters"]
    # the backend's own count (Docker), evaluations included: this process's and the rollout process's
    if "runs" in (sandbox := sandbox_counters() + (Counter(closed["sandbox"]) if worker is not None else Counter())):
        summary["sandbox_runs"] = sandbox["runs"]
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    plot_curves(run_dir)
    return summary


async def serve_gateway(stack: contextlib.AsyncExitStack, cfg: Any, run_dir: Path, engine: Any, executor: Any,
                        console: Any) -> None:
    """``rollout.source: gateway``: serve the run's gateway (until ``stack`` closes); its sessions
    are admitted within the staleness bound and their episodes become the executor's groups."""
    from agentrl.process.services import background_server
    from agentrl.rollout.external import GatewayEpisodes
    from agentrl.rollout.gateway import Gateway
    from agentrl.rollout.gateway_routes import build_app

    bridge = GatewayEpisodes(executor, cfg.rollout.group_size)
    gateway = Gateway(engine, cfg.model, cfg.gateway, out=run_dir / "gateway", on_episode=bridge.on_episode,
                      default_max_tokens=cfg.gateway.default_max_tokens or cfg.rollout.sampling.max_new_tokens)
    gateway.admission = bridge.admits
    stack.push_async_callback(gateway.aclose)
    api_key = os.environ.get(cfg.gateway.api_key_env) or None
    url = await stack.enter_async_context(background_server(build_app(gateway, api_key=api_key), cfg.gateway.host,
                                                            cfg.gateway.port))
    (run_dir / "gateway.json").write_text(json.dumps({"url": url, "api_key_env": cfg.gateway.api_key_env}))
    console.print(f"gateway ready on {url} (sessions: POST {url}/v1/sessions)")


async def servers_ready(run_dir: Path, cfg: Any) -> dict[str, Any]:
    """``servers.json``, once the launcher wrote it (the ranks start while the servers load)."""
    from agentrl.errors import ServerUnavailable
    from agentrl.run.local_launcher import SERVERS_FILE

    path = run_dir / SERVERS_FILE
    limit = cfg.inference.startup_timeout_s * max(1, cfg.inference.num_servers) + 60
    t0 = time.monotonic()
    while not path.exists():
        if time.monotonic() - t0 > limit:
            raise ServerUnavailable(f"{path} did not appear within {limit:.0f} s: the launcher writes it when the "
                                    "inference servers are ready (see RUN_DIR/logs/server-*.log)")
        await asyncio.sleep(0.05)
    return json.loads(path.read_text())


def _eta(summary: dict[str, Any]) -> float:
    """Minutes the next step and the final evaluation will take (as measured so far)."""
    return (summary.get("step_s_mean", 0.0) + summary.get("eval_s", 0.0)) / 60


async def save(tr: Trainer, rollout: Any, step: int, summary: dict[str, Any], trained: list) -> None:
    """Checkpoint: the trainer's shards (every rank), the executor's state, then the pointer; the
    episode log then forgets the groups trained on (a resume never needs them again)."""
    if tr.world_size > 1:
        await asyncio.to_thread(tr.command, {"op": "checkpoint", "step": step})
    path = await asyncio.get_running_loop().run_in_executor(tr.pool, tr.checkpoint, step)
    (path / "rollout.json").write_text(json.dumps(await rollout.checkpoint_state()))
    (tr.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    pointer = tr.run_dir / CHECKPOINTS / LATEST
    tmp = pointer.with_suffix(".tmp")
    tmp.write_text(path.name)
    os.replace(tmp, pointer)
    await rollout.forget([g.index for g in trained])
    trained.clear()
    kept = sorted(p for p in (tr.run_dir / CHECKPOINTS).glob("step_*") if p.is_dir())
    for old in kept[: -tr.cfg.checkpoint.keep_last]:
        if old != path:
            shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    from agentrl.config import load_config
    from agentrl.process.services import run_async
    from agentrl.run.placement import apply_rollout_worker
    from agentrl.run.run_config import RunConfig

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m agentrl.run.loop RUN_DIR   (run by `agentrl train` under torchrun)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    run_dir = Path(args[0])
    cfg = load_config(RunConfig, run_dir / "config.yaml")
    apply_rollout_worker(cfg)  # (agentrl train resolved it already: a config run by hand may say auto)
    worker = None
    if cfg.rollout.worker == "process" and int(os.environ.get("RANK", "0")) == 0:
        from agentrl.run.rollout_side import RolloutProcess

        worker = RolloutProcess.spawn(run_dir)  # its imports and workflow load while the trainer's model does
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tr = Trainer(run_dir, cfg)
    resume_from = latest_checkpoint(run_dir)
    if resume_from is not None:
        tr.restore(resume_from)
    # What is loaded so far (torch, transformers, the model and its optimizer) lives as long as
    # the run: out of the cyclic GC's full passes, as in agentrl serve (DESIGN.md §4, the
    # training loop, "Placement")
    gc.freeze()
    if tr.rank == 0:
        summary = run_async(lead(tr, resume_from, worker))
        print("agentrl train: summary " + json.dumps(summary), flush=True)
    else:
        tr.follow()
    import torch.distributed as dist

    dist.destroy_process_group()
    # Its work done and its process group destroyed, every rank leaves without the interpreter's
    # teardown (atexit handlers still run: the Docker sandbox pool removes its containers there).
    # On rank 0 that teardown (torch's and transformers' modules, C++ static destructors) took
    # ~2 s of every run, which the launcher waits for. A follower on another node was seen
    # aborting in those destructors ("terminate called without an active exception", no Python
    # frame; 3 of ~25 two-node runs on a loaded machine), which failed its torchrun and left node
    # 0's waiting 300 s at the exit barrier.
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
