"""The rollout side of a training run: what rank 0 drives each step, and its home in rank 0.

What it is: ``RolloutSide``, the protocol of the rollout side — the rollout executor, its
workflow, environments and episode log, and the inference client its episodes generate with —
as the loop (``agentrl.run.loop``) drives it: ``open``, ``start``, ``next_batch``, ``publish``
(the step's weight publish, where this side allows it, then its version and metrics),
``pause_admission`` / ``resume_admission`` (the weight publisher's hooks), ``snapshot`` (the
step's rollout metrics), ``checkpoint_state``, ``forget`` (groups trained on and checkpointed),
``stop`` and ``aclose``. It has two homes:

- ``LocalRollout`` (here): in rank 0's process, on the event loop that also schedules the steps.
  What needs the executor itself runs here: deterministic mode (the lockstep clock), the
  gateway's agents (``rollout.source: gateway``) and recorded steps.
- ``RolloutProcess`` (``agentrl.run.rollout_process``): the same ``LocalRollout`` in a child of
  rank 0, driven over a socket pair, so that the episodes' Python and the trainer's do not share
  an interpreter lock.

``agentrl.run.placement.apply_rollout_worker`` resolves ``rollout.worker: auto``.
What it is not: the executor (``agentrl.rollout.executor``) or the loop that schedules the steps.
Main hook: ``LocalRollout(cfg, run_dir)``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

Publish = Callable[[], Awaitable[Any]]
"""The step's weight publish (``WeightPublisher.apublish`` for the new version): its record."""


class RolloutSide(Protocol):
    """What rank 0's loop drives, in this process (``LocalRollout``) or in another (``RolloutProcess``)."""

    async def open(self, engine: Any, servers: dict[str, Any], version: int,
                   resume_from: str | None) -> dict[str, int]:
        """Build the executor at trainer ``version`` (restored from ``resume_from``), generating
        with ``engine`` (the publisher's ``RemoteEngine``) or a client of its own over ``servers``
        (``servers.json``); returns ``pending`` (groups a resume finishes first) and ``logged``."""

    async def start(self) -> str | None:
        """Start generating (or serving, or feeding recorded steps); the line to print, if any."""

    async def next_batch(self) -> Any:
        """The next ``Batch`` of B finished groups (generation goes on meanwhile)."""

    async def publish(self, version: int, publish: Publish) -> tuple[Any, dict[str, Any]]:
        """Run ``publish`` where this side allows it (deterministic mode: between two fixed
        rounds), then move admission to ``version``; returns its record and ``snapshot()``."""

    async def pause_admission(self) -> None: ...

    async def resume_admission(self) -> None: ...

    async def snapshot(self) -> dict[str, Any]:
        """``metrics`` of the rollout now, ``busy_s`` of generation so far, ``needs_rejoin``."""

    async def checkpoint_state(self) -> dict[str, Any]: ...

    async def forget(self, indices: list[int]) -> None: ...

    async def stop(self) -> None: ...

    async def aclose(self) -> dict[str, Any]:
        """Stop and release everything; returns ``counters`` and ``sandbox`` (its counters)."""


async def publish_then_snapshot(side: Any, version: int, publish: Publish) -> tuple[Any, dict[str, Any]]:
    """``RolloutSide.publish`` where nothing holds the publish back: publish, move admission, snapshot."""
    record = await publish()
    side.set_version(version)
    return record, await side.snapshot()


