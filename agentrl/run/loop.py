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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.run.rollout_side import RolloutSide

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
        self.critic = None  # trainer.advantages.kind gae: the value model beside the actor
        if cfg.trainer.advantages.kind == "gae":
            from agentrl.trainer.critic import Critic

            self.critic = Critic(self.actor, cfg.trainer)
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
        critic = self.critic.assign_advantages(batch) if self.critic is not None else {}  # gae: V, then A
        t1 = time.perf_counter()
        sample: dict[int, dict[str, Any]] = {}
        n = min(self.cfg.logging.trajectories_per_step, len(batch))
        for i, seq in enumerate(batch.sequences[:n]):
            on = seq["loss_mask"] > 0  # the advantage on the first loss token (all of them but with gae or turn)
            sample[i] = {"advantage": float(seq["advantages"][on][0]) if bool(on.any()) else 0.0}
        t2 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            stats = self.actor.train_step(batch, token_stats=n)  # the samples' trainer log-probs, before the update
            if self.critic is not None:
                t3 = time.perf_counter()
                stats.update(critic, **self.critic.train_step(batch), **{"perf/critic_update_s": time.perf_counter() - t3})
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
        if self.critic is not None:
            save_checkpoint(self.critic, path / "critic")  # type: ignore[arg-type]  # the actor's surface
        return path

    def restore(self, path: Path) -> dict:
        from agentrl.errors import CheckpointError
        from agentrl.trainer.checkpoint import load_checkpoint

        meta = load_checkpoint(self.actor, path / "trainer")
        if self.critic is not None:
            if not (path / "critic").is_dir():
                raise CheckpointError(f"{str(path)!r} holds no critic (it was saved without trainer.advantages.kind "
                                      "gae); resume with the advantages kind the run was saved with")
            load_checkpoint(self.critic, path / "critic")  # type: ignore[arg-type]
        return meta

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


async def lead(tr: Trainer, resume_from: Path | None, worker: RolloutSide | None = None) -> dict[str, Any]:
    """Rank 0: set up → the steps → evaluate and save → clean up (``worker``: a ``RolloutProcess``
    already spawned; None: the rollout side in this process). Returns the run's summary."""
    leader = await Leader.set_up(tr, resume_from, worker)
    try:
        await leader.begin()
        while leader.step < tr.cfg.steps and not leader.out_of_time():
            await leader.train_step()
        await leader.finish()
    finally:
        closed = await leader.aclose()
    return leader.write_summary(closed)


