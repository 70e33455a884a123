"""The local launcher of ``agentrl train``: start what the config asks for, watch it, stop it all.

What it is: ``launch(cfg, run_dir)`` — in order: the inference servers (``agentrl serve``
processes on ports chosen up front, ``python -m sglang.launch_server`` when
``inference.engine: sglang``, vLLM's OpenAI server (``vllm_command``) when ``vllm``; none when
``inference.servers`` lists running ones), then the
trainer ranks under ``torchrun`` (``python -m agentrl.run.loop RUN_DIR``; rank 0 runs the rollout
executor). While the run goes on it watches every child: a started server that dies is
restarted on the same port when ``inference.restart_failed`` (the client takes it out
meanwhile and re-syncs its weights when it is back), and said so; a trainer that fails stops
the run. On exit, Ctrl-C or any failure every child is stopped and the error names the part
that failed with the end of its output; a SIGKILL of the launcher itself, which runs no
``finally``, reaches every child as SIGTERM through Linux's parent-death signal
(``die_with_parent``; torchrun passes it on to its ranks). Logs: ``RUN_DIR/logs/server-N.log`` and
``RUN_DIR/logs/trainer.log``; the trainer's output is also echoed to the terminal.

Several nodes (``nnodes > 1``): ``agentrl train`` runs once per node with its ``node_rank``;
node 0 starts the servers (and the router) and writes ``servers.json``, every node starts its
share of the ranks under ``torchrun --nnodes N --node-rank R --master-addr A --master-port P``
(``torchrun_command``), and ``run_dir`` must be on a filesystem every node sees (weights and
checkpoints go there too). With ``inference.router: sglang`` SGLang's router is started in
front of the servers (``agentrl.run.router``).

``one_rank_group()``: this process as the only rank, without torchrun (in-process ``agentrl
sft``, tests, benchmarks).

Every server the run starts takes a key (``ensure_server_key``): ``$AGENTRL_SERVE_API_KEY`` when
set, else one generated for the run and put in the environment its children inherit (never on
a command line): ``agentrl serve`` and SGLang require it on every route but the probes, a
vLLM server on every route but ``/health`` (its dev-mode routes included:
``agentrl_vllm_auth``), and the run's clients send it (``RemoteEngine``, ``http_edge.server_auth``).

What it is not: a cluster scheduler. ``agentrl.run.ray_launcher`` starts the same
``agentrl.run.loop`` ranks and servers as Ray actors and writes the same ``servers.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agentrl.client import vllm_backend
from agentrl.errors import AgentRLError, ConfigError, ServerUnavailable, TrainerError
from agentrl.http_edge import SERVER_KEY_ENV, server_auth, server_key
from agentrl.process.services import (
    ServerProcess,
    ServiceProcess,
    die_with_parent,
    free_port,
    keyed_module,
    pump_output,
    stop_process,
)


class ManagedServer:
    """One inference server the run started, restartable on its port."""

    def __init__(self, index: int, cfg: Any, log_dir: Path, host: str = "127.0.0.1") -> None:
        self.index, self.cfg, self.log_dir, self.host = index, cfg, log_dir, host
        self.port = free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.process: ServiceProcess | subprocess.Popen | None = None
        self.restarts = 0

    def start(self) -> None:
        inf = self.cfg.inference
        log_path = self.log_dir / f"server-{self.index}.log"
        if inf.engine == "auto":  # check_run_config decides it before anything starts
            raise ConfigError("config key 'inference.engine': auto was not decided; call "
                              "agentrl.run.run_config.check_run_config(cfg) before launching")
        if inf.engine == "agentrl":
            # a GPU of its own after the trainer ranks' when there is one; else it shares the first
            own = self.cfg.device == "cuda" and server_has_own_gpu(self.cfg, self.index, cuda_device_count())
            self.process = ServerProcess(
                self.cfg.model, "--host", self.host, "--port", str(self.port), "--weight-version", "0",
                "--max-running-requests", str(inf.max_running_requests), "--device", self.cfg.device,
                "--seed", str(self.cfg.seed + self.index), *inf.extra_args,
                threads=inf.threads, startup_timeout=inf.startup_timeout_s, log_path=log_path,
                extra_env={"CUDA_VISIBLE_DEVICES": str(server_gpu(self.cfg, self.index))} if own else None)
        elif inf.engine == "vllm":
            cmd, env = vllm_command(self.cfg, self.host, self.port, self.index, ensure_server_key())
            with open(log_path, "a") as log:
                self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                preexec_fn=die_with_parent())
            wait_healthy(self.url, self.process, inf.startup_timeout_s, log_path, route="/health")
            import httpx  # what it samples first is version 0, as agentrl serve's --weight-version 0

            httpx.post(self.url + "/update_weight_version", json={"new_version": "0"}, headers=server_auth(),
                       timeout=30.0).raise_for_status()
        else:
            ensure_server_key()
            cmd = [sys.executable, "-c", SGLANG_WITH_KEY, "--model-path", self.cfg.model, "--host", self.host,
                   "--port", str(self.port), "--weight-version", "0", "--random-seed", str(self.cfg.seed + self.index),
                   *sglang_lora_args(self.cfg), *(["--enable-memory-saver"] if inf.release_memory else []),
                   *inf.extra_args]
            env = self.gpu_env()
            with open(log_path, "a") as log:  # the child has its own copy of the descriptor
                self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                preexec_fn=die_with_parent())
            wait_healthy(self.url, self.process, inf.startup_timeout_s, log_path)

    def gpu_env(self) -> dict[str, str] | None:
        """The environment of an SGLang server: the GPU after the trainer ranks' (None: inherited)."""
        return self.gpu_env_of(self.cfg, self.index)

    @staticmethod
    def gpu_env_of(cfg: Any, index: int) -> dict[str, str] | None:
        if cfg.device != "cuda":
            return None
        return {**os.environ, "CUDA_VISIBLE_DEVICES": str(server_gpu(cfg, index))}

    def poll(self) -> int | None:
        proc = self.process.proc if isinstance(self.process, ServiceProcess) else self.process
        return None if proc is None else proc.poll()

    def stop(self) -> None:
        if isinstance(self.process, ServiceProcess):
            self.process.stop()
        else:
            stop_process(self.process)

    def tail(self) -> str:
        path = self.log_dir / f"server-{self.index}.log"
        return "".join(path.read_text(errors="replace").splitlines(True)[-20:]) if path.exists() else ""