class LocalRollout:
    """The rollout side in this process (see the module doc). ``LocalRollout(cfg, run_dir)``
    builds what needs no server (the rows, the workflow); ``open`` the rest."""

    def __init__(self, cfg: Any, run_dir: Path) -> None:
        from agentrl.env.datasets import dataset_rows
        from agentrl.run.run_config import build_workflow

        self.cfg, self.run_dir = cfg, run_dir
        self.recorded = self.workflow = self.rows = None
        self.external = cfg.rollout.source == "gateway"
        if cfg.rollout.recorded is not None:  # off-policy: the recorded run's steps are this run's batches
            from agentrl.rollout.recorded import RecordedEpisodes, model_vocab_size

            self.recorded = RecordedEpisodes(cfg.rollout.recorded, model_vocab_size(cfg.model))
        elif not self.external:  # the rows first: a dataset's module may register the environment the workflow makes
            from agentrl.rollout.executor import RowSource

            self.rows = RowSource(dataset_rows(cfg.rollout.dataset, cfg.seed), seed=cfg.seed,
                                  shuffle=cfg.rollout.shuffle)
            self.workflow = build_workflow(cfg, cfg.rollout.sampling)
        self.engine: Any = None
        self.executor: Any = None
        self.episode_log: Any = None
        self.lockstep: Any = None
        self._owns_engine = False
        self._handed: deque[list] = deque()  # the groups of batches handed out and not yet trained on
        self._gateway = contextlib.AsyncExitStack()  # rollout.source gateway: the gateway, while it serves
        self.teacher: Any = None  # trainer.distill: the teacher that scores each batch (agentrl.rollout.teacher)

    async def open(self, engine: Any, servers: dict[str, Any], version: int, resume_from: str | None, *,
                   owns_engine: bool = False) -> dict[str, int]:
        """Build the executor over ``engine`` at trainer ``version`` (restored from the checkpoint at
        ``resume_from``, if any; ``servers``: unused here, ``engine`` reaches them); returns the
        groups a resume finishes first and the logged episodes it replays (``pending``, ``logged``).
        ``owns_engine``: ``aclose`` closes it."""
        from agentrl.rollout.executor import EpisodeKey, RolloutExecutor
        from agentrl.rollout.journal import EpisodeLog

        cfg = self.cfg
        self.engine, self._owns_engine = engine, owns_engine
        state = json.loads((Path(resume_from) / "rollout.json").read_text()) if resume_from else None
        keep = None
        if state is not None:
            pending = {int(i) for i in state["pending"]}
            cursor = state["cursor"]

            def keep(key: str) -> bool:  # the episodes of rows still to be trained on
                index = EpisodeKey.parse(key).index
                return index in pending or index >= cursor
        self.episode_log = EpisodeLog(self.run_dir / "rollout" / "episodes.jsonl", keep=keep)
        if cfg.deterministic and self.workflow is not None:
            from agentrl.rollout.lockstep import Lockstep

            self.lockstep = Lockstep(cfg.rollout.lockstep)  # (the launcher checked that the servers are batch-invariant)
        self.executor = RolloutExecutor(self.workflow, engine, self.rows, cfg.rollout,
                                        max_staleness=cfg.trainer.max_staleness,
                                        episode_log=self.episode_log, run_id=self.run_dir.name,
                                        record_max_bytes=cfg.logging.record_max_bytes, lockstep=self.lockstep)
        if state is not None:
            self.executor.restore(state, version)
        else:
            self.executor.version = version
        if cfg.trainer.distill.enabled:
            from agentrl.rollout.teacher import Teacher

            self.teacher = Teacher(cfg.trainer.distill.teacher, cfg.model)
            await self.teacher.check_tokenizer()
        return {"pending": len(state["pending"]) if state is not None else 0, "logged": len(self.episode_log.keys())}

    async def start(self) -> str | None:
        """Play the rows; or serve the run's gateway (``rollout.source: gateway``); or queue the
        recorded steps from the one after the checkpoint's. Returns what the run prints."""
        if self.external:
            return await self._serve_gateway()
        if self.recorded is not None:
            self.recorded.feed(self.executor, first_step=self.executor.version, steps=self.cfg.steps)
            return (f"training on the recorded steps of {self.cfg.rollout.recorded} ({len(self.recorded.steps)} "
                    "steps; nothing generated)")
        await self.executor.start()
        return None

    async def _serve_gateway(self) -> str:
        """Serve the run's gateway (until ``aclose``); its sessions are admitted within the
        staleness bound and their episodes become the executor's groups."""
        from agentrl.process.services import background_server
        from agentrl.rollout.external import GatewayEpisodes
        from agentrl.rollout.gateway import Gateway
        from agentrl.rollout.gateway_routes import build_app

        cfg, stack = self.cfg, self._gateway
        bridge = GatewayEpisodes(self.executor, cfg.rollout.group_size)
        gateway = Gateway(self.engine, cfg.model, cfg.gateway, out=self.run_dir / "gateway",
                          on_episode=bridge.on_episode,
                          default_max_tokens=cfg.gateway.default_max_tokens or cfg.rollout.sampling.max_new_tokens)
        gateway.admission = bridge.admits
        stack.push_async_callback(gateway.aclose)
        api_key = os.environ.get(cfg.gateway.api_key_env) or None
        url = await stack.enter_async_context(background_server(build_app(gateway, api_key=api_key),
                                                                cfg.gateway.host, cfg.gateway.port))
        (self.run_dir / "gateway.json").write_text(json.dumps({"url": url, "api_key_env": cfg.gateway.api_key_env}))
        return f"gateway ready on {url} (sessions: POST {url}/v1/sessions)"

    async def next_batch(self) -> Any:
        """The executor's next batch; with ``trainer.distill``, scored by the teacher first (here,
        in the rollout's process: with ``rollout.worker: process`` while the trainer trains on the
        batch before)."""
        batch = await self.executor.next_batch()
        if self.teacher is not None:
            await self.teacher.score(batch.trajectories)
        self._handed.append(batch.groups)
        return batch

    async def publish(self, version: int, publish: Publish) -> tuple[Any, dict[str, Any]]:
        """See ``RolloutSide.publish``: in deterministic mode, between the rounds the schedule
        fixes, so the same in every run; otherwise whenever it finishes."""
        if self.lockstep is None:
            return await publish_then_snapshot(self, version, publish)
        return await self.lockstep.publish(version, lambda: publish_then_snapshot(self, version, publish))

    def set_version(self, version: int, policy: dict[str, Any] | None = None) -> None:
        """The trainer trained on the oldest batch handed out and reached ``version``; ``policy``:
        the publisher's ``RemoteEngine.policy()``, when this side's engine is not the publisher's."""
        if policy is not None:
            self.engine.follow(policy)
        if self._handed:
            self._handed.popleft()
        self.executor.set_version(version)

    async def pause_admission(self) -> None:
        await self.executor.pause_admission()

    async def resume_admission(self) -> None:
        await self.executor.resume_admission()

    async def snapshot(self) -> dict[str, Any]:
        """The rollout's metrics now (``metrics``), generation's busy seconds so far (``busy_s``),
        and whether a server came back without broadcast weights (``needs_rejoin``)."""
        from agentrl.plugins import sandbox_counters

        ex = self.executor
        return {"metrics": {"rollout/groups_running": float(ex.running), "rollout/groups_ready": float(ex.ready),
                            **{f"rollout/{k}": float(v) for k, v in ex.counters.items()},
                            **{f"sandbox/{k}": float(v) for k, v in sandbox_counters().items()},
                            **(self.teacher.metrics() if self.teacher is not None else {})},
                "busy_s": ex.generation_busy_s(), "needs_rejoin": bool(getattr(self.engine, "needs_rejoin", False))}

    async def checkpoint_state(self) -> dict[str, Any]:
        """The executor's ``state()``, a batch handed out but not trained on still pending in it."""
        return self.executor.state([g for groups in self._handed for g in groups])

    async def forget(self, indices: list[int]) -> None:
        """The groups of rows ``indices`` were trained on and checkpointed: the episode log drops
        their episodes (a resume never needs them again) and compacts."""
        size = self.executor.group_size
        self.episode_log.forget([f"{i}:{k}" for i in indices for k in range(size)])
        self.episode_log.compact()

    async def stop(self) -> None:
        if self.executor is not None:
            await self.executor.stop()

    async def aclose(self) -> dict[str, Any]:
        """Stop, close the log and the workflow (and the engine, if this side made it); returns the
        executor's counters and this process's sandbox counters (``counters``, ``sandbox``)."""
        from agentrl.plugins import sandbox_counters
        from agentrl.rollout.workflow_inputs import close_workflow

        await self.stop()
        await self._gateway.aclose()
        if self.episode_log is not None:
            self.episode_log.close()
        if self._owns_engine and self.engine is not None:
            await self.engine.aclose()
        if self.teacher is not None:
            await self.teacher.aclose()
        if self.workflow is not None:
            await close_workflow(self.workflow)
        return {"counters": dict(self.executor.counters) if self.executor is not None else {},
                "sandbox": dict(sandbox_counters())}
