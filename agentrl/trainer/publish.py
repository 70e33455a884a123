"""Weight publishing: getting a new policy version from the trainer into the inference servers.

What it is: ``WeightPublisher.apublish(model, version)``, run on every rank after a train step,
and its two ``WeightTransport``s (``stage`` on every rank, ``deliver`` on rank 0 before the
pause, ``send`` on rank 0 while the servers are paused, ``close``): ``DiskTransport`` (an HF
directory per version, ``/update_weights_from_disk``) and ``DistributedTransport`` (a
torch.distributed group of its own with every server, SGLang's bucketed
``/update_weights_from_distributed``; against ``agentrl serve`` the buckets are staged before
the pause and only committed inside it). A LoRA model publishes its adapter alone on either
transport: a peft directory on disk, or its tensors in one broadcast (``agentrl serve`` only)
that the server merges into its base or loads by name (``adapters``). The protocol — stage
and deliver while generation goes on, then stop admission, pause, send, resume, with
``resume`` run even when the update fails — is DESIGN.md §4 "Weight update".

What it is not: the inference client (``agentrl.client.RemoteEngine`` implements the target
protocols here: ``WeightUpdateTarget``, the pause around an update; ``AdapterTarget``,
``DiskTransport``'s; ``WeightGroupTarget``, ``BucketTarget`` and ``AdapterBroadcastTarget``,
``DistributedTransport``'s, each its part of ``BroadcastTarget``; ``PublishTarget``, all of them), the HF export itself
(``agentrl.trainer.checkpoint.export_hf``) or the server's side (``agentrl.inference.weight_sync``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
import torch.distributed as dist

from agentrl.errors import RequestRejected
from agentrl.process_group import DEFAULT_TIMEOUT_S, UpdateGroup, host_store, open_process_group
from agentrl.trainer.checkpoint import adapter_state, export_adapter, export_hf
from agentrl.trainer.lora import adapter_metadata, is_lora
from agentrl.trainer.trainer_config import ADAPTER_MODES

log = logging.getLogger(__name__)


@runtime_checkable
class WeightUpdateTarget(Protocol):
    """What the publisher needs from the inference side (``RemoteEngine`` has all three)."""

    async def pause(self) -> None: ...

    async def update_weights(self, path: str, version: int) -> None: ...

    async def resume(self) -> None: ...


@runtime_checkable
class AdapterTarget(Protocol):
    """What ``DiskTransport`` needs to deliver an adapter before the pause (``RemoteEngine`` has
    it): staged for a merge (``agentrl serve``), or loaded by name on every server (SGLang's
    ``/load_lora_adapter``) and, in the pause, named by every request from then on."""

    async def can_stage_weights(self) -> bool: ...

    async def stage_weights(self, path: str) -> None: ...

    async def load_lora_adapter(self, path: str, version: int) -> None: ...

    async def serve_lora_adapter(self, version: int) -> None: ...


# ``DistributedTransport``'s target, in the three parts its steps need (``RemoteEngine`` has them all)


@runtime_checkable
class WeightGroupTarget(Protocol):
    """The servers' membership of the broadcast group: waiting for every server, their ranks,
    joining and leaving (SGLang's group calls), whether a restarted server waits to join
    (``needs_rejoin``), and whether every server can stage (``agentrl serve``)."""

    needs_rejoin: bool

    async def wait_for_servers(self, timeout_s: float) -> None: ...

    async def weight_group_ranks(self) -> list[int]: ...

    async def init_weights_update_group(self, master_address: str, master_port: int, *, group_name: str,
                                        backend: str, ranks: list[int] | None = None) -> None: ...

    async def destroy_weights_update_group(self, group_name: str) -> None: ...

    async def can_stage_weights(self) -> bool: ...


@runtime_checkable
class BucketTarget(Protocol):
    """Full weights, bucket by bucket: SGLang's update session around the buckets, and
    ``agentrl serve``'s commit of buckets it staged."""

    async def begin_weight_update(self) -> None: ...

    async def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]], *,
                                              group_name: str, version: int | None = None,
                                              load_format: str | None = None, stage_only: bool = False) -> None: ...

    async def end_weight_update(self) -> None: ...

    async def commit_staged_weights(self, group_name: str, version: int) -> None: ...