def ensure_server_key() -> str:
    """The key of the servers this run starts: ``$AGENTRL_SERVE_API_KEY``, else a fresh random
    one put there (this process's children — servers, trainer ranks — inherit it)."""
    key = server_key()
    if key is None:
        key = os.environ[SERVER_KEY_ENV] = secrets.token_urlsafe(32)
    return key


SGLANG_WITH_KEY = keyed_module("sglang.launch_server", SERVER_KEY_ENV)


def server_gpu(cfg: Any, index: int) -> int:
    """The GPU of inference server ``index`` started on this node: the ones after the trainer
    ranks' (``world_size / nnodes``)."""
    return cfg.world_size // cfg.nnodes + index


def server_has_own_gpu(cfg: Any, index: int, gpus: int) -> bool:
    """Whether that GPU exists on a machine of ``gpus`` (else the server shares the trainer's)."""
    return cfg.device == "cuda" and server_gpu(cfg, index) < gpus


def cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count()


def vllm_python(cfg: Any) -> str | None:
    """The Python with vLLM a run starts: ``inference.vllm_python``, else ``.venv-vllm`` of the
    current directory or of this checkout (``make vllm``), else this Python if it has vLLM."""
    import importlib.util

    if cfg.inference.vllm_python:
        return cfg.inference.vllm_python
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (root / ".venv-vllm" / "bin" / "python").is_file():
            return str(root / ".venv-vllm" / "bin" / "python")
    return sys.executable if importlib.util.find_spec("vllm") is not None else None


