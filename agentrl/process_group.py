"""A torch.distributed process group of its own: how a trainer and inference servers meet.

What it is: ``open_process_group(...)`` — a ``TCPStore`` at ``master_address:master_port``
(rank 0 hosts it, the others connect), a ``PrefixStore`` named after the group, and a gloo
(CPU) or NCCL (GPU) backend built directly on it — and ``UpdateGroup.broadcast``, which sends
(rank 0) or receives (every other rank) a list of tensors in order. This is the group behind
SGLang's ``/init_weights_update_group`` and ``/update_weights_from_distributed``: trainer rank
0 is rank 0, inference server ``i`` is rank ``rank_offset = 1 + i``.

Why not ``torch.distributed.init_process_group``: a process has one default group, and the
trainer's is its FSDP ranks; an inference server may hold several weight groups over its
life. Like SGLang's ``init_custom_process_group`` (``python/sglang/srt/utils/common.py``) the
group is made without the default one, but we build the backend object itself rather than
going through c10d's private ``_new_process_group_helper``: nothing is registered in c10d's
global state, so the group cannot clash with any other group in the process, and dropping it
(``close``) is all the cleanup there is. The store's keys are laid out as that helper lays
them under SGLang's function, so over NCCL our trainer can meet SGLang's servers. Over gloo
only our own two ends meet: for ``"gloo"`` c10d also makes a second backend for CUDA tensors,
which ours does not.

What it is not: the weight-update protocol on either side (``agentrl.inference.weight_sync``
on the server, ``agentrl.trainer.publish`` on the trainer). Gloo picks its network interface
as torch does (``GLOO_SOCKET_IFNAME`` steers it across machines).

This module imports nothing but torch and the standard library: agentrl's vLLM worker
extension (``agentrl/client/vllm_worker``), which runs in vLLM's environment without agentrl,
loads this file by its path, so a vLLM worker joins the group exactly as ``agentrl serve`` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

BACKENDS = ("gloo", "nccl")
DEFAULT_TIMEOUT_S = 600.0
"""How long joining the group, or one broadcast, may wait for the other side."""


@dataclass
class UpdateGroup:
    """One open group: ``rank`` of ``world_size`` over ``backend``. Rank 0 is the sender."""

    name: str
    rank: int
    world_size: int
    backend: str
    pg: Any = field(repr=False)
    store: Any = field(repr=False)

    def broadcast(self, tensors: list[torch.Tensor]) -> None:
        """Broadcast ``tensors`` from rank 0, in order (one collective each, all in flight at
        once, as SGLang's receiver posts them). Rank 0's are sent; the others' are filled."""
        works = [self.pg.broadcast([t], _root_zero()) for t in tensors]
        for w in works:
            w.wait()

    def close(self) -> None:
        """Tear the group down (NCCL communicators are aborted; gloo's sockets close with it)."""
        pg, self.pg, self.store = self.pg, None, None
        if pg is not None and self.backend == "nccl":
            shutdown = getattr(pg, "shutdown", None) or getattr(pg, "abort", None)
            if shutdown is not None:
                shutdown()


def unflatten(flat: torch.Tensor, specs: list[tuple[torch.dtype, list[int]]]) -> list[torch.Tensor]:
    """The tensors of one ``flattened_bucket`` (SGLang's layout: each tensor's bytes end to end,
    in order, in one uint8 buffer) as views into ``flat``; ``specs``: their dtypes and shapes."""
    tensors, at = [], 0
    for dtype, shape in specs:
        size = math.prod(shape) * dtype.itemsize
        tensors.append(flat[at : at + size].view(dtype).reshape(shape))
        at += size
    if at != flat.numel():
        raise ValueError(f"the bucket holds {flat.numel()} bytes, its tensors {at}")
    return tensors


def _root_zero() -> Any:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    opts.rootTensor = 0
    return opts


def host_store(world_size: int, *, port: int = 0, timeout_s: float = DEFAULT_TIMEOUT_S) -> Any:
    """Rank 0's ``TCPStore``, listening now (``port`` 0: a free one; ``store.port`` says which),
    so the others can be told where to join before rank 0 blocks in ``open_process_group``."""
    # the store listens on every interface; "127.0.0.1" is only where rank 0 reaches it itself
    return dist.TCPStore("127.0.0.1", port, world_size, True, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def open_process_group(*, master_address: str, master_port: int, rank: int, world_size: int,
                       group_name: str, backend: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                       store: Any = None) -> UpdateGroup:
    """Join the group (rank 0 hosts it: pass its ``host_store``, or it is made here); blocks
    until all ``world_size`` ranks have joined or ``timeout_s`` passes. Raises ``ValueError``
    for settings that cannot work, and torch's ``RuntimeError`` (or ``DistStoreError``) when
    the others do not come."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside the group's world_size {world_size}")
    if not group_name:
        raise ValueError("group_name cannot be empty")
    timeout = timedelta(seconds=timeout_s)
    if store is None:
        store = (host_store(world_size, port=int(master_port), timeout_s=timeout_s) if rank == 0 else
                 dist.TCPStore(master_address, int(master_port), world_size, False, timeout=timeout))
    # the keys as SGLang's init_custom_process_group leaves them (its PrefixStore(group_name), then
    # c10d's _new_process_group_helper's "<group_name>/" and "<device>/"), so that our trainer meets
    # SGLang's servers over NCCL, and an SGLang-style trainer meets ours
    device = "cuda" if backend == "nccl" else "cpu"
    prefixed = dist.PrefixStore(f"{device}/", dist.PrefixStore(f"{group_name}/", dist.PrefixStore(group_name, store)))
    if backend == "gloo":
        pg = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
    else:
        nccl = getattr(dist, "ProcessGroupNCCL", None)
        if nccl is None or not torch.cuda.is_available():
            raise ValueError("backend 'nccl' needs a CUDA build of torch and a GPU; use 'gloo' on CPU")
        opts = nccl.Options()
        opts._timeout = timeout
        pg = nccl(prefixed, rank, world_size, opts)
    return UpdateGroup(group_name, rank, world_size, backend, pg, store)