@runtime_checkable
class AdapterBroadcastTarget(Protocol):
    """A LoRA adapter in one broadcast (``agentrl serve`` only): merged into a staging copy (then
    committed) or loaded by name, and named by every request from the pause on."""

    async def stage_lora_adapter_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                                  *, group_name: str, config: dict[str, Any],
                                                  load_format: str | None = None) -> None: ...

    async def load_lora_adapter_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                                 *, group_name: str, config: dict[str, Any], version: int,
                                                 load_format: str | None = None) -> None: ...

    async def commit_staged_weights(self, group_name: str, version: int) -> None: ...

    async def serve_lora_adapter(self, version: int) -> None: ...


@runtime_checkable
class BroadcastTarget(WeightGroupTarget, BucketTarget, AdapterBroadcastTarget, Protocol):
    """All ``DistributedTransport`` calls: a group to broadcast in, and full weights or an adapter."""


@runtime_checkable
class PublishTarget(WeightUpdateTarget, AdapterTarget, BroadcastTarget, Protocol):
    """The publisher's target: the pause and what either transport calls (``RemoteEngine``);
    each transport's methods name the narrower part they use."""


@runtime_checkable
class WeightTransport(Protocol):
    """Moves a model's weights into the servers. ``stage`` is a collective (every rank calls it;
    what it returns matters on rank 0 only); ``deliver`` runs on rank 0 while the servers still
    generate (it moves what it can without changing what they serve); ``send`` runs on rank 0
    while the servers are paused, and leaves them serving the new weights. A transport that
    subclasses this one inherits the defaults of ``deliver`` (nothing to move before the pause)
    and ``close`` (nothing held open)."""

    def stage(self, model: torch.nn.Module, version: int) -> Any: ...

    async def deliver(self, target: PublishTarget, staged: Any, version: int) -> None:
        return None

    async def send(self, target: PublishTarget, staged: Any, version: int) -> None: ...

    async def close(self, target: PublishTarget) -> None:
        return None


class DiskTransport(WeightTransport):
    """HF directories ``<root>/v000042`` on a filesystem the servers can read: ``stage`` writes
    the directory (before the pause, so nothing is left to ``deliver``), ``send`` has the servers
    load it in the pause. A LoRA model's directory is its adapter alone, in peft's format
    (``agentrl.trainer.checkpoint.export_adapter``), which the servers take as ``adapters`` says:
    ``merge`` — ``agentrl serve`` merges it into its base before the pause (``deliver``), so the
    pause is a swap; ``load`` — every server loads it by name before the pause (SGLang's
    ``/load_lora_adapter``) and the pause switches the requests to it; ``auto`` — merge where
    every server can stage (``agentrl serve``), else load (SGLang)."""

    def __init__(self, root: str | Path, *, source_dir: str | Path, dtype: torch.dtype | None = None,
                 keep_last: int = 2, adapters: str = "auto") -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 (the servers read the newest), got {keep_last}")
        self.root = Path(root)
        self.source_dir = Path(source_dir)
        self.dtype = dtype
        self.keep_last = keep_last
        self.lora = False  # the last staged model was a LoRA model: its directory is an adapter
        if adapters not in ADAPTER_MODES:
            raise ValueError(f"adapters must be one of {list(ADAPTER_MODES)}, got {adapters!r}")
        self.adapters = adapters
        self._by_name = False  # the adapter delivered last was loaded by name (send switches to it)

    def path_for(self, version: int) -> Path:
        return self.root / f"v{version:06d}"

    def stage(self, model: torch.nn.Module, version: int) -> str:
        self.lora = is_lora(model)
        if self.lora:
            out = export_adapter(model, self.path_for(version))
        else:
            out = export_hf(model, self.path_for(version), source_dir=self.source_dir, dtype=self.dtype)
        if dist.get_rank() == 0:
            self._prune(keep=version)
        return str(out)

    async def deliver(self, target: AdapterTarget, staged: str, version: int) -> None:
        """An adapter, before the pause: loaded by name on every server (``load``), or, where every
        server can stage (``agentrl serve``), read, checked and merged into a staging copy, so the
        pause only swaps it in. A full checkpoint is read in the pause, as SGLang's protocol has it."""
        self._by_name = False
        if not self.lora:
            return
        can_stage = await target.can_stage_weights()
        if self.adapters == "load" or (self.adapters == "auto" and not can_stage):
            await target.load_lora_adapter(staged, version)
            self._by_name = True
        elif can_stage:
            await target.stage_weights(staged)

    async def send(self, target: WeightUpdateTarget | AdapterTarget, staged: str, version: int) -> None:
        if self._by_name:
            await target.serve_lora_adapter(version)
        else:
            await target.update_weights(staged, version)

    def _prune(self, keep: int) -> None:
        versions = sorted(int(m.group(1)) for p in self.root.iterdir()
                          if (m := re.fullmatch(r"v(\d{6,})", p.name)) and p.is_dir())
        for v in versions[:-self.keep_last]:
            if v != keep:
                shutil.rmtree(self.path_for(v), ignore_errors=True)