def sglang_lora_args(cfg: Any) -> list[str]:
    """SGLang's flags for a LoRA run (adapters loaded at run time, ``trainer.weight_sync.adapters``):
    the rank and target modules of ``trainer.lora``, and room for two adapters in a batch (the
    newest, and the one before it that requests sent just before a pause may still name) beside
    base-only requests, which SGLang's ``--max-loras-per-batch`` counts as one more (vLLM's
    ``--max-loras 2`` in ``vllm_command`` does not)."""
    lora = cfg.trainer.lora
    if not lora.enabled:
        return []
    return ["--enable-lora", "--max-lora-rank", str(lora.rank), "--lora-target-modules", *lora.target_modules,
            "--max-loras-per-batch", "3"]


def vllm_command(cfg: Any, host: str, port: int, index: int, api_key: str) -> tuple[list[str], dict[str, str]]:
    """vLLM's OpenAI server with its token-in/token-out and RL routes, sampled logprobs of the
    distribution it samples from (as agentrl serve's), on the run's model, threads and seed;
    every route but ``/health`` needs ``api_key`` (``agentrl_vllm_auth``; the key travels in
    the environment, not on the command line)."""
    if not api_key:
        raise ConfigError("a vLLM server agentrl starts needs a key (its dev-mode routes change the weights)")
    inf = cfg.inference
    cmd = [vllm_python(cfg) or sys.executable, "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(Path(cfg.model).resolve()), "--host", host, "--port", str(port),
           "--enable-scale-out", "--logprobs-mode", "processed_logprobs", "--seed", str(cfg.seed + index),
           "--max-num-seqs", str(inf.max_running_requests), "--disable-uvicorn-access-log",
           "--worker-extension-cls", vllm_backend.WORKER_EXTENSION, "--middleware", vllm_backend.KEY_MIDDLEWARE]
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_API_KEY": api_key,
           "PYTHONPATH": os.pathsep.join(p for p in (str(vllm_backend.WORKER_DIR), os.environ.get("PYTHONPATH")) if p)}
    lora = cfg.trainer.lora
    if lora.enabled:  # adapters loaded at run time, by name (trainer.weight_sync.adapters: load)
        cmd += ["--enable-lora", "--max-lora-rank", str(lora.rank), "--max-loras", "2"]
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if cfg.device == "cpu":
        cmd += ["--dtype", "float32", "--enforce-eager"]
        env.update(VLLM_CPU_KVCACHE_SPACE=f"{inf.vllm_kv_cache_gib:g}", VLLM_CPU_OMP_THREADS_BIND="nobind",
                   OMP_NUM_THREADS=str(inf.threads))
    else:
        env = {**env, **(ManagedServer.gpu_env_of(cfg, index) or {})}
        if inf.release_memory:  # /sleep frees memory only with it (on a CPU it frees none, and is refused)
            cmd.append("--enable-sleep-mode")
    return [*cmd, *inf.extra_args], env


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float, log_path: Path,
                 route: str = "/health_generate") -> None:
    """Poll ``GET route`` until it answers 200 (SGLang and vLLM print no ready line of ours)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerUnavailable(f"the inference server at {url} exited with code {proc.returncode}; "
                                    f"see {log_path}")
        try:
            if httpx.get(url + route, timeout=5.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise ServerUnavailable(f"the inference server at {url} was not healthy within {timeout_s:.0f} s; see {log_path}")


class Run:
    """The children of one ``agentrl train`` and their watch; see the module docstring."""

    def __init__(self, cfg: Any, run_dir: Path, *, echo: Callable[[str], None] | None = None,
                 name: str = "agentrl train") -> None:
        self.cfg, self.run_dir, self.name = cfg, run_dir, name
        self.echo = echo or (lambda line: print(line, end="", flush=True))
        self.log_dir = run_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.servers: list[ManagedServer] = []
        self.router: Any = None
        ensure_server_key()  # before any child starts: each inherits it
        self.trainer: subprocess.Popen | None = None
        self.trainer_lines: list[str] = []
        self.stopping = False
        self.events: list[str] = []

    def say(self, message: str) -> None:
        self.events.append(message)
        self.echo(f"{self.name}: {message}\n")

    def start_servers(self) -> list[str]:
        inf = self.cfg.inference
        if self.cfg.node_rank > 0:
            return []  # node 0 starts them and writes servers.json
        if inf.servers:
            return list(inf.servers)
        for i in range(inf.num_servers):
            server = ManagedServer(i, self.cfg, self.log_dir)
            self.servers.append(server)
            server.start()
            self.say(f"inference server {i} ready at {server.url} ({inf.engine})")
        return [s.url for s in self.servers]

    def start_router(self, urls: list[str]) -> str | None:
        if self.cfg.inference.router != "sglang" or self.cfg.node_rank > 0:
            return None
        from agentrl.run.router import SGLangRouter

        self.router = SGLangRouter(urls, self.cfg.inference, self.log_dir / "router.log")
        self.router.start()
        self.say(f"SGLang router ready at {self.router.url} in front of {len(urls)} server(s)")
        return self.router.url

    def start_trainer(self) -> None:
        cfg = self.cfg
        cmd = torchrun_command(cfg, self.run_dir)
        if cfg.nnodes > 1:
            self.say(f"node {cfg.node_rank} of {cfg.nnodes}: {cfg.world_size // cfg.nnodes} rank(s), rendezvous at "
                     f"{cfg.master_addr}:{cfg.master_port}")
        env = {**os.environ, "OMP_NUM_THREADS": str(cfg.threads), "TOKENIZERS_PARALLELISM": "false",
               "PYTHONUNBUFFERED": "1"}
        self.trainer = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                        start_new_session=True, preexec_fn=die_with_parent())

        def take(line: str) -> None:
            self.trainer_lines.append(line)
            del self.trainer_lines[:-200]
            if not line.startswith("agentrl train: summary ") and not self.stopping:
                self.echo(line)  # once stopping, the ranks' last words (torchrun's traceback) go to the log only

        self._pump = pump_output(self.trainer, self.log_dir / "trainer.log", take, "trainer-output")

    def watch(self, poll_s: float = 1.0) -> int:
        """Until the trainer ends: restart dead servers (or fail); returns the trainer's exit code."""
        assert self.trainer is not None
        while self.trainer.poll() is None:
            watch_servers(self.servers, self.router, self.cfg.inference.restart_failed, self.say)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.trainer.wait(poll_s)  # wakes as soon as the trainer ends
        self._pump.join(timeout=10)
        return self.trainer.returncode

    def stop(self) -> None:
        self.stopping = True
        if self.trainer is not None and self.trainer.poll() is None:
            os.killpg(self.trainer.pid, signal.SIGTERM)  # torchrun forwards it to the ranks
            try:
                self.trainer.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.trainer.pid, signal.SIGKILL)
                self.trainer.wait(10)
        if self.router is not None:
            self.router.stop()
        for server in self.servers:
            server.stop()


