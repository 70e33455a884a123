"""Weight updates over torch.distributed for ``agentrl serve``: SGLang's three routes, and ours.

What it is: ``weight_sync_routes(state)`` — ``POST /init_weights_update_group`` (join the
trainer's group), ``POST /update_weights_from_distributed`` (receive a bucket of tensors by
broadcast, check them, swap them in between two scheduler steps) and ``POST
/destroy_weights_update_group``, with sglang 0.5.23's fields and answers
(``python/sglang/srt/managers/io_struct.py``, ``python/sglang/srt/entrypoints/http_server.py``);
and ours, ``"agentrl_stage_only": true`` + ``POST /agentrl/commit_staged_weights``, so the
transfer overlaps generation, and ``POST /agentrl/lora_adapter_from_distributed``: a LoRA
adapter's tensors, received into an adapter (merged into a staging copy, or loaded by name),
never into the served weights. The protocol, the checks and the differences from SGLang are in
docs/DESIGN.md §4 "Weight update". gloo on CPU, NCCL on GPU; the group is made by
``agentrl.process_group`` and shares nothing with anything else in the process.

Trust boundary: these routes sit behind ``--api-key`` like every control route. Covered: every
malformed field is a 4xx naming it; nothing larger than twice the served model is allocated
for a request. Not covered: whoever may call ``/init_weights_update_group`` decides where the
server connects and, through the group, what it receives — which the checks (names, shapes, dtypes, finite values) bound to
well-formed weights of the served architecture, not to good ones.

What it is not: the disk route (``native_routes``), the checks themselves (``hf_weights``) or
the trainer's side (``agentrl.trainer.publish``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from agentrl.errors import ModelError, Refused
from agentrl.inference.lora_adapter import adapter_of, check_config
from agentrl.inference.native_routes import update_options
from agentrl.inference.state import ServerState
from agentrl.inference.wire import check_type, read_json
from agentrl.process_group import BACKENDS, UpdateGroup, open_process_group, unflatten

log = logging.getLogger(__name__)

DEFAULT_GROUP = "weight_update_group"
BROKEN = ("the group {name!r} is out of step with its sender (a broadcast was left unreceived); destroy it "
          "(/destroy_weights_update_group) and initialise a new one")


FLATTENED = "flattened_bucket"


STAGE_ONLY = "agentrl_stage_only"
"""Ours, not SGLang's: an ``/update_weights_from_distributed`` field; true receives and checks
the bucket into the group's staging copy without serving it (``COMMIT_ROUTE`` swaps it in)."""
COMMIT_ROUTE = "/agentrl/commit_staged_weights"
"""Ours, not SGLang's: swap in what ``agentrl_stage_only`` buckets staged, with the version."""
LORA_ROUTE = "/agentrl/lora_adapter_from_distributed"
"""Ours, not SGLang's: a LoRA adapter's tensors (peft's names, all in this one request) by
broadcast, with its ``lora_config``; with ``lora_name`` loaded under that name (as
``/load_lora_adapter``), without it merged into the base weights in the group's staging copy,
which ``COMMIT_ROUTE`` serves."""
LORA_CONFIG_KEYS = ("peft_type", "r", "lora_alpha", "target_modules", "use_rslora")
"""What a broadcast adapter's ``lora_config`` may hold (the trainer's ``adapter_metadata``)."""


@dataclass
class _Staging:
    weights: dict  # the staging copy, every bucket so far laid over the served weights
    origin: dict  # the served weights it was laid over: a commit after any other update is refused


@dataclass
class _Open:
    group: UpdateGroup
    busy: asyncio.Lock = field(default_factory=asyncio.Lock)
    broken: bool = False
    flat: torch.Tensor | None = None  # the last flattened bucket's buffer, reused (no fresh pages to fault in)
    staged: _Staging | None = None  # buckets received with agentrl_stage_only, not yet committed


def weight_sync_routes(state: ServerState) -> APIRouter:
    """SGLang's distributed weight-update routes over ``state``'s engine, and ours (one group table)."""
    groups = _WeightGroups(state)
    router = APIRouter()
    router.add_api_route("/init_weights_update_group", groups.init_weights_update_group, methods=["POST"])
    router.add_api_route("/update_weights_from_distributed", groups.update_weights_from_distributed, methods=["POST"])
    router.add_api_route(COMMIT_ROUTE, groups.commit_staged_weights, methods=["POST"])
    router.add_api_route(LORA_ROUTE, groups.lora_adapter_from_distributed, methods=["POST"])
    router.add_api_route("/destroy_weights_update_group", groups.destroy_weights_update_group, methods=["POST"])
    return router