@dataclass
class StagedTensors:
    """Rank 0's tensors for one broadcast: the full weights cut into buckets of at most
    ``bucket_bytes``, or a LoRA model's adapter in one bucket (peft's names) with
    ``lora_config``, its config as the server takes it (``adapter_metadata``). With ``flat``
    (SGLang's ``flattened_bucket``), each bucket's tensors are there as one buffer of their
    bytes end to end, and ``buckets`` keep only their names, dtypes and shapes."""

    buckets: list[list[tuple[str, torch.Tensor]]]
    flat: list[torch.Tensor] | None = None
    lora_config: dict[str, Any] | None = None

    @property
    def nbytes(self) -> int:
        """The bytes this broadcast moves."""
        return sum(t.numel() * t.element_size() for b in self.buckets for _, t in b)

    def __str__(self) -> str:
        count = sum(len(b) for b in self.buckets)
        what = "adapter, " if self.lora_config is not None else ""
        return f"broadcast: {what}{count} tensors, {self.nbytes} bytes, {len(self.buckets)} bucket(s)"


class DistributedTransport:
    """The tensors themselves, broadcast from trainer rank 0 to every server (SGLang's
    ``/update_weights_from_distributed``). One group per transport, formed at the first transfer.
    ``overlap``: where every server can stage (``agentrl serve``), broadcast the buckets before
    the pause and only commit them in it; false, or against SGLang: every bucket in the pause.

    A LoRA model's adapter (``agentrl serve`` only: SGLang and vLLM take adapters from disk) goes
    as its own tensors in one request with its config (``agentrl serve``'s
    ``/agentrl/lora_adapter_from_distributed``), as ``adapters`` says: ``merge`` or ``auto`` —
    merged into the servers' base weights in a staging copy (before the pause with ``overlap``,
    else in it), committed in the pause; ``load`` — loaded by name (``agentrl-policy-v<N>``)
    before the pause, and from the pause on every request names it."""

    def __init__(self, *, master_address: str, master_port: int = 0, backend: str = "gloo",
                 group_name: str = "agentrl_weights", bucket_bytes: int = 512 << 20, dtype: torch.dtype | None = None,
                 flatten: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S, overlap: bool = True,
                 adapters: str = "auto") -> None:
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
        if adapters not in ADAPTER_MODES:
            raise ValueError(f"adapters must be one of {list(ADAPTER_MODES)}, got {adapters!r}")
        self.adapters = adapters
        self.master_address, self.master_port = master_address, master_port
        self.backend, self.group_name = backend, group_name
        self.bucket_bytes, self.dtype, self.timeout_s = bucket_bytes, dtype, timeout_s
        self.flatten, self.overlap = flatten, overlap
        self.group: UpdateGroup | None = None
        self.agentrl_serve = False  # every server of the group is agentrl serve (asked when it forms)
        self.staging = False  # ... and overlap: buckets are staged before the pause
        self._delivered: int | None = None  # the version staged on every server, awaiting its commit
        self._told = False  # the log has said that adapters alone are broadcast
        self._flat: list[torch.Tensor] = []

    def stage(self, model: torch.nn.Module, version: int) -> StagedTensors | None:
        """Gather the full state dict into rank 0's CPU memory (every rank joins); cast to
        ``dtype``; a tied output layer is left out (the servers share it with the embedding).
        A LoRA model: its adapter's tensors only, in their own dtype (as on disk), one bucket."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if is_lora(model):
            tensors = adapter_state(model)
            if tensors is None:
                return None
            # widest elements first: every tensor of a flattened bucket starts aligned to its own
            ordered = sorted(tensors.items(), key=lambda kv: -kv[1].element_size())
            return self._packed([ordered], lora_config=adapter_metadata(model))
        sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if dist.get_rank() != 0:
            return None
        tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
        buckets: list[list[tuple[str, torch.Tensor]]] = [[]]
        size = 0
        for name, t in sd.items():
            if tied and name == "lm_head.weight":
                continue
            t = t.detach()
            if self.dtype is not None and t.is_floating_point():
                t = t.to(self.dtype)
            t = t.contiguous()
            nbytes = t.numel() * t.element_size()
            # a flattened bucket needs every tensor to start at a multiple of its element size
            if buckets[-1] and (size + nbytes > self.bucket_bytes or (self.flatten and size % t.element_size())):
                buckets.append([])
                size = 0
            buckets[-1].append((name, t))
            size += nbytes
        return self._packed(buckets)

    def _packed(self, buckets: list[list[tuple[str, torch.Tensor]]],
                lora_config: dict[str, Any] | None = None) -> StagedTensors:
        if not self.flatten:
            return StagedTensors(buckets, lora_config=lora_config)
        # the previous publish's buffers are written again (sent by now): no fresh pages to fault in
        old = self._flat if len(self._flat) == len(buckets) else []
        flat = []
        for i, b in enumerate(buckets):
            parts = [t.reshape(-1).view(torch.uint8) for _, t in b]
            size = sum(p.numel() for p in parts)
            out = old[i] if i < len(old) and old[i].numel() == size else torch.empty(size, dtype=torch.uint8)
            flat.append(torch.cat(parts, out=out))
        self._flat = flat
        meta = [[(n, torch.empty(t.shape, dtype=t.dtype, device="meta")) for n, t in b] for b in buckets]
        return StagedTensors(meta, flat, lora_config)

    async def deliver(self, target: BroadcastTarget, staged: StagedTensors, version: int) -> None:
        """Before the pause: where every server can stage (and ``overlap``), broadcast every
        bucket into their staging copies while they keep generating with the old weights. An
        adapter: loaded by name (``load``, whatever ``overlap`` says), or merged into a staging
        copy (with ``overlap``)."""
        self._delivered = None
        if not self.overlap and not (staged.lora_config is not None and self.adapters == "load"):
            return
        if await self._attempts(target, staged, version, stage_only=True):
            self._delivered = version

    async def send(self, target: BroadcastTarget, staged: StagedTensors, version: int) -> None:
        """In the pause: commit what ``deliver`` staged; else (or if the commit fails: a server
        restarted since, say) bucket by bucket as SGLang takes them, the last with the version.
        An adapter loaded by name: every request names it from now on."""
        delivered, self._delivered = self._delivered, None
        if staged.lora_config is not None and self.adapters == "load":
            if delivered != version:
                await self._attempts(target, staged, version, stage_only=True)
            await target.serve_lora_adapter(version)
            return
        if delivered == version and self.group is not None and not target.needs_rejoin:
            try:
                await target.commit_staged_weights(self.group_name, version)
                return
            except Exception as e:
                log.warning("committing the staged weights of version %d failed (%s); sending them again in the "
                            "pause", version, e)
                await self._disband(target)
        await self._attempts(target, staged, version, stage_only=False)

    async def _attempts(self, target: BroadcastTarget, staged: StagedTensors, version: int, *, stage_only: bool) -> bool:
        """``_send_once``, retried once in full on a group formed anew after a failure that is
        not a refusal (a server lost mid-broadcast and restarted)."""
        for attempt in (1, 2):
            try:
                return await self._send_once(target, staged, version, stage_only=stage_only)
            except RequestRejected:
                raise  # the server refused these tensors: sending them again would not help
            except Exception as e:
                if attempt == 2:
                    raise
                log.warning("weight broadcast of version %d failed (%s); forming the group again and resending",
                            version, e)
        raise AssertionError("unreachable")

    async def _send_once(self, target: BroadcastTarget, staged: StagedTensors, version: int, *,
                         stage_only: bool = False) -> bool:
        """Every bucket; False (nothing sent) when ``stage_only`` and some server cannot stage."""
        if self.group is None or target.needs_rejoin:
            await self._form(target)
        assert self.group is not None
        if staged.lora_config is not None:
            return await self._send_adapter(target, staged, version, stage_only=stage_only)
        if stage_only and not self.staging:
            return False
        await target.begin_weight_update()
        try:
            for i, bucket in enumerate(staged.buckets):
                names = [n for n, _ in bucket]
                dtypes = [str(t.dtype).removeprefix("torch.") for _, t in bucket]
                shapes = [list(t.shape) for _, t in bucket]
                last = i == len(staged.buckets) - 1
                tensors = [staged.flat[i]] if staged.flat is not None else [t for _, t in bucket]
                extra = {"stage_only": True} if stage_only else {}  # SGLang's targets know no such thing
                await asyncio.gather(
                    target.update_weights_from_distributed(
                        names, dtypes, shapes, group_name=self.group_name,
                        version=version if last and not stage_only else None,
                        load_format="flattened_bucket" if staged.flat is not None else None, **extra),
                    asyncio.to_thread(self._broadcast, self.group, tensors))
        except BaseException:
            await self._disband(target)
            raise
        finally:
            with contextlib.suppress(Exception):
                await target.end_weight_update()
        return True

    async def _send_adapter(self, target: BroadcastTarget, staged: StagedTensors, version: int, *,
                            stage_only: bool) -> bool:
        """The adapter in one request and one broadcast: loaded as ``agentrl-policy-v<version>``
        (``load``), or merged into a staging copy, then (unless ``stage_only``) committed."""
        if not self.agentrl_serve:
            raise RequestRejected("a LoRA adapter can be broadcast to agentrl serve only (SGLang and vLLM load "
                                  "adapters from disk); set trainer.weight_sync.transport: disk")
        (bucket,) = staged.buckets
        names = [n for n, _ in bucket]
        dtypes = [str(t.dtype).removeprefix("torch.") for _, t in bucket]
        shapes = [list(t.shape) for _, t in bucket]
        tensors = staged.flat if staged.flat is not None else [t for _, t in bucket]
        load_format = "flattened_bucket" if staged.flat is not None else None
        assert staged.lora_config is not None and self.group is not None
        if self.adapters == "load":
            call = target.load_lora_adapter_from_distributed(names, dtypes, shapes, group_name=self.group_name,
                                                             config=staged.lora_config, version=version,
                                                             load_format=load_format)
        else:
            call = target.stage_lora_adapter_from_distributed(names, dtypes, shapes, group_name=self.group_name,
                                                              config=staged.lora_config, load_format=load_format)
        try:
            await asyncio.gather(call, asyncio.to_thread(self._broadcast, self.group, tensors))
        except BaseException:
            await self._disband(target)
            raise
        if not self._told:
            self._told = True
            log.info("a LoRA run: each publish broadcasts the adapter alone (%s), %s", staged,
                     "loaded by name on every server" if self.adapters == "load"
                     else "merged into the servers' base weights")
        if not stage_only and self.adapters != "load":
            await target.commit_staged_weights(self.group_name, version)
        return True

    async def close(self, target: WeightGroupTarget) -> None:
        """Every server leaves the group (the end of a run)."""
        if self.group is not None:
            await self._disband(target)

    def _broadcast(self, group: UpdateGroup, tensors: list[torch.Tensor]) -> None:
        if group.backend == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
            tensors = [t.to(device, non_blocking=True) for t in tensors]
        group.broadcast(tensors)

    async def _form(self, target: WeightGroupTarget) -> None:
        """Every server joins a new group with rank 0 (an old one is disbanded first)."""
        if self.group is not None or target.needs_rejoin:
            await self._disband(target)
        await target.wait_for_servers(self.timeout_s)  # a group needs every member: one restarting is waited for
        ranks = await target.weight_group_ranks()  # a tensor-parallel SGLang server joins with each GPU
        world = 1 + sum(ranks)
        store = host_store(world, port=self.master_port, timeout_s=self.timeout_s)
        joining = asyncio.ensure_future(asyncio.to_thread(
            open_process_group, master_address=self.master_address, master_port=store.port, rank=0, world_size=world,
            group_name=self.group_name, backend=self.backend, timeout_s=self.timeout_s, store=store))
        try:
            await target.init_weights_update_group(self.master_address, store.port, group_name=self.group_name,
                                                   backend=self.backend, ranks=ranks)
        except BaseException:
            # rank 0's own join gives up after timeout_s; nobody waits for it
            joining.add_done_callback(lambda f: f.cancelled() or f.exception())
            raise
        self.group = await joining
        target.needs_rejoin = False
        self.agentrl_serve = await target.can_stage_weights()
        self.staging = self.overlap and self.agentrl_serve
        log.info("weight group %r formed: trainer rank 0 and %d server rank(s) on %d server(s), %s, port %d; %s",
                 self.group_name, world - 1, len(ranks), self.backend, store.port,
                 "buckets staged while the servers generate, committed in the pause" if self.staging
                 else "every bucket in the pause")

    async def _disband(self, target: WeightGroupTarget) -> None:
        with contextlib.suppress(Exception):
            await target.destroy_weights_update_group(self.group_name)
        if self.group is not None:
            with contextlib.suppress(Exception):
                self.group.close()
        self.group = None


@dataclass
class PublishRecord:
    """What one publish did: ``path`` (where the weights went: the checkpoint directory, or the
    broadcast's size; empty on ranks > 0 of a broadcast), seconds spent staging, delivering
    (rank 0, the servers generating) and with the servers paused."""

    version: int
    path: str
    stage_s: float
    paused_s: float
    deliver_s: float = 0.0


Hook = Callable[[], Awaitable[None]]


class WeightPublisher:
    """Stage on every rank, then pause → update → resume through ``target`` on rank 0.

    ``target`` may be None on ranks other than 0 (they never call it). ``before_pause`` and
    ``after_resume`` are the rollout executor's hooks (stop admitting / admit again)."""

    def __init__(self, transport: WeightTransport, target: PublishTarget | None, *,
                 before_pause: Hook | None = None, after_resume: Hook | None = None) -> None:
        self.transport = transport
        self.target = target
        self.before_pause = before_pause
        self.after_resume = after_resume

    async def apublish(self, model: torch.nn.Module, version: int) -> PublishRecord:
        t0 = time.perf_counter()
        # the gather and the file writes block; keep the event loop (rollouts on rank 0) running
        staged = await asyncio.to_thread(self.transport.stage, model, version)
        t1 = t2 = time.perf_counter()
        paused = 0.0
        if dist.get_rank() == 0:
            if self.target is None:
                raise ValueError("rank 0 needs a WeightUpdateTarget (the inference client) to publish to")
            await self.transport.deliver(self.target, staged, version)  # the servers still generate
            t2 = time.perf_counter()
            if self.before_pause is not None:
                await self.before_pause()
            try:
                await self.target.pause()
                try:
                    await self.transport.send(self.target, staged, version)
                finally:
                    await self.target.resume()
            finally:
                paused = time.perf_counter() - t2
                if self.after_resume is not None:
                    await self.after_resume()
        return PublishRecord(version, "" if staged is None else str(staged), t1 - t0, paused, t2 - t1)

    def publish(self, model: torch.nn.Module, version: int) -> PublishRecord:
        """``apublish`` for a caller without an event loop (a plain training loop). Each call runs
        a new event loop, so ``target`` must not hold connections bound to another loop (create
        the ``RemoteEngine`` per call, or use ``apublish`` in the loop that owns it)."""
        return asyncio.run(self.apublish(model, version))