def watch_servers(servers: list[Any], router: Any, restart_failed: bool, say: Callable[[str], None]) -> None:
    """One look at a run's servers: a dead router stops the run; a dead server is restarted on its
    port when ``restart_failed`` (else it stops the run). A server has ``index``, ``url``,
    ``restarts``, ``poll()``, ``start()`` and ``tail()`` (``ManagedServer``, or the Ray launcher's
    handle on one)."""
    if router is not None and router.poll() is not None:
        raise ServerUnavailable(f"the SGLang router ({router.url}) died; its last output:\n{router.tail()}")
    for server in servers:
        code = server.poll()
        if code is None:
            continue
        if not restart_failed:
            raise ServerUnavailable(f"inference server {server.index} ({server.url}) died with exit code "
                                    f"{code}; its last output:\n{server.tail()}")
        say(f"inference server {server.index} ({server.url}) died with exit code {code}; restarting it")
        server.restarts += 1
        try:
            server.start()
        except AgentRLError as e:
            raise ServerUnavailable(f"inference server {server.index} could not be restarted: {e}") from e
        say(f"inference server {server.index} is back at {server.url}")


def torchrun_command(cfg: Any, run_dir: Path) -> list[str]:
    """``torchrun`` for this node's share of the trainer ranks (``agentrl.run.loop RUN_DIR`` each)."""
    port = cfg.master_port if cfg.master_port is not None else free_port()
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(cfg.nnodes),
            "--node-rank", str(cfg.node_rank), "--nproc-per-node", str(cfg.world_size // cfg.nnodes),
            "--master-addr", cfg.master_addr, "--master-port", str(port),
            "-m", "agentrl.run.loop", str(run_dir)]