class _WeightGroups:
    """The weight-update groups one server has open, and the routes that open, use and close them."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.groups: dict[str, _Open] = {}
        self.joining: set[str] = set()

    async def init_weights_update_group(self, http: Request) -> JSONResponse:
        body = await read_json(http, self.state.config.max_request_bytes)
        address = body.get("master_address")
        if not isinstance(address, str) or not address:
            raise Refused("master_address is required: the host of the trainer's rank 0")
        port = _integer(body, "master_port", lo=1, hi=65535)
        rank = _integer(body, "rank_offset", lo=0)
        world = _integer(body, "world_size", lo=1)
        name = body.get("group_name", DEFAULT_GROUP)
        backend = body.get("backend", "nccl")
        if not isinstance(name, str) or not name:
            raise Refused("group_name must be a non-empty string")
        if backend not in BACKENDS:
            raise Refused(f"backend must be one of {', '.join(repr(b) for b in BACKENDS)}, got {backend!r}")
        if backend == "nccl" and self.state.config.device != "cuda":
            raise Refused("backend 'nccl' needs a server on a GPU (--device cuda); this one runs on CPU: "
                             "use backend 'gloo'")
        if rank >= world:
            raise Refused(f"rank_offset {rank} is outside world_size {world} (ranks are 0 .. world_size - 1; "
                             "the trainer is rank 0)")
        if name in self.groups or name in self.joining:
            return _answer(False, f"Failed to initialize custom process group: a group named {name!r} is already "
                                  "open; destroy it first (/destroy_weights_update_group)")
        self.joining.add(name)
        try:
            group = await asyncio.to_thread(open_process_group, master_address=address, master_port=port, rank=rank,
                                            world_size=world, group_name=name, backend=backend)
        except Exception as e:  # the trainer never came, or the address is wrong: the caller's to fix
            log.warning("self.joining weight group %r at %s:%d failed: %s", name, address, port, e)
            return _answer(False, f"Failed to initialize custom process group: {e}.")
        finally:
            self.joining.discard(name)
        self.groups[name] = _Open(group)
        return _answer(True, "Succeeded to initialize custom process group.")

    async def update_weights_from_distributed(self, http: Request) -> JSONResponse:
        body = await read_json(http, self.state.config.max_request_bytes)
        name, opened = _group_of(self.groups, body)
        if isinstance(opened, JSONResponse):
            return opened
        async with opened.busy:
            try:
                version, abort_all = update_options(body)
                flattened = _flattened(body)
                for key in ("flush_cache", "torch_empty_cache", STAGE_ONLY):
                    check_type(key, body.get(key, False), (bool,), "true or false")
                stage_only = body.get(STAGE_ONLY, False)
                if stage_only and (version is not None or abort_all):
                    raise Refused(f"weight_version and abort_all_requests go with {COMMIT_ROUTE}, not with a "
                                     f"{STAGE_ONLY} bucket")
                names, specs = _tensor_specs(body, limit_bytes=_byte_limit(self.state), flattened=flattened)
            except Refused as e:  # nothing was received: the sender's broadcast has no taker now
                opened.broken = True
                return _answer(False, f"Failed to receive weights: {e}; nothing was received, and "
                                      + BROKEN.format(name=name))
            device = torch.device("cpu") if opened.group.backend == "gloo" else self.state.decoder.device
            async with self.state.weight_lock:  # one staging copy at a time (the disk route takes it too)
                staging, opened.staged = opened.staged, None
                moved = staging is not None and staging.origin is not self.state.decoder.weights
                if staging is not None and (moved or not stage_only):
                    # a plain (SGLang) update, or another update served since: what was staged is dropped
                    self.state.decoder.discard(staging.weights)
                    staging = None
                onto = staging.weights if staging is not None else None
                receive = _receive_flat if flattened else _receive
                try:
                    tensors, fresh = await asyncio.to_thread(receive, self.state, opened, names, specs, device, onto)
                except Exception as e:  # a timeout or a lost peer: the group cannot be trusted any more
                    opened.broken = True
                    if onto is not None:
                        self.state.decoder.discard(onto)
                    log.warning("receiving weights on group %r failed: %s", name, e)
                    return _answer(False, f"Failed to receive weights: {e}; " + BROKEN.format(name=name))
                try:
                    weights = await asyncio.to_thread(self.state.decoder.prepare_tensors, list(zip(names, tensors, strict=True)),
                                                      "update_weights_from_distributed", fresh, onto)
                except ModelError as e:
                    if onto is not None:  # partly overwritten in place
                        self.state.decoder.discard(onto)
                    return _answer(False, f"Failed to update weights: {e}" + (
                        "; the weights staged so far are dropped" if stage_only else ""))
                if stage_only:
                    if moved:
                        self.state.decoder.discard(weights)
                        return _answer(False, "Failed to stage weights: the served weights changed (another update) "
                                              "since the first staged bucket; the staged weights are dropped, send "
                                              "them all again")
                    opened.staged = _Staging(weights, staging.origin if staging is not None else self.state.decoder.weights)
                    return _answer(True, f"Staged {len(names)} tensor(s); {COMMIT_ROUTE} serves them.")
                await asyncio.wrap_future(self.state.scheduler.install_weights(weights, version, abort_all))
        message = "Succeeded to update parameter online."
        if version is not None:
            message += f" Weight version updated to {version}."
        return _answer(True, message)

    async def commit_staged_weights(self, http: Request) -> JSONResponse:
        body = await read_json(http, self.state.config.max_request_bytes, allow_empty=True)
        name = body.get("group_name", DEFAULT_GROUP)
        version, abort_all = update_options(body)
        check_type("flush_cache", body.get("flush_cache", True), (bool,), "true or false")
        opened = self.groups.get(name) if isinstance(name, str) else None
        if opened is None:
            return _answer(False, f"Group {name!r} not in {sorted(self.groups)}. Please call `init_weights_update_group` "
                                  "first.")
        async with opened.busy, self.state.weight_lock:
            staging, opened.staged = opened.staged, None
            if staging is None:
                return _answer(False, f"Nothing is staged on group {name!r}: send the buckets with "
                                      f"{STAGE_ONLY}: true first (or without it, to swap each one in as SGLang does)")
            if staging.origin is not self.state.decoder.weights:
                self.state.decoder.discard(staging.weights)
                return _answer(False, "Failed to update weights: the served weights changed (another update) since "
                                      "these were staged; they are dropped, send them all again")
            await asyncio.wrap_future(self.state.scheduler.install_weights(staging.weights, version, abort_all))
        message = "Succeeded to update parameter online."
        if version is not None:
            message += f" Weight version updated to {version}."
        return _answer(True, message)

    async def lora_adapter_from_distributed(self, http: Request) -> JSONResponse:
        body = await read_json(http, self.state.config.max_request_bytes)
        name, opened = _group_of(self.groups, body)
        if isinstance(opened, JSONResponse):
            return opened
        async with opened.busy:
            try:
                flattened = _flattened(body)
                names, specs = _tensor_specs(body, limit_bytes=_byte_limit(self.state), flattened=flattened)
                if len(set(names)) != len(names):
                    raise Refused("names must be distinct: each adapter tensor once")
                config = _lora_config(body.get("lora_config"))
                lora_name = body.get("lora_name")
                if lora_name is not None and (not isinstance(lora_name, str) or not lora_name):
                    raise Refused("lora_name must be a non-empty string (load the adapter under that name), or "
                                  "absent (merge it into the base weights)")
            except Refused as e:  # nothing was received: the sender's broadcast has no taker now
                opened.broken = True
                return _answer(False, f"Failed to receive the LoRA adapter: {e}; nothing was received, and "
                                      + BROKEN.format(name=name))
            device = torch.device("cpu") if opened.group.backend == "gloo" else self.state.decoder.device
            receive = _receive_flat if flattened else _receive
            try:
                tensors, _ = await asyncio.to_thread(receive, self.state, opened, names, specs, device, plain=True)
            except Exception as e:  # a timeout or a lost peer: the group cannot be trusted any more
                opened.broken = True
                log.warning("receiving a LoRA adapter on group %r failed: %s", name, e)
                return _answer(False, f"Failed to receive the LoRA adapter: {e}; " + BROKEN.format(name=name))
            try:
                adapter = await asyncio.to_thread(_checked_adapter, self.state, names, tensors, config)
                if lora_name is not None:
                    if lora_name in self.state.loras:
                        raise ModelError(f"an adapter named {lora_name[:200]!r} is already loaded (unload it first)")
                    lora = await asyncio.to_thread(self.state.decoder.runtime_adapter, adapter, lora_name,
                                                   f"broadcast:{name}")
                    if lora_name in self.state.loras:  # loaded under this name meanwhile
                        raise ModelError(f"an adapter named {lora_name[:200]!r} is already loaded (unload it first)")
                    self.state.loras[lora_name] = lora
                    return _answer(True, f"Loaded LoRA adapter {lora_name} ({len(names)} tensors).")
                async with self.state.weight_lock:  # one staging copy at a time (the disk route takes it too)
                    staging, opened.staged = opened.staged, None
                    if staging is not None:  # buckets or an adapter staged before: replaced
                        self.state.decoder.discard(staging.weights)
                    origin = self.state.decoder.weights
                    weights = await asyncio.to_thread(self.state.decoder.merge_adapter, adapter)
                    opened.staged = _Staging(weights, origin)
            except ModelError as e:
                return _answer(False, f"Failed to load LoRA adapter: {e}")
        return _answer(True, f"Staged the LoRA adapter ({len(names)} tensors) merged into the base weights; "
                             f"{COMMIT_ROUTE} serves them.")

    async def destroy_weights_update_group(self, http: Request) -> JSONResponse:
        body = await read_json(http, self.state.config.max_request_bytes, allow_empty=True)
        name = body.get("group_name", DEFAULT_GROUP)
        opened = self.groups.get(name) if isinstance(name, str) else None
        if opened is None:
            return _answer(False, "The group to be destroyed does not exist.")
        if opened.busy.locked():
            return _answer(False, f"Failed to destroy custom process group: an update on {name!r} is in flight.")
        del self.groups[name]
        opened.staged = None  # uncommitted staged weights go with their group
        with contextlib.suppress(Exception):
            opened.group.close()
        return _answer(True, "Succeeded to destroy custom process group.")


def _answer(success: bool, message: str) -> JSONResponse:
    return JSONResponse({"success": success, "message": message}, status_code=200 if success else 400)


def _group_of(groups: dict[str, _Open], body: dict[str, Any]) -> tuple[Any, _Open | JSONResponse]:
    """The request's group (``group_name``), or SGLang's answer when it is unknown or broken."""
    name = body.get("group_name", DEFAULT_GROUP)
    opened = groups.get(name) if isinstance(name, str) else None
    if opened is None:
        return name, _answer(False, f"Group {name!r} not in {sorted(groups)}. Please call "
                                    "`init_weights_update_group` first.")
    if opened.broken:
        return name, _answer(False, BROKEN.format(name=name))
    return name, opened


def _flattened(body: dict[str, Any]) -> bool:
    """Whether the tensors come as SGLang's ``flattened_bucket``, the one ``load_format`` taken."""
    if body.get("load_format") is not None and body.get("load_format") != FLATTENED:
        raise Refused(f"load_format {str(body['load_format'])[:40]!r} is not supported by agentrl serve; leave it "
                      f"null (one broadcast per tensor) or send {FLATTENED!r}")
    return body.get("load_format") == FLATTENED


