"""``WeightPublishing``: the calls a publisher makes of ``RemoteEngine`` — pause, weight and
adapter updates from disk or over torch.distributed, resume, and colocated training's memory.

What it is: the half of ``RemoteEngine`` that changes what the servers serve (DESIGN.md §4
"Weight update"): ``pause()``, ``update_weights(path, version)`` or ``stage_weights(path)``,
``resume()``; the torch.distributed calls (``init_weights_update_group``,
``update_weights_from_distributed``, ``commit_staged_weights``; SGLang and agentrl serve only);
a LoRA run's adapters by name (``load_lora_adapter(path, version)`` before the pause,
``serve_lora_adapter(version)`` in it: from then on every request names that adapter and its
tokens carry its version); ``release_memory`` / ``occupy_memory`` while paused. A control call
reaches every live server, or versions skew.

What it is not: usable alone. It is a base of ``RemoteEngine`` and uses its servers, routing
and engine backend (the attributes and methods named below); generation is ``remote_engine``'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import httpx

from agentrl.api import MEMORY_TAGS
from agentrl.errors import RequestRejected, ServerError, ServerUnavailable

if TYPE_CHECKING:
    from agentrl.client.backend import EngineBackend

log = logging.getLogger(__name__)

TRANSPORT_ERRORS = (httpx.TransportError,)

LORA_NAME = "agentrl-policy"
"""A LoRA run's adapters on the servers are named ``agentrl-policy-v<version>`` (AReaL's
``<name>-v<version>``): ``load_lora_adapter``."""


def lora_name(version: int) -> str:
    return f"{LORA_NAME}-v{version}"


class WeightPublishing:
    """Pause, update, resume and memory calls on every server (see the module docstring)."""

    # RemoteEngine's state these calls read and move (a server: remote_engine._Server, whose
    # module imports this one)
    _servers: list[Any]
    _version: int
    _last_update: tuple[str | None, int] | None
    _adapters: dict[str, str | None]
    _lora: tuple[str, int] | None
    _unpaused: asyncio.Event
    _released: set[str]
    needs_rejoin: bool
    control_timeout: float
    max_retries: int
    backoff: float
    health_check_interval: float

    # RemoteEngine's routing these calls go through (its methods)
    addresses: list[str]
    _resolve: Callable[[], Awaitable[EngineBackend]]
    _post: Callable[..., Awaitable[Any]]
    _probe: Callable[[Any], Awaitable[bool]]
    _alive: Callable[[Any], Awaitable[bool]]
    _mark_down: Callable[[Any, BaseException], None]

    async def _control(self, path: str, payload: dict[str, Any], *, plain: bool = False) -> list[Any]:
        """POST to every healthy server at once (retrying transport errors); returns the answers
        (``plain``: as ``_post``)."""
        async def one(s: Any) -> Any:
            for attempt in range(self.max_retries + 1):
                try:
                    return await self._post(s, path, payload, self.control_timeout, plain=plain)
                except TRANSPORT_ERRORS as e:
                    if attempt == self.max_retries:
                        self._mark_down(s, e)
                        return None
                    await asyncio.sleep(self.backoff * 2 ** attempt)
        deadline = time.monotonic() + self.control_timeout
        while True:
            for s in self._servers:  # a control call must reach every live server, or versions skew
                if not s.healthy:
                    await self._probe(s)
            targets = [s for s in self._servers if s.healthy or s.stale]  # a stale one is paused too
            if targets:
                return await asyncio.gather(*(one(s) for s in targets))
            if time.monotonic() > deadline:  # none came back (a restarted one is re-synced by _probe)
                raise ServerUnavailable(f"no healthy inference server among {self.addresses} for "
                                        f"{self.control_timeout:.0f} s")
            await asyncio.sleep(self.health_check_interval)

    async def pause(self) -> None:
        """Step 2 of DESIGN.md §4: running requests come back aborted; new ones wait. A server
        that misses it (down) is paused when it answers again before ``resume`` (``_probe``)."""
        self._unpaused.clear()
        await self._control(*(await self._resolve()).pause())

    async def update_weights(self, path: str, version: int) -> None:
        """Step 4-5: every server loads the checkpoint at ``path``; the client's version becomes
        ``version``. Refused weights raise ``RequestRejected`` (on vLLM, which cannot refuse them,
        the backend checks the checkpoint before any server loads it)."""
        await (await self._resolve()).load_weights(str(path), int(version))
        self._last_update = (str(path), int(version))
        self._version, self._lora = int(version), None  # the checkpoint is the policy: no adapter named

    async def stage_weights(self, path: str) -> None:
        """Before a pause (``agentrl serve`` only: ``can_stage_weights``): every server reads and
        checks the checkpoint or LoRA adapter at ``path`` into a staging copy while it keeps
        generating (``agentrl_stage_only``), so ``update_weights`` of the same path in the pause
        only swaps it in. Refused weights raise ``RequestRejected``, nothing served changes."""
        await (await self._resolve()).stage_weights(str(path))

    async def load_lora_adapter(self, path: str, version: int) -> None:
        """Before a pause: every server loads the LoRA adapter at ``path`` as ``lora_name(version)``
        (SGLang's ``/load_lora_adapter``, vLLM's ``/v1/load_lora_adapter``; no request names it
        yet). A refusal raises ``RequestRejected``. The same version loaded again (a retried
        publish) replaces it."""
        name = lora_name(version)
        if self._adapters.pop(name, None) is not None:
            await self._unload(name)
        load, _ = (await self._resolve()).lora_routes
        answers = await self._control(load, {"lora_name": name, "lora_path": str(path)}, plain=True)
        bad = [a for a in answers if isinstance(a, dict) and not a.get("success", False)]
        if bad:
            raise RequestRejected(f"loading the LoRA adapter {path} failed: {bad[0].get('error_message')}")
        self._adapters[name] = str(path)

    async def serve_lora_adapter(self, version: int) -> None:
        """In the pause: every request from now on names the adapter of ``version`` (loaded by
        ``load_lora_adapter``), and its tokens carry ``version``; adapters older than the one
        served before are unloaded (that one stays: a request sent just before the pause may
        still name it)."""
        name = lora_name(version)
        if name not in self._adapters:
            raise RequestRejected(f"the LoRA adapter {name} was not loaded; call load_lora_adapter first")
        previous = self._lora[0] if self._lora else None
        self._lora, self._version = (name, int(version)), int(version)
        for old in [n for n in self._adapters if n not in (name, previous)]:
            del self._adapters[old]
            await self._unload(old)

    async def _unload(self, name: str) -> None:
        _, unload = (await self._resolve()).lora_routes
        try:
            await self._control(unload, {"lora_name": name}, plain=True)
        except RequestRejected as e:  # not held (a restarted server): nothing to free
            log.warning("unloading the LoRA adapter %s: %s", name, e)

    async def resume(self) -> None:
        """Step 6: generation continues; waiting and aborted requests are (re-)sent. Memory
        released while paused is taken back first (``release_memory``)."""
        try:
            backend = await self._resolve()
            await self.occupy_memory()
            await self._control(*backend.resume())
        finally:
            self._unpaused.set()

    # ------------------------------------------------------------------ memory, colocated training

    async def release_memory(self) -> None:
        """While paused (placement colocated, DESIGN.md §4): every server frees its KV cache and
        what it can of its weights' memory for the trainer — SGLang's (and agentrl serve's)
        ``/release_memory_occupation``, vLLM's ``/sleep`` at level 1. ``occupy_memory`` takes the
        weights back before an update, ``resume`` the rest before generation goes on."""
        if self._unpaused.is_set():
            raise RuntimeError("release_memory needs paused servers: call pause() first")
        await self._control(*(await self._resolve()).release_memory())
        self._released = set(MEMORY_TAGS)

    async def occupy_memory(self, *, weights_only: bool = False) -> None:
        """Take back what ``release_memory`` freed: the weights alone (before a weight update:
        SGLang and vLLM update resident weights, and an update's buffers need not coexist with the
        KV cache), or everything left."""
        backend = await self._resolve()
        if "weights" in self._released:
            await self._control(*backend.occupy_memory(["weights"]))
            self._released.discard("weights")
        if weights_only or not self._released:
            return
        await self._control(*backend.occupy_memory(sorted(self._released)))
        self._released.clear()

    # ------------------------------------------------------------------ weights over torch.distributed

    async def _every_server(self, path: str, payloads: list[dict[str, Any]]) -> list[Any]:
        """POST ``payloads[i]`` to server ``i`` — all of them, healthy or not: a process group
        needs every member — and raise the first failure (after all have answered)."""
        answers = await asyncio.gather(*(self._post(s, path, p, self.control_timeout)
                                         for s, p in zip(self._servers, payloads, strict=True)),
                                       return_exceptions=True)
        for s, a in zip(self._servers, answers, strict=True):
            if isinstance(a, BaseException):
                if isinstance(a, RequestRejected | ServerError):
                    raise a
                raise ServerUnavailable(f"{s.address}{path} failed: {a!r}") from a
        return answers

    async def weight_group_ranks(self) -> list[int]:
        """How many ranks each server takes in a weight group: its GPUs (``tp_size`` x
        ``pp_size`` of ``/server_info``; 1 for ``agentrl serve``; a vLLM server's workers)."""
        return await (await self._resolve()).group_ranks()

    async def can_stage_weights(self) -> bool:
        """Whether every server can receive broadcast buckets while generating and swap them in
        later (``agentrl serve``'s ``/server_info``: ``agentrl_staged_weight_updates``; SGLang
        has no such thing and swaps each bucket in on arrival; vLLM neither)."""
        return await (await self._resolve()).can_stage()

    async def init_weights_update_group(self, master_address: str, master_port: int, *, group_name: str,
                                        backend: str, ranks: list[int] | None = None) -> None:
        """Every server joins the trainer's group ``group_name`` (the trainer, rank 0, hosts it at
        ``master_address:master_port`` and must join at the same time: each call returns when all
        ranks have joined). Server ``i`` takes ``ranks[i]`` ranks (default 1) from
        ``rank_offset = 1 + sum(ranks[:i])``, of ``1 + sum(ranks)`` (AReaL's layout). A vLLM
        server's workers join through agentrl's worker extension (``vllm_backend.INIT_GROUP``)."""
        ranks = ranks or [1] * len(self._servers)
        offsets = [1 + sum(ranks[:i]) for i in range(len(ranks))]
        await (await self._resolve()).join_group(master_address, master_port, group_name=group_name,
                                                 group_backend=backend, offsets=offsets, world_size=1 + sum(ranks))

    async def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]], *,
                                              group_name: str, version: int | None = None,
                                              load_format: str | None = None, stage_only: bool = False) -> None:
        """Every server receives these tensors by broadcast from rank 0 of ``group_name`` (the
        caller broadcasts them at the same time; one collective per tensor, or with
        ``load_format="flattened_bucket"`` one for all their bytes end to end) and swaps them in.
        With ``version`` (the last bucket of an update), the servers and the client move to it.
        ``stage_only`` (``agentrl serve`` only, ``can_stage_weights``): the servers keep them in a
        staging copy instead, and go on generating; ``commit_staged_weights`` swaps them in.

        vLLM (through agentrl's worker extension): every worker keeps the buckets it receives
        and, at the one with ``version``, checks them all and loads them at once; then the
        version is set and the prefix cache emptied, as after a load from disk."""
        await (await self._resolve()).receive_weights(names, dtypes, shapes, group_name=group_name, version=version,
                                                      load_format=load_format, stage_only=stage_only)
        if version is not None and not stage_only:
            self._served_by_broadcast(int(version))

    async def commit_staged_weights(self, group_name: str, version: int) -> None:
        """Every server swaps in the buckets it staged on ``group_name`` (``stage_only``) and
        serves ``version``; so does the client (``agentrl serve``'s ``/agentrl/commit_staged_weights``)."""
        await (await self._resolve()).commit_staged(group_name, int(version))
        self._served_by_broadcast(int(version))

    async def stage_lora_adapter_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                                  *, group_name: str, config: dict[str, Any],
                                                  load_format: str | None = None) -> None:
        """Every server receives a LoRA adapter's tensors (peft's names, one broadcast from rank 0
        of ``group_name``, sent by the caller at the same time) with its ``config`` (``r``,
        ``lora_alpha``, ``target_modules``) and merges it into its base weights in a staging copy
        while it keeps generating; ``commit_staged_weights`` serves it (``agentrl serve`` only:
        ``/agentrl/lora_adapter_from_distributed``). A refusal raises ``RequestRejected``."""
        await (await self._resolve()).receive_adapter(names, dtypes, shapes, group_name=group_name, config=config,
                                                      load_format=load_format, name=None)

    async def load_lora_adapter_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                                 *, group_name: str, config: dict[str, Any], version: int,
                                                 load_format: str | None = None) -> None:
        """As ``stage_lora_adapter_from_distributed``, but every server loads the adapter as
        ``lora_name(version)`` (no request names it yet: ``serve_lora_adapter``), as
        ``load_lora_adapter`` does from disk. The same version loaded again replaces it."""
        name = lora_name(version)
        if name in self._adapters:
            del self._adapters[name]
            await self._unload(name)
        await (await self._resolve()).receive_adapter(names, dtypes, shapes, group_name=group_name, config=config,
                                                      load_format=load_format, name=name)
        self._adapters[name] = None
        for s in self._servers:  # every member received it: a stale one can serve it too
            if not s.healthy:
                s.healthy, s.down_since = True, time.monotonic()
            s.stale = False

    def _served_by_broadcast(self, version: int) -> None:
        self._last_update = (None, version)
        self._version, self._lora = version, None
        for s in self._servers:  # every member received it: each one serves this version now
            if not s.healthy:
                s.healthy, s.down_since = True, time.monotonic()
            s.stale = False

    async def wait_for_servers(self, timeout_s: float) -> None:
        """Return once every server answers ``GET /health`` (a group is formed with all of them)."""
        deadline = time.monotonic() + timeout_s
        while True:
            alive = await asyncio.gather(*(self._alive(s) for s in self._servers))
            if all(alive):
                return
            if time.monotonic() > deadline:
                down = [s.address for s, ok in zip(self._servers, alive, strict=True) if not ok]
                raise ServerUnavailable(f"inference server(s) {down} did not answer /health for {timeout_s:.0f} s; "
                                        "a weight group needs every server")
            await asyncio.sleep(self.health_check_interval)

    async def destroy_weights_update_group(self, group_name: str) -> None:
        """Every server that answers leaves ``group_name`` (best effort: one that never joined,
        or died, is not an error here)."""
        path, body = (await self._resolve()).leave_group(group_name)
        await asyncio.gather(*(self._post(s, path, body, self.control_timeout) for s in self._servers),
                             return_exceptions=True)

    async def begin_weight_update(self) -> None:
        """Before the buckets of a distributed update: SGLang 0.5.23 loads them only inside a
        session (older SGLang and ``agentrl serve`` need none); vLLM's workers need none."""
        await (await self._resolve()).begin_update()

    async def end_weight_update(self) -> None:
        await (await self._resolve()).end_update()
