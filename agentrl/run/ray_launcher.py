"""The Ray launcher of ``agentrl train`` (``launcher: ray``): the run's processes as Ray actors.

What it is: ``launch(cfg, run_dir)``, the local launcher's contract on a running Ray cluster
(``ray start --head`` on one node, ``ray start --address=HEAD:PORT`` on the others; joined
through ``ray.address``: ``auto`` reads ``RAY_ADDRESS``). In order:

  1. one ``ServerHost`` actor per inference server (``num_cpus = inference.threads``; one GPU
     when the server needs one: ``inference.engine: sglang`` or ``device: cuda``), which starts
     the same server the local launcher starts (``ManagedServer``) on its node, bound to that
     node's IP; none when ``inference.servers`` lists running ones;
  2. SGLang's router in this process's node when ``inference.router: sglang``;
  3. ``servers.json``, as the local launcher writes it;
  4. a placement group of ``world_size`` bundles (``threads`` CPUs, and a GPU with ``device:
     cuda``), placed by ``ray.placement_strategy``, and one ``TrainerRank`` actor per bundle.
     Rank 0's actor reports its node's IP and a free port; every actor then runs
     ``python -m agentrl.run.loop RUN_DIR`` with what torchrun would set (``RANK``,
     ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` = rank 0's), so the ranks
     form one torch.distributed group exactly as under torchrun. A rank with a GPU sees only
     its own (Ray sets ``CUDA_VISIBLE_DEVICES``), so its ``LOCAL_RANK`` is 0.

It watches like the local launcher: rank 0's output is echoed, a dead server is restarted on
its port (``inference.restart_failed``), a failed rank stops the run with the end of its log
(``RUN_DIR/logs/trainer-rank-R.log``). Every actor is killed and the placement group removed
on exit, Ctrl-C or failure; the cluster itself is left running.

Paths: the actors run in this process's working directory, and the config's relative paths
(model, datasets, run_dir) resolve there; on several nodes that directory, the model and
``run_dir`` must be on a filesystem every node sees, with the same Python environment.

What it is not: a Ray cluster manager (start and stop the cluster with Ray's own commands), nor
Ray Train: the ranks are our own loop, unchanged. Sandbox services are not placed by it: run
them with ``agentrl sandbox serve`` where Docker is, and give their URLs as ``sandbox.services``.
Main hook: ``launch(cfg, run_dir)``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError, ServerUnavailable, TrainerError
from agentrl.http_edge import SERVER_KEY_ENV
from agentrl.process.services import pump_output, stop_process
from agentrl.run.local_launcher import (
    ManagedServer,
    check_batch_invariant,
    ensure_server_key,
    watch_servers,
    write_servers,
)

FORWARDED_ENV = ("PYTHONPATH", "HF_HOME", "HF_TOKEN", "WANDB_API_KEY", "AGENTRL_DATA_DIR", "AGENTRL_SANDBOX_API_KEY",
                 SERVER_KEY_ENV)
"""Variables of ``agentrl train``'s environment the actors' processes get too (when set)."""


class ActorServer(ManagedServer):
    """A ManagedServer inside a Ray actor: its GPU is the one Ray gave the actor."""

    def gpu_env(self) -> dict[str, str] | None:
        return None  # Ray has set CUDA_VISIBLE_DEVICES to this actor's GPU


class ServerHost:
    """Ray actor: one inference server (``ManagedServer``) on this actor's node."""

    def __init__(self, index: int, cfg: Any, log_dir: str, cwd: str, env: dict[str, str]) -> None:
        import ray

        os.chdir(cwd)
        os.environ.update(env)
        self.server = ActorServer(index, cfg, Path(log_dir), host=ray.util.get_node_ip_address())

    def start(self) -> str:
        self.server.start()
        return self.server.url

    def poll(self) -> int | None:
        return self.server.poll()

    def tail(self) -> str:
        return self.server.tail()

    def stop(self) -> None:
        self.server.stop()


class HostedServer:
    """The driver's handle on a ServerHost actor, with ManagedServer's face (for ``watch_servers``)."""

    def __init__(self, index: int, actor: Any, ray: Any) -> None:
        self.index, self.actor, self.ray = index, actor, ray
        self.url, self.restarts = "", 0

    def start(self) -> None:
        self.url = self.ray.get(self.actor.start.remote())

    def poll(self) -> int | None:
        return self.ray.get(self.actor.poll.remote())

    def tail(self) -> str:
        return self.ray.get(self.actor.tail.remote())