def _integer(body: dict[str, Any], key: str, *, lo: int, hi: int | None = None) -> int:
    """An integer field (a numeric string too, as SGLang's lax parsing takes ``"29500"``)."""
    value = body.get(key)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise Refused(f"{key} is required: an integer {bound}, got {value!r}")
    return value


def _dtype(text: Any, i: int) -> torch.dtype:
    """``"bfloat16"`` (SGLang's spelling, ``getattr(torch, name)``) or ``"torch.bfloat16"``."""
    if isinstance(text, str):
        found = getattr(torch, text.removeprefix("torch."), None)
        if isinstance(found, torch.dtype):
            return found
    raise Refused(f"dtypes[{i}] must name a torch dtype such as 'float32' or 'bfloat16', got {str(text)[:40]!r}")


def _tensor_specs(body: dict[str, Any], *, limit_bytes: int,
                  flattened: bool = False) -> tuple[list[str], list[tuple[torch.dtype, list[int]]]]:
    """``names`` and each tensor's (dtype, shape), checked enough to receive them (flattened:
    each tensor's bytes start at a multiple of its element size, as SGLang's bucket requires)."""
    names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
    for key, value in (("names", names), ("dtypes", dtypes), ("shapes", shapes)):
        if not isinstance(value, list):
            raise Refused(f"{key} is required: a list with one entry per tensor")
    if not len(names) == len(dtypes) == len(shapes):
        raise Refused(f"names, dtypes and shapes must have one entry per tensor; got {len(names)}, "
                         f"{len(dtypes)} and {len(shapes)}")
    specs, total = [], 0
    for i, (n, d, s) in enumerate(zip(names, dtypes, shapes, strict=True)):
        if not isinstance(n, str) or not n:
            raise Refused(f"names[{i}] must be a tensor name (a non-empty string)")
        if not isinstance(s, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in s):
            raise Refused(f"shapes[{i}] (of {n[:200]!r}) must be a list of non-negative integers")
        dtype = _dtype(d, i)
        if flattened and total % dtype.itemsize:
            raise Refused(f"tensor {n[:200]!r} starts at byte {total} of the flattened bucket, not a multiple "
                             f"of its element size {dtype.itemsize}")
        total += math.prod(s) * dtype.itemsize
        specs.append((dtype, s))
    if total > limit_bytes:
        raise Refused(f"the request announces {total} bytes of tensors, more than this server would receive "
                         f"({limit_bytes}: twice its model in float32); send the model in buckets")
    return names, specs


