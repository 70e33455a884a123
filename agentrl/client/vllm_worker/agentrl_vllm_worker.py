"""Runs inside vLLM's worker processes, not agentrl's: a vLLM server that agentrl starts is
launched with ``--worker-extension-cls agentrl_vllm_worker.WorkerExtension`` and this directory
on its ``PYTHONPATH``, so vLLM imports this module from its own environment. It imports
nothing of agentrl's package (vLLM's environment has no agentrl) except one file by its path,
``agentrl/process_group.py`` (torch only), and adds the ``/collective_rpc`` methods below, which
``RemoteEngine`` calls (their names and bodies: ``agentrl/client/vllm_backend.py``).

``agentrl_reload_weights(weights_path)``: vLLM's in-place ``reload_weights``, then a fresh CPU
GEMM kernel for every embedding-kind layer that computes logits through one. vLLM's CPU build
(0.32) builds a oneDNN handle from a layer's weight when the model loads
(``vllm/model_executor/layers/utils.py``, ``dispatch_cpu_unquantized_gemm``), and the handle
keeps the weight as it was then. The reload rebuilds the handle of every layer it loads
weights into, but a tied ``lm_head`` loads none of its own (its weight is the embedding's; a
tied checkpoint has no ``lm_head.weight``), so without the second step its handle keeps
computing logits from the embedding the server started with. On a GPU no layer has such a
handle, and the second step rebuilds nothing.

Weights over torch.distributed (the trainer's ``DistributedTransport``): each worker joins the
trainer's group as ``agentrl serve`` does (``agentrl_init_weight_group``: gloo on a CPU, NCCL
on GPUs; rank ``rank_offset`` + the worker's rank in its server), receives every bucket the
trainer broadcasts (``agentrl_receive_weights``) into host memory, and at the update's last
bucket checks them all — every value finite, every tensor one the served checkpoint has, of
its shape — before loading any: refused weights leave the old ones serving, and the group stays
in step (every byte was received). Then one ``reload_weights`` of them all, as from disk, so a
fused layer whose parts came in different buckets is loaded whole.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

PROCESS_GROUP = Path(__file__).resolve().parents[2] / "process_group.py"
"""agentrl's group layout (``agentrl.process_group``), loaded by path: a worker meets the trainer
exactly as ``agentrl serve`` does. The file imports torch and the standard library only."""


def _process_group() -> Any:
    module = sys.modules.get("agentrl_process_group")
    if module is None:
        if not PROCESS_GROUP.is_file():
            raise RuntimeError(f"agentrl's {PROCESS_GROUP} is not beside the worker extension; give vLLM the "
                               "whole agentrl package directory, with agentrl/client/vllm_worker on PYTHONPATH")
        spec = importlib.util.spec_from_file_location("agentrl_process_group", PROCESS_GROUP)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


class WorkerExtension:
    """Mixed into vLLM's worker class by vLLM (``--worker-extension-cls``)."""

    def agentrl_reload_weights(self: Any, weights_path: str) -> int:
        """Load the checkpoint at ``weights_path`` in place; returns how many layers' CPU
        kernels were rebuilt from the weights just loaded (0 on a GPU)."""
        self.reload_weights(weights_path=weights_path)
        return self._agentrl_rebuild_embedding_kernels()

    def _agentrl_rebuild_embedding_kernels(self: Any) -> int:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

        rebuilt = 0
        with set_current_vllm_config(self.vllm_config):
            for module in self.model_runner.get_model().modules():
                method = getattr(module, "quant_method", None)
                if hasattr(module, "cpu_linear") and isinstance(method, UnquantizedEmbeddingMethod):
                    method.process_weights_after_loading(module)
                    rebuilt += 1
        return rebuilt

    # ------------------------------------------------------------------ weights over torch.distributed

    def agentrl_weight_group_rank(self: Any) -> int:
        """This worker's rank in its server (the server takes one group rank per worker)."""
        return int(self.rank)

    def agentrl_init_weight_group(self: Any, master_address: str, master_port: int, rank_offset: int,
                                  world_size: int, group_name: str, backend: str, timeout_s: float) -> dict:
        """Join the trainer's group ``group_name`` (it hosts the store at ``master_address:
        master_port`` and joins at the same time); returns when every rank has joined. A group
        of that name held before is left first, with anything it received."""
        self.agentrl_destroy_weight_group(group_name)
        group = _process_group().open_process_group(
            master_address=master_address, master_port=int(master_port), rank=int(rank_offset) + int(self.rank),
            world_size=int(world_size), group_name=group_name, backend=backend, timeout_s=float(timeout_s))
        self.__dict__.setdefault("_agentrl_groups", {})[group_name] = (group, [])
        return {"success": True, "message": f"joined {group_name!r} as rank {group.rank} of {group.world_size}"}

    def agentrl_receive_weights(self: Any, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                group_name: str, load_format: str | None, load: bool) -> dict:
        """Receive one bucket broadcast from rank 0 of ``group_name`` (one collective per tensor,
        or with ``load_format`` ``flattened_bucket`` one for all their bytes end to end) and keep
        it; with ``load`` (the update's last bucket), check every tensor received since the last
        load and load them all. ``{"success": false, "message": ...}``: refused, nothing loaded."""
        import torch

        held = self.__dict__.get("_agentrl_groups", {}).get(group_name)
        if held is None:
            raise RuntimeError(f"no weight group {group_name!r} on this worker: join it first "
                               "(agentrl_init_weight_group)")
        group, received = held
        specs = [(getattr(torch, d), [int(x) for x in s]) for d, s in zip(dtypes, shapes, strict=True)]
        device = torch.device("cpu") if group.backend == "gloo" else self.device
        if load_format == "flattened_bucket":
            flat = torch.empty(sum(_nbytes(d, s) for d, s in specs), dtype=torch.uint8, device=device)
            group.broadcast([flat])
            tensors = _process_group().unflatten(flat.cpu(), specs)
        elif load_format is None:
            tensors = [torch.empty(s, dtype=d, device=device) for d, s in specs]
            group.broadcast(tensors)
            tensors = [t.cpu() for t in tensors]
        else:
            raise ValueError(f"load_format {load_format!r}: expected null or 'flattened_bucket'")
        received.extend(zip(names, tensors, strict=True))
        if not load:
            return {"success": True, "message": f"received {len(names)} tensor(s)"}
        weights, received[:] = list(received), []
        problem = self._agentrl_problem(weights)
        if problem is not None:
            return {"success": False, "message": f"weights refused, the served ones kept: {problem}"}
        self.reload_weights(weights_iterator=iter(weights))
        self._agentrl_rebuild_embedding_kernels()
        return {"success": True, "message": f"loaded {len(weights)} tensor(s)"}

    def _agentrl_problem(self: Any, weights: list[tuple[str, Any]]) -> str | None:
        """The first reason not to load ``weights``, or None."""
        import torch

        served = self._agentrl_served_shapes()
        for name, t in weights:
            if served is not None and name not in served:
                return f"tensor {name!r} is not in the served checkpoint"
            if served is not None and tuple(t.shape) != served[name]:
                return f"tensor {name!r} has shape {list(t.shape)}, the served checkpoint's is {list(served[name])}"
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                return f"tensor {name!r} holds non-finite values (NaN or inf)"
        return None

    def _agentrl_served_shapes(self: Any) -> dict[str, tuple[int, ...]] | None:
        """name -> shape of every tensor of the checkpoint the server started on (read once), or
        None when it is not a local directory of safetensors (then only finiteness is checked)."""
        if "_agentrl_shapes" not in self.__dict__:
            from safetensors import safe_open

            root = Path(self.vllm_config.model_config.model)
            shapes: dict[str, tuple[int, ...]] | None = None
            if root.is_dir() and any(root.glob("*.safetensors")):
                shapes = {}
                for f in sorted(root.glob("*.safetensors")):
                    with safe_open(str(f), "pt") as fh:
                        for name in fh.keys():  # noqa: SIM118 (a safetensors handle is not a dict)
                            shapes[name] = tuple(fh.get_slice(name).get_shape())
            self._agentrl_shapes = shapes
        return self._agentrl_shapes

    def agentrl_destroy_weight_group(self: Any, group_name: str) -> dict:
        """Leave ``group_name`` (nothing to do when not in it), dropping what it received."""
        held = self.__dict__.get("_agentrl_groups", {}).pop(group_name, None)
        if held is not None:
            held[0].close()
        return {"success": True, "message": f"left {group_name!r}" if held else f"not in {group_name!r}"}


def _nbytes(dtype: Any, shape: list[int]) -> int:
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n