class TrainerRank:
    """Ray actor: one trainer rank (``python -m agentrl.run.loop RUN_DIR``) in a bundle of the group."""

    def __init__(self, rank: int, cwd: str, env: dict[str, str]) -> None:
        os.chdir(cwd)
        self.rank, self.env = rank, env
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []
        self.read = 0

    def address(self) -> tuple[str, int, str, bool]:
        """(node IP, a free port there, node id, has a GPU) — rank 0's become MASTER_ADDR/PORT."""
        import ray

        from agentrl.process.services import free_port

        ip = ray.util.get_node_ip_address()
        return ip, free_port(ip), ray.get_runtime_context().get_node_id(), bool(ray.get_gpu_ids())

    def start(self, run_dir: str, env: dict[str, str], log_path: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "agentrl.run.loop", run_dir], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env={**os.environ, **self.env, **env})
        pump_output(self.proc, log_path, self.lines.append, f"rank-{self.rank}-output")

    def poll(self) -> tuple[int | None, list[str]]:
        """(exit code or None, the lines printed since the last poll)."""
        code = None if self.proc is None else self.proc.poll()
        if code is not None:
            time.sleep(0.2)  # let the reader take the last lines
        new, self.read = self.lines[self.read:], len(self.lines)
        return code, new

    def tail(self, n: int = 30) -> str:
        return "".join(self.lines[-n:])

    def stop(self) -> None:
        stop_process(self.proc, grace_s=30)  # as torchrun's SIGTERM: the loop stops its executor


def connect(cfg: Any) -> Any:
    """``ray.init`` on the configured cluster, or a ConfigError saying how to start one."""
    from agentrl.plugins import import_optional

    ray = import_optional("ray", extra="ray", purpose="launcher: ray")
    address = cfg.ray.address  # "auto": RAY_ADDRESS, else the cluster `ray start --head` started here
    try:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ConfigError(f"config key 'ray.address': no Ray cluster at {address!r} ({e}); start one with "
                          "`ray start --head` (and `ray start --address=HEAD:PORT` on the other nodes), or set "
                          "RAY_ADDRESS") from e
    return ray