def _byte_limit(state: ServerState) -> int:
    """Twice the served model in float32 (and 1 MiB): more than any honest request announces."""
    return 2 * 4 * sum(math.prod(slot.shape) for slot in state.decoder.slots.values()) + (1 << 20)


def _lora_config(config: Any) -> dict[str, Any]:
    """A broadcast adapter's ``lora_config``: only ``LORA_CONFIG_KEYS``, ``target_modules`` a
    list of projection names; the rest is checked as an adapter directory's config is."""
    if not isinstance(config, dict):
        raise Refused(f"lora_config is required: an object with {', '.join(LORA_CONFIG_KEYS)}")
    unknown = sorted(set(config) - set(LORA_CONFIG_KEYS))
    if unknown:
        raise Refused(f"lora_config holds {str(unknown)[:200]}; it takes {', '.join(LORA_CONFIG_KEYS)} only (a plain "
                      "LoRA)")
    targets = config.get("target_modules")
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise Refused("lora_config.target_modules must be a non-empty list of module names such as 'q_proj'")
    try:
        check_config({"peft_type": "LORA", **config}, "lora_config")
    except ModelError as e:
        raise Refused(str(e)) from None
    return config


def _checked_adapter(state: ServerState, names: list[str], tensors: list[torch.Tensor], config: dict[str, Any]):
    """The received tensors as a validated ``Adapter`` (copied out of the group's reused buffer):
    each of them a ``lora_A``/``lora_B`` of a module ``target_modules`` names."""
    where = f"the broadcast adapter ({LORA_ROUTE})"
    adapter = adapter_of({n: t.clone() for n, t in zip(names, tensors, strict=True)}, config, state.decoder.slots,
                         where=where, config_at="lora_config")
    for target in adapter.pairs:
        module = target.rsplit(".", 2)[-2]
        if module not in config["target_modules"]:
            raise ModelError(f"{where}: {target!r} has an adapter, but lora_config.target_modules "
                             f"{config['target_modules']} does not name {module!r}")
    return adapter


