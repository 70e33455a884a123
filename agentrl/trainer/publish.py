"""Weight publishing: getting a new policy version from the trainer into the inference servers.

What it is: ``WeightPublisher.apublish(model, version)``, run on every rank after a train step.
All ranks take part in *staging* the weights (a collective gather); then rank 0 drives the
protocol of DESIGN.md §4 through the inference client: (optional hook: the rollout executor
stops admitting episodes) → ``pause()`` (running requests come back aborted) →
``update_weights(path, version)`` (every server loads the new weights; the client's version
becomes N) → ``resume()`` (aborted requests are re-sent; the hook lets the executor admit
again). ``resume`` runs even when the update fails, so a failed publish never leaves the
servers paused.

Staging happens *before* the pause, unlike the order written in early versions of the design:
the export is the slow part, and generation may go on with the old weights while it runs —
the servers only stop for the load itself. Versions on tokens stay exact either way.

What it is not: the inference client (``agentrl.inference.RemoteEngine`` implements the
``WeightUpdateTarget`` protocol here) or the HF export itself (``agentrl.trainer.checkpoint.export_hf``).

The seam for other transports: ``WeightTransport.stage(model, version)`` returns what the
servers are told to load. ``DiskTransport`` writes an HF directory per version (kept for the
last ``keep_last`` versions); an NCCL-broadcast transport for GPU clusters would implement
the same method (returning a handle the servers' ``update_weights_from_distributed`` takes)
and leave the publisher unchanged. That transport does not exist yet.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist

from agentrl.trainer.checkpoint import export_hf


@runtime_checkable
class WeightUpdateTarget(Protocol):
    """What the publisher needs from the inference side (``RemoteEngine`` has all three)."""

    async def pause(self) -> None: ...

    async def update_weights(self, path: str, version: int) -> None: ...

    async def resume(self) -> None: ...


@runtime_checkable
class WeightTransport(Protocol):
    """Moves a model's weights where the servers can load them. A collective: every rank calls
    it; the return value matters on rank 0 only."""

    def stage(self, model: torch.nn.Module, version: int) -> str: ...


class DiskTransport:
    """HF directories ``<root>/v000042`` on a filesystem the servers can read."""

    def __init__(self, root: str | Path, *, source_dir: str | Path, dtype: torch.dtype | None = None,
                 keep_last: int = 2) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 (the servers read the newest), got {keep_last}")
        self.root = Path(root)
        self.source_dir = Path(source_dir)
        self.dtype = dtype
        self.keep_last = keep_last

    def path_for(self, version: int) -> Path:
        return self.root / f"v{version:06d}"

    def stage(self, model: torch.nn.Module, version: int) -> str:
        out = export_hf(model, self.path_for(version), source_dir=self.source_dir, dtype=self.dtype)
        if dist.get_rank() == 0:
            self._prune(keep=version)
        return str(out)

    def _prune(self, keep: int) -> None:
        versions = sorted(int(m.group(1)) for p in self.root.iterdir()
                          if (m := re.fullmatch(r"v(\d{6,})", p.name)) and p.is_dir())
        for v in versions[:-self.keep_last]:
            if v != keep:
                shutil.rmtree(self.path_for(v), ignore_errors=True)


@dataclass
class PublishRecord:
    """What one publish did: ``path`` (rank 0), seconds spent staging and with servers paused."""

    version: int
    path: str
    stage_s: float
    paused_s: float


Hook = Callable[[], Awaitable[None]]


class WeightPublisher:
    """Stage on every rank, then pause → update → resume through ``target`` on rank 0.

    ``target`` may be None on ranks other than 0 (they never call it). ``before_pause`` and
    ``after_resume`` are the rollout executor's hooks (stop admitting / admit again)."""

    def __init__(self, transport: WeightTransport, target: WeightUpdateTarget | None, *,
                 before_pause: Hook | None = None, after_resume: Hook | None = None) -> None:
        self.transport = transport
        self.target = target
        self.before_pause = before_pause
        self.after_resume = after_resume

    async def apublish(self, model: torch.nn.Module, version: int) -> PublishRecord:
        t0 = time.perf_counter()
        # the gather and the file writes block; keep the event loop (rollouts on rank 0) running
        path = await asyncio.to_thread(self.transport.stage, model, version)
        t1 = time.perf_counter()
        paused = 0.0
        if dist.get_rank() == 0:
            if self.target is None:
                raise ValueError("rank 0 needs a WeightUpdateTarget (the inference client) to publish to")
            if self.before_pause is not None:
                await self.before_pause()
            try:
                await self.target.pause()
                try:
                    await self.target.update_weights(path, version)
                finally:
                    await self.target.resume()
            finally:
                paused = time.perf_counter() - t1
                if self.after_resume is not None:
                    await self.after_resume()
        return PublishRecord(version, path, t1 - t0, paused)

    def publish(self, model: torch.nn.Module, version: int) -> PublishRecord:
        """``apublish`` for a caller without an event loop (a plain training loop). Each call runs
        a new event loop, so ``target`` must not hold connections bound to another loop (create
        the ``RemoteEngine`` per call, or use ``apublish`` in the loop that owns it)."""
        return asyncio.run(self.apublish(model, version))