class RayRun:
    """The actors of one run and their watch; see the module docstring."""

    def __init__(self, cfg: Any, run_dir: Path, echo: Callable[[str], None]) -> None:
        self.cfg, self.run_dir, self.echo = cfg, run_dir.resolve(), echo
        self.log_dir = self.run_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.cwd = os.getcwd()
        self.env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
        self.servers: list[HostedServer] = []
        self.ranks: list[Any] = []
        self.group: Any = None
        self.router: Any = None
        self.events: list[str] = []

    def say(self, message: str) -> None:
        self.events.append(message)
        self.echo(f"agentrl train: {message}\n")

    def start_servers(self, ray: Any) -> list[str]:
        inf = self.cfg.inference
        if inf.servers:
            return list(inf.servers)
        gpus = 1 if inf.engine == "sglang" or self.cfg.device == "cuda" else 0
        actor = ray.remote(ServerHost).options(num_cpus=inf.threads, num_gpus=gpus, max_concurrency=4)
        self.servers = [HostedServer(i, actor.remote(i, self.cfg, str(self.log_dir), self.cwd, self.env), ray)
                        for i in range(inf.num_servers)]
        urls = ray.get([s.actor.start.remote() for s in self.servers])
        for server, url in zip(self.servers, urls, strict=True):
            server.url = url
            self.say(f"inference server {server.index} ready at {url} ({inf.engine}, a Ray actor)")
        return urls

    def start_router(self, urls: list[str], ray: Any) -> str | None:
        if self.cfg.inference.router != "sglang":
            return None
        from agentrl.run.router import SGLangRouter

        self.router = SGLangRouter(urls, self.cfg.inference, self.log_dir / "router.log",
                                   host=ray.util.get_node_ip_address())
        self.router.start()
        self.say(f"SGLang router ready at {self.router.url} in front of {len(urls)} server(s)")
        return self.router.url

    def start_trainer(self, ray: Any) -> None:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        cfg = self.cfg
        gpu = 1 if cfg.device == "cuda" else 0
        bundle = {"CPU": cfg.threads, **({"GPU": gpu} if gpu else {})}
        self.group = placement_group([dict(bundle) for _ in range(cfg.world_size)], strategy=cfg.ray.placement_strategy)
        if not self.group.wait(timeout_seconds=cfg.inference.startup_timeout_s):
            raise ServerUnavailable(f"the Ray cluster could not place {cfg.world_size} trainer rank(s) of {bundle} "
                                    f"({cfg.ray.placement_strategy}) within {cfg.inference.startup_timeout_s:.0f} s; "
                                    f"it has {ray.available_resources()}")
        env = {**self.env, "OMP_NUM_THREADS": str(cfg.threads), "TOKENIZERS_PARALLELISM": "false",
               "PYTHONUNBUFFERED": "1"}
        self.ranks = [ray.remote(TrainerRank).options(
            num_cpus=cfg.threads, num_gpus=gpu, max_concurrency=4,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=r),
        ).remote(r, self.cwd, env) for r in range(cfg.world_size)]
        places = ray.get([r.address.remote() for r in self.ranks])
        master_addr, master_port = places[0][0], places[0][1]
        nodes = [p[2] for p in places]
        for r, actor in enumerate(self.ranks):
            local = 0 if places[r][3] else nodes[:r].count(nodes[r])  # a GPU rank sees only its own GPU
            ray.get(actor.start.remote(str(self.run_dir), {
                "RANK": str(r), "WORLD_SIZE": str(cfg.world_size), "LOCAL_RANK": str(local),
                "LOCAL_WORLD_SIZE": str(1 if places[r][3] else nodes.count(nodes[r])),
                "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
            }, str(self.log_dir / f"trainer-rank-{r}.log")))
        self.say(f"{cfg.world_size} trainer rank(s) started as Ray actors on {len(set(nodes))} node(s); "
                 f"rank 0 at {master_addr}:{master_port}")

    def watch(self, ray: Any, poll_s: float = 1.0) -> None:
        """Until every rank has ended: echo rank 0, restart dead servers, fail on a failed rank."""
        done: dict[int, int] = {}
        while len(done) < len(self.ranks):
            for r, actor in enumerate(self.ranks):
                if r in done:
                    continue
                code, lines = ray.get(actor.poll.remote())
                if r == 0:
                    for line in lines:
                        if not line.startswith("agentrl train: summary "):
                            self.echo(line)
                if code is not None:
                    done[r] = code
                    if code != 0:
                        raise TrainerError(f"trainer rank {r} failed (exit code {code}); the last of "
                                           f"{self.log_dir / f'trainer-rank-{r}.log'}:\n"
                                           f"{ray.get(actor.tail.remote())}")
            watch_servers(self.servers, self.router, self.cfg.inference.restart_failed, self.say)
            time.sleep(poll_s)

    def stop(self, ray: Any) -> None:
        for actor in [*self.ranks, *(s.actor for s in self.servers)]:
            try:
                ray.get(actor.stop.remote(), timeout=60)
            except Exception:  # noqa: BLE001 (a dead actor has nothing left to stop)
                pass
            ray.kill(actor)
        if self.router is not None:
            self.router.stop()
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.group)


def launch(cfg: Any, run_dir: Path, *, echo: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the training job described by ``cfg`` on a Ray cluster (config already saved in ``run_dir``)."""
    import json

    ray = connect(cfg)
    ensure_server_key()  # forwarded to the server and rank actors (FORWARDED_ENV)
    run = RayRun(cfg, run_dir, echo or (lambda line: print(line, end="", flush=True)))
    try:
        run.say(f"on the Ray cluster at {ray.get_runtime_context().gcs_address} "
                f"({ray.cluster_resources().get('CPU', 0):.0f} CPUs, {ray.cluster_resources().get('GPU', 0):.0f} GPUs)")
        urls = run.start_servers(ray)
        if cfg.deterministic:
            check_batch_invariant(urls)
        write_servers(run.run_dir, urls, run.start_router(urls, ray))
        run.start_trainer(ray)
        run.watch(ray)
    finally:
        run.stop(ray)
        ray.shutdown()
    summary_path = run.run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    summary["events"] = run.events
    summary["server_restarts"] = sum(s.restarts for s in run.servers)
    return summary