def _receive(state: ServerState, opened: _Open, names: list[str], specs: list[tuple[torch.dtype, list[int]]],
             device: torch.device, onto: dict | None = None, *, plain: bool = False) -> tuple[list[torch.Tensor], dict]:
    """Every announced tensor, one broadcast each from rank 0 (worker thread): where it has the
    served dtype and shape, straight into the staging copy's fused tensors (``onto``: the
    group's staging copy so far); ``plain``: into tensors of their own (an adapter's)."""
    if device == state.decoder.device and not plain:
        tensors, fresh = state.decoder.receive_targets([(n, d, tuple(s)) for n, (d, s) in zip(names, specs, strict=True)],
                                                       onto)
    else:
        tensors, fresh = [torch.empty(s, dtype=d, device=device) for d, s in specs], {}
    opened.group.broadcast(tensors)
    return tensors, fresh


def _receive_flat(state: ServerState, opened: _Open, names: list[str], specs: list[tuple[torch.dtype, list[int]]],
                  device: torch.device, onto: dict | None = None, *,
                  plain: bool = False) -> tuple[list[torch.Tensor], dict]:
    """SGLang's ``flattened_bucket``: one broadcast of every tensor's bytes end to end (worker
    thread); the tensors are views into that buffer, which the next bucket reuses (``plain``
    changes nothing here: an adapter's are copied out by the caller)."""
    total = sum(math.prod(s) * d.itemsize for d, s in specs)
    flat = opened.flat
    if flat is None or flat.numel() < total or flat.device != device:
        flat = opened.flat = torch.empty(total, dtype=torch.uint8, device=device)
    flat = flat[:total]
    opened.group.broadcast([flat])
    return unflatten(flat, specs), {}