class Leader:
    """Rank 0's side of a run (``lead`` drives it): the rollout side, the evaluation, the weight
    publisher and, each step, a batch → train (every rank) → publish → metrics, samples, record
    → evaluation and checkpoint when due."""

    def __init__(self, tr: Trainer, resume_from: Path | None, engine: Any, rollout: RolloutSide) -> None:
        from rich.console import Console

        from agentrl.rollout.renderer import token_decoder
        from agentrl.run.metrics import RunLog

        cfg = tr.cfg
        self.tr, self.cfg, self.run_dir, self.resume_from = tr, cfg, tr.run_dir, resume_from
        self.engine, self.rollout = engine, rollout
        self.console = Console(stderr=True, soft_wrap=True)
        self.decode = token_decoder(cfg.model)  # each sampled trajectory's tokens, as text
        self.runlog = RunLog(self.run_dir, tensorboard=cfg.logging.tensorboard, wandb_project=cfg.logging.wandb_project,
                             trajectories_per_step=cfg.logging.trajectories_per_step, record=cfg.logging.record,
                             resume_step=tr.actor.version if resume_from else None)
        summary = self.run_dir / "summary.json"
        self.summary: dict[str, Any] = json.loads(summary.read_text()) if resume_from and summary.exists() else {}
        self.opened: dict[str, int] = {}  # what the rollout side's open said: groups pending, episodes logged
        self.eval_workflow: Any = None
        self.eval_rows: list[dict[str, Any]] = []
        self.step = tr.actor.version
        self.colocated = cfg.placement == "colocated"
        self.release = self.colocated and bool(cfg.inference.release_memory)
        self.started = self.t_last = self.plotted = time.perf_counter()
        self.cpu_last = time.thread_time()  # this thread runs the event loop: logging (and episodes, thread worker)
        self.gen_busy_last = 0.0  # generation's busy seconds at the last step
        self.trained: list = []  # groups trained on since the last checkpoint: the log forgets them there
        self.warned_truncation = False
        self.plotter: asyncio.subprocess.Process | None = None  # the redraw of curves.png in progress

    # ------------------------------------------------------------------ set up

    @classmethod
    async def set_up(cls, tr: Trainer, resume_from: Path | None, worker: RolloutSide | None) -> Leader:
        """The servers' client, the rollout side opened over it, the publisher with its hooks, the evaluation."""
        from agentrl.client.remote_engine import RemoteEngine
        from agentrl.env.datasets import dataset_rows
        from agentrl.run.rollout_side import LocalRollout
        from agentrl.run.run_config import build_workflow
        from agentrl.trainer.publish import WeightPublisher

        cfg, version = tr.cfg, tr.actor.version
        servers = await servers_ready(tr.run_dir, cfg)
        engine = RemoteEngine(servers["servers"], cfg.inference.client, router=servers.get("router"), version=version)
        tr.engine = engine
        rollout = worker if worker is not None else LocalRollout(cfg, tr.run_dir)
        leader = cls(tr, resume_from, engine, rollout)
        leader.opened = await rollout.open(engine, servers, version, str(resume_from) if resume_from else None)
        tr.publisher = WeightPublisher(tr.transport, engine, before_pause=rollout.pause_admission,
                                       after_resume=rollout.resume_admission)
        if cfg.eval.dataset:
            leader.eval_workflow = build_workflow(cfg, cfg.eval.sampling, cfg.eval.workflow_args)
            leader.eval_rows = dataset_rows(cfg.eval.dataset, cfg.seed)[: cfg.eval.limit]
        return leader

    async def begin(self) -> None:
        """Resumed: the servers get the checkpoint's weights (they start from the base model);
        else the evaluation before. Then the rollout side starts."""
        if self.resume_from is not None:
            self.console.print(f"resumed from {self.resume_from.name}: version {self.step}, "
                               f"{self.opened['pending']} groups to finish, {self.opened['logged']} logged episodes")
            await self.publish()
        elif "eval_before" not in self.summary:
            self.summary["eval_before"] = await self.evaluate(0, "before")
        self.summary.setdefault("steps", 0)
        if (line := await self.rollout.start()) is not None:
            self.console.print(line)
        gc.freeze()  # and the rollout side's (workflow, tokenizer, envs, client): the steps' garbage alone is scanned
        self.t_last, self.cpu_last = time.perf_counter(), time.thread_time()
        self.gen_busy_last = (await self.rollout.snapshot())["busy_s"]

    # ------------------------------------------------------------------ the steps

    def out_of_time(self) -> bool:
        """Whether the next step and the final evaluation would pass ``max_minutes`` (said if so)."""
        limit = self.cfg.max_minutes
        if limit is None or (time.perf_counter() - self.started) / 60 + _eta(self.summary) <= limit:
            return False
        self.console.print(f"stopping: the next step would pass max_minutes={limit}")
        return True

    async def train_step(self) -> None:
        """One step: the next batch, trained on by every rank, published, logged, then what is due."""
        batch = await self.rollout.next_batch()
        self.trained.extend(batch.groups)
        if self.colocated:  # the trainer takes the cores (or GPU): generation stops until the publish resumes it
            await self.rollout.pause_admission()
            await self.engine.pause()
            if self.release:  # and the servers' memory, until the weight update (weights) and the resume (the rest)
                await self.engine.release_memory()
        if self.tr.world_size > 1:
            await asyncio.to_thread(self.tr.command, {"op": "train"})
        t0 = time.perf_counter()
        stats, kept, sample = await asyncio.get_running_loop().run_in_executor(self.tr.pool, self.tr.train,
                                                                               batch.trajectories)
        train_s = time.perf_counter() - t0
        if self.release:
            await self.engine.occupy_memory(weights_only=True)
        record, rollout_now = await self.rollout.publish(self.tr.actor.version, self.publish)
        self.step = self.tr.actor.version
        if rollout_now["needs_rejoin"] and not self.engine.needs_rejoin:  # the rollout process's client saw a
            await self.engine.check_health()  # server come back without broadcast weights: the next publish rejoins it
        metrics = self.step_metrics(batch, stats, kept, record, rollout_now, train_s)
        self.report(batch, metrics, stats, kept, sample)
        await self.when_due()

    async def publish(self) -> Any:
        """The actor's weights to the servers, every rank joining; returns the ``PublishRecord``."""
        if self.tr.world_size > 1:
            await asyncio.to_thread(self.tr.command, {"op": "publish"})
        return await self.tr.publisher.apublish(self.tr.actor.model, self.tr.actor.version)

    def step_metrics(self, batch: Any, stats: dict[str, float], kept: list, record: Any,
                     rollout_now: dict[str, Any], train_s: float) -> dict[str, float]:
        """The step's metrics: the batch's, the trainer's, the weight publish's, the rollout's, and time."""
        from agentrl.run.metrics import batch_metrics

        now = time.perf_counter()
        wall = now - self.t_last
        gen_busy = rollout_now["busy_s"]
        metrics = batch_metrics(batch.trajectories, self.step - 1)
        metrics.update({(k if k.startswith(("batch/", "perf/")) else f"train/{k}"): v for k, v in stats.items()})
        metrics.update({
            "perf/step_s": wall, "perf/train_s": train_s, "perf/trainer_wait_s": batch.wait_s,
            "perf/weight_stage_s": record.stage_s, "perf/weight_pause_s": record.paused_s,
            "perf/weight_deliver_s": record.deliver_s,
            "perf/generation_tokens_per_s": metrics.get("rollout/sampled_tokens", 0.0) / max(wall, 1e-9),
            "perf/train_tokens_per_s": sum(len(t) for t in kept) / max(train_s, 1e-9),
            "perf/trainer_idle_fraction": batch.wait_s / max(wall, 1e-9),
            "perf/generator_idle_fraction": 1.0 - min(1.0, (gen_busy - self.gen_busy_last) / max(wall, 1e-9)),
            **rollout_now["metrics"],
            "perf/loop_cpu_s": time.thread_time() - self.cpu_last,
            "perf/elapsed_min": (now - self.started) / 60,
        })
        self.gen_busy_last, self.t_last, self.cpu_last = gen_busy, now, time.thread_time()
        return metrics

    def report(self, batch: Any, metrics: dict[str, float], stats: dict[str, float], kept: list,
               sample: dict[int, dict[str, Any]]) -> None:
        """The step into the run's log, samples and record, its line on the terminal, the summary;
        a warning the first time completions stop at the token budget this often."""
        from agentrl.api import TrajectoryStatus

        step, trajectories = self.step, batch.trajectories
        failed = [t for t in trajectories if t.status is not TrajectoryStatus.OK]
        self.runlog.log(step, metrics)
        self.runlog.sample(step, kept, self.decode, sample, failed=failed)
        self.runlog.record(step, trajectories)
        wall = metrics["perf/step_s"]
        self.console.print(f"step {step:>4}  reward {metrics.get('rollout/reward_mean', float('nan')):.3f}  "
                           f"loss {stats.get('loss', float('nan')):+.4f}  stale≤{int(stats.get('batch/staleness_max', 0))}"
                           f"  wait {batch.wait_s:.1f}s  step {wall:.1f}s  [{metrics['perf/elapsed_min']:.1f} min]")
        truncated = metrics.get("rollout/truncation_rate", 0.0)
        if truncated >= TRUNCATION_WARNING and not self.warned_truncation:
            self.warned_truncation = True
            self.console.print(f"[yellow]warning:[/] step {step}: {truncated:.0%} of the completions stopped at "
                               "the token budget (rollout.sampling.max_new_tokens); their answers are cut off — "
                               "raise it, or check the model stops (metric rollout/truncation_rate)")
        self.summary["steps"] = step
        if "first_error" not in self.summary and failed:  # what a run whose episodes fail says first
            self.summary["first_error"] = f"{failed[0].status.value}: {(failed[0].error or '')[:500]}"
        self.summary["step_s_mean"] = (self.summary.get("step_s_mean", wall) * 0.8 + wall * 0.2)

    async def when_due(self) -> None:
        """After a step: the evaluation and the checkpoint every N steps, and curves.png redrawn."""
        cfg, step = self.cfg, self.step
        if cfg.eval.every_steps and step % cfg.eval.every_steps == 0 and step < cfg.steps:
            await self.evaluate(step, "at")
        if cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0:
            await save(self.tr, self.rollout, step, self.summary, self.trained)
        now = time.perf_counter()
        if now - self.plotted >= PLOT_EVERY_S and (self.plotter is None or self.plotter.returncode is not None):
            self.plotted = now
            self.plotter = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "agentrl.run.metrics", str(self.run_dir),
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
            # the lowest priority: on a machine with few cores it runs in the generator's idle
            # time, not in the trainer's
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, self.plotter.pid, 19)

    async def evaluate(self, step: int, label: str) -> float | None:
        """The held-out evaluation (None without ``eval.dataset``): logged, its figures in the
        summary (NAME_before from the first, NAME_after from the last), its line printed."""
        from agentrl.rollout.eval_config import figure_value
        from agentrl.rollout.evaluate import evaluate

        if self.eval_workflow is None:
            return None
        cfg, t0 = self.cfg, time.perf_counter()
        report = await evaluate(self.eval_workflow, self.engine, self.eval_rows, k=cfg.eval.k,
                                concurrency=cfg.rollout.max_concurrent)
        scores = report.summary()
        self.summary["eval_s"] = time.perf_counter() - t0
        self.runlog.log(step, {f"eval/{k}": v for k, v in scores.items()} | {"eval/seconds": time.perf_counter() - t0})
        figures = {name: figure_value(key, scores) for name, key in cfg.eval.figures.items()}
        for name, value in figures.items():
            self.summary.setdefault(f"{name}_before", value)
            self.summary[f"{name}_after"] = value
        self.console.print(f"eval {label} (step {step}): pass@1 [bold]{scores['pass@1']:.3f}[/] "
                           f"± {scores['pass@1_ci95']:.3f} on {report.problems} held-out problems"
                           + "".join(f", {name} {'n/a' if v is None else f'{v:.3f}'}" for name, v in figures.items()))
        return scores["pass@1"]

    # ------------------------------------------------------------------ save, clean up

    async def finish(self) -> None:
        """The rollout stops; the evaluation after; the final checkpoint."""
        await self.rollout.stop()
        self.summary["eval_after"] = await self.evaluate(self.step, "after")
        await save(self.tr, self.rollout, self.step, self.summary, self.trained)

    async def aclose(self) -> dict[str, Any]:
        """Everything rank 0 started, stopped and closed (the other ranks told to stop); returns
        the rollout side's counters (``RolloutSide.aclose``)."""
        from agentrl.rollout.workflow_inputs import close_workflow

        if self.plotter is not None and self.plotter.returncode is None:
            await self.plotter.wait()  # its curves.png is redrawn after the summary
        try:
            await self.rollout.stop()
            if self.tr.world_size > 1:
                await asyncio.to_thread(self.tr.command, {"op": "stop"})
            return await self.rollout.aclose()
        finally:
            self.runlog.close()
            with contextlib.suppress(Exception):  # the servers leave the weight group (distributed transport)
                await self.tr.transport.close(self.engine)
            await self.engine.aclose()
            if self.eval_workflow is not None:
                await close_workflow(self.eval_workflow)

    def write_summary(self, closed: dict[str, Any]) -> dict[str, Any]:
        """``summary.json`` (minutes, counters, sandbox runs) and the final ``curves.png``."""
        from agentrl.plugins import sandbox_counters
        from agentrl.run.metrics import plot_curves
        from agentrl.run.rollout_side import LocalRollout

        summary = self.summary
        summary["minutes"] = summary.get("minutes", 0.0) + (time.perf_counter() - self.started) / 60
        summary["run_dir"] = str(self.run_dir)
        summary["counters"] = closed["counters"]
        # the backend's own count (Docker), evaluations included: this process's and the rollout process's
        theirs = Counter() if isinstance(self.rollout, LocalRollout) else Counter(closed["sandbox"])
        if "runs" in (sandbox := sandbox_counters() + theirs):
            summary["sandbox_runs"] = sandbox["runs"]
        if "containers_started" in sandbox:  # repository tasks' containers (sandboxes/repo_pool.py)
            summary["containers_started"] = sandbox["containers_started"]
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        plot_curves(self.run_dir)
        return summary


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


async def save(tr: Trainer, rollout: RolloutSide, step: int, summary: dict[str, Any], trained: list) -> None:
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
        from agentrl.run.rollout_process import RolloutProcess

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
