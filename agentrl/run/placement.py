"""Placement: where a run's processes go, and the checks of the keys that say so.

What it is: the policy that resolves ``placement: auto`` (``choose_placement``: colocated where
the started servers would share the trainer's GPU, decoupled elsewhere, with the reason the run
prints first) and ``rollout.worker: auto`` (``apply_rollout_worker``), the cores each phase gets
when colocated on a CPU (``apply_placement``), and the refusals, before anything starts, of a
placement that cannot exist: ranks that do not split over the nodes, a launcher or router not
installed (``check_placement``), more GPUs than the machine has or NCCL between two processes
on one GPU (``check_gpus``). Each error names its config key; ``cfg`` is a ``RunConfig``
(typed ``Any``: the run config imports this module).
What it is not: the launchers that start the processes (``agentrl.run.local_launcher``,
``agentrl.run.ray_launcher``) or the run config (``agentrl.run.run_config``).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from agentrl.errors import ConfigError

PLACEMENTS = ("auto", "colocated", "decoupled")


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def choose_placement(cfg: Any) -> tuple[str, str]:
    """(``colocated`` or ``decoupled``, why) for this run on this machine."""
    if cfg.placement != "auto":
        return cfg.placement, "placement set"
    elsewhere = ("deterministic mode (rounds overlap the train step)" if cfg.deterministic
                 else "launcher ray" if cfg.launcher == "ray" else f"{cfg.nnodes} nodes" if cfg.nnodes > 1
                 else "rollout.source gateway (agents call at any time)" if cfg.rollout.source == "gateway"
                 else "inference.servers run elsewhere" if cfg.inference.servers else "")
    if elsewhere:
        return "decoupled", elsewhere
    if cfg.device == "cuda":
        import torch

        from agentrl.run.local_launcher import server_has_own_gpu

        gpus = torch.cuda.device_count()
        if server_has_own_gpu(cfg, 0, gpus):
            return "decoupled", f"the servers have GPUs of their own ({gpus} GPUs)"
        return "colocated", f"the servers share the trainer's GPU ({gpus} GPU{'s' if gpus != 1 else ''})"
    return "decoupled", "a CPU: generation and training each keep their own threads"


def apply_placement(cfg: Any) -> str:
    """Resolve ``cfg.placement`` (and, colocated on a CPU, give each phase every core: ``threads``
    per trainer rank and ``inference.threads`` per started server); returns the run's first line."""
    placement, why = choose_placement(cfg)
    cfg.placement = placement
    release = cfg.inference.release_memory
    if placement == "decoupled":
        if release:
            raise ConfigError(f"config key 'inference.release_memory': true frees the servers' memory while the "
                              f"trainer trains, which needs placement colocated (this run is decoupled: {why})")
        cfg.inference.release_memory = False
        return f"placement decoupled ({why}): generation and training run at the same time"
    if release is None:
        cfg.inference.release_memory = cfg.device == "cuda"
    line = f"placement colocated ({why}): generation and training take turns"
    if cfg.device == "cpu":
        cores = usable_cores()
        cfg.threads = max(1, cores // cfg.world_size)
        if not cfg.inference.servers:
            cfg.inference.threads = max(1, cores // cfg.inference.num_servers)
        line += f", each with all {cores} cores (threads={cfg.threads}, inference.threads={cfg.inference.threads})"
    if cfg.inference.release_memory:
        line += ", the servers' memory released while the trainer trains"
    return line


def rollout_stays_in_rank_0(cfg: Any) -> str:
    """Why this run's episodes must run in rank 0's event loop ("" if they need not)."""
    return ("deterministic mode (the lockstep clock paces both)" if cfg.deterministic
            else "rollout.source gateway (the gateway's agents feed the executor)" if cfg.rollout.source == "gateway"
            else "recorded steps (nothing is generated)" if cfg.rollout.recorded is not None else "")


def apply_rollout_worker(cfg: Any) -> str:
    """Resolve ``cfg.rollout.worker`` (``process`` or ``thread``); returns the line that says which and why."""
    here = rollout_stays_in_rank_0(cfg)
    if cfg.rollout.worker == "auto":
        cfg.rollout.worker, why = ("thread", here) if here else (
            "process", "the episodes' Python does not wait on the trainer's interpreter lock")
    else:
        why = "rollout.worker set"
    where = "a process of their own" if cfg.rollout.worker == "process" else "rank 0's event loop"
    return f"rollout.worker {cfg.rollout.worker} ({why}): episodes run in {where}"


def check_rollout_worker(cfg: Any) -> None:
    """``rollout.worker: process`` where the episodes must stay in rank 0's event loop."""
    if cfg.rollout.worker == "process" and (here := rollout_stays_in_rank_0(cfg)):
        raise ConfigError(f"config key 'rollout.worker': process cannot run with {here}; use thread (or auto)")


def check_placement(cfg: Any) -> None:
    """The keys that say where processes go: nodes, launcher, router."""
    if cfg.world_size % cfg.nnodes:
        raise ConfigError(f"config key 'world_size': {cfg.world_size} ranks cannot be split evenly over "
                          f"nnodes={cfg.nnodes} (torchrun runs the same number of ranks on every node)")
    if cfg.node_rank >= cfg.nnodes:
        raise ConfigError(f"config key 'node_rank': {cfg.node_rank} is not below nnodes={cfg.nnodes}")
    if cfg.nnodes > 1 and cfg.master_port is None:
        raise ConfigError("config key 'master_port': nnodes > 1 needs a fixed rendezvous port that every node "
                          "is given (and master_addr, an address of node 0 they all reach)")
    if cfg.launcher == "ray":
        if cfg.nnodes > 1:
            raise ConfigError("config key 'nnodes': with launcher=ray, Ray places the ranks; leave nnodes at 1 "
                              "and run `agentrl train` once, on a node of the cluster")
        if importlib.util.find_spec("ray") is None:
            raise ConfigError("config key 'launcher': ray is not installed (pip install 'agentrl[ray]')")
    if cfg.placement == "colocated" and (cfg.launcher == "ray" or cfg.nnodes > 1):
        raise ConfigError("config key 'placement': colocated runs on one machine with the local launcher; use "
                          "placement: decoupled with launcher ray or several nodes")
    if cfg.inference.router == "sglang" and importlib.util.find_spec("sglang_router") is None:
        raise ConfigError("config key 'inference.router': sglang-router is not installed "
                          "(pip install 'agentrl[router]')")


def check_gpus(cfg: Any) -> None:
    """A local run's GPUs: enough for the trainer ranks of this node and the SGLang servers it
    starts, and one of their own for servers that take weights over NCCL."""
    if cfg.launcher != "local" or (cfg.device != "cuda" and cfg.inference.engine != "sglang"):
        return
    import torch

    from agentrl.run.local_launcher import server_has_own_gpu

    have = torch.cuda.device_count()
    need = cfg.world_size // cfg.nnodes if cfg.device == "cuda" else 0
    if cfg.inference.engine == "sglang" and not cfg.inference.servers and cfg.node_rank == 0:
        need += cfg.inference.num_servers
    if need > have:
        raise ConfigError(f"config keys 'device'/'world_size'/'inference': the run needs {need} GPUs, "
                          f"this machine has {have}")
    sync = cfg.trainer.weight_sync
    nccl = sync.backend_for(cfg.device) == "nccl"
    if (sync.transport == "distributed" and nccl and cfg.inference.engine in ("agentrl", "vllm")
            and not cfg.inference.servers and not server_has_own_gpu(cfg, cfg.inference.num_servers - 1, have)):
        raise ConfigError(
            "config key 'trainer.weight_sync.transport': distributed weights go over NCCL, which cannot join "
            f"two processes on one GPU, and this machine's {have} GPU(s) leave the inference servers none of "
            f"their own (they share the trainer's: world_size {cfg.world_size // cfg.nnodes} + num_servers "
            f"{cfg.inference.num_servers} > {have}); use transport: disk here, or a machine with a GPU per "
            "server beside the trainer's")