SERVERS_FILE = "servers.json"


def check_batch_invariant(urls: list[str]) -> None:
    """Deterministic mode needs batch-invariant servers (``agentrl serve --enable-deterministic-inference``,
    as the launchers start them; a listed server must say so in ``/server_info``)."""
    import httpx

    from agentrl.client.remote_engine import base_url

    for url in urls:
        try:
            info = httpx.get(base_url(url) + "/server_info", headers=server_auth(), timeout=30).json()
        except (httpx.HTTPError, ValueError) as e:
            raise ConfigError(f"config key 'deterministic': cannot ask the server {url} whether it is "
                              f"batch-invariant ({e!r})") from None
        if not isinstance(info, dict) or info.get("enable_deterministic_inference") is not True:
            raise ConfigError(f"config key 'deterministic': the server {url} is not batch-invariant; start agentrl "
                              "serve with --enable-deterministic-inference (as agentrl train does for the servers it "
                              "starts)")


def write_servers(run_dir: Path, urls: list[str], router: str | None) -> None:
    """``servers.json``: where rank 0 generates (the router, if any) and whom it updates (the servers)."""
    path = run_dir / SERVERS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"servers": urls, "router": router}))
    os.replace(tmp, path)  # whole: the trainer's rank 0 may be waiting for it


def launch(cfg: Any, run_dir: Path, *, echo: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the training job described by ``cfg`` in ``run_dir`` (config already saved there)."""
    run = Run(cfg, run_dir, echo=echo)
    try:
        # The ranks start while the servers load (their imports and model set-up take seconds
        # too); rank 0 waits for servers.json, written once every server is ready.
        if cfg.node_rank == 0:
            (run_dir / SERVERS_FILE).unlink(missing_ok=True)  # a resumed run's is stale
        run.start_trainer()
        urls = run.start_servers()
        if cfg.node_rank == 0:
            if cfg.deterministic:
                check_batch_invariant(urls)
            write_servers(run_dir, urls, run.start_router(urls))
        code = run.watch()
        if code != 0:
            tail = "".join(run.trainer_lines[-30:])
            raise TrainerError(f"the trainer ranks failed (torchrun exit code {code}); the last of "
                               f"{run.log_dir / 'trainer.log'}:\n{tail}")
    finally:
        run.stop()
    if cfg.node_rank > 0:  # rank 0 (node 0) writes the run's summary
        return {"node_rank": cfg.node_rank, "run_dir": str(run_dir), "events": run.events}
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    summary["events"] = run.events
    summary["server_restarts"] = sum(s.restarts for s in run.servers)
    return summary


TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@contextlib.contextmanager
def one_rank_group() -> Iterator[None]:
    """This process as the only rank of a group, without torchrun: torchrun's variables set for
    ``init_distributed`` (a free port on 127.0.0.1) and, on exit, the default group destroyed and
    the variables as they were (in-process ``agentrl sft``, tests, benchmarks)."""
    import torch.distributed as dist

    saved = {k: os.environ.get(k) for k in TORCHRUN_ENV}
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
