"""The local launcher of ``agentrl train``: start what the config asks for, watch it, stop it all.

What it is: ``launch(cfg, run_dir)`` — in order: the inference servers (``agentrl serve``
processes on ports chosen up front, or ``python -m sglang.launch_server`` when
``inference.engine: sglang``; none when ``inference.servers`` lists running ones), then the
trainer ranks under ``torchrun`` (``python -m agentrl.run.loop RUN_DIR``; rank 0 runs the rollout
executor). While the run goes on it watches every child: a started server that dies is
restarted on the same port when ``inference.restart_failed`` (the client takes it out
meanwhile and re-syncs its weights when it is back), and said so; a trainer that fails stops
the run. On exit, Ctrl-C or any failure every child is stopped and the error names the part
that failed with the end of its output. Logs: ``RUN_DIR/logs/server-N.log`` and
``RUN_DIR/logs/trainer.log``; the trainer's output is also echoed to the terminal.

What it is not: a cluster scheduler. Other launchers (Ray, Slurm) would start the same
``agentrl.run.loop`` ranks and pass the same ``servers.json``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.errors import AgentRLError, ServerUnavailable, TrainerError
from agentrl.launch.services import ServerProcess, ServiceProcess, free_port


class ManagedServer:
    """One inference server the run started, restartable on its port."""

    def __init__(self, index: int, cfg: Any, log_dir: Path) -> None:
        self.index, self.cfg, self.log_dir = index, cfg, log_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: ServiceProcess | subprocess.Popen | None = None
        self.restarts = 0

    def start(self) -> None:
        inf = self.cfg.inference
        log_path = self.log_dir / f"server-{self.index}.log"
        if inf.engine == "agentrl":
            self.process = ServerProcess(
                self.cfg.model, "--port", str(self.port), "--weight-version", "0",
                "--max-running-requests", str(inf.max_running_requests), "--device", self.cfg.device,
                "--seed", str(self.cfg.seed + self.index), *inf.extra_args,
                threads=inf.threads, startup_timeout=inf.startup_timeout_s, log_path=log_path)
        else:
            cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", self.cfg.model, "--host", "127.0.0.1",
                   "--port", str(self.port), "--weight-version", "0", "--random-seed", str(self.cfg.seed + self.index),
                   *inf.extra_args]
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(self.cfg.world_size + self.index)} \
                if self.cfg.device == "cuda" else None
            log = open(log_path, "a")  # noqa: SIM115 (kept open for the child's lifetime)
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            wait_healthy(self.url, self.process, inf.startup_timeout_s, log_path)

    def poll(self) -> int | None:
        proc = self.process.proc if isinstance(self.process, ServiceProcess) else self.process
        return None if proc is None else proc.poll()

    def stop(self) -> None:
        if isinstance(self.process, ServiceProcess):
            self.process.stop()
        elif self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def tail(self) -> str:
        path = self.log_dir / f"server-{self.index}.log"
        return "".join(path.read_text(errors="replace").splitlines(True)[-20:]) if path.exists() else ""


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float, log_path: Path) -> None:
    """Poll ``GET /health_generate`` until it answers 200 (SGLang prints no ready line of ours)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerUnavailable(f"the inference server at {url} exited with code {proc.returncode}; "
                                    f"see {log_path}")
        try:
            if httpx.get(url + "/health_generate", timeout=5.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2.0)
    raise ServerUnavailable(f"the inference server at {url} was not healthy within {timeout_s:.0f} s; see {log_path}")


class Run:
    """The children of one ``agentrl train`` and their watch; see the module docstring."""

    def __init__(self, cfg: Any, run_dir: Path, *, echo: Callable[[str], None] | None = None) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        self.echo = echo or (lambda line: print(line, end="", flush=True))
        self.log_dir = run_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.servers: list[ManagedServer] = []
        self.trainer: subprocess.Popen | None = None
        self.trainer_lines: list[str] = []
        self.events: list[str] = []

    def say(self, message: str) -> None:
        self.events.append(message)
        self.echo(f"agentrl train: {message}\n")

    def start_servers(self) -> list[str]:
        inf = self.cfg.inference
        if inf.servers:
            return list(inf.servers)
        for i in range(inf.num_servers):
            server = ManagedServer(i, self.cfg, self.log_dir)
            self.servers.append(server)
            server.start()
            self.say(f"inference server {i} ready at {server.url} ({inf.engine})")
        return [s.url for s in self.servers]

    def start_trainer(self) -> None:
        cfg = self.cfg
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(cfg.world_size),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
               "-m", "agentrl.run.loop", str(self.run_dir)]
        env = {**os.environ, "OMP_NUM_THREADS": str(cfg.threads), "TOKENIZERS_PARALLELISM": "false",
               "PYTHONUNBUFFERED": "1"}
        self.trainer = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                        start_new_session=True)
        log = (self.log_dir / "trainer.log").open("a", buffering=1)

        def pump() -> None:
            assert self.trainer is not None and self.trainer.stdout is not None
            for line in self.trainer.stdout:
                log.write(line)
                self.trainer_lines.append(line)
                del self.trainer_lines[:-200]
                if not line.startswith("agentrl train: summary "):
                    self.echo(line)
            log.close()

        self._pump = threading.Thread(target=pump, name="trainer-output", daemon=True)
        self._pump.start()

    def watch(self, poll_s: float = 1.0) -> int:
        """Until the trainer ends: restart dead servers (or fail); returns the trainer's exit code."""
        assert self.trainer is not None
        while self.trainer.poll() is None:
            for server in self.servers:
                code = server.poll()
                if code is None:
                    continue
                if not self.cfg.inference.restart_failed:
                    raise ServerUnavailable(f"inference server {server.index} ({server.url}) died with exit code "
                                            f"{code}; its last output:\n{server.tail()}")
                self.say(f"inference server {server.index} ({server.url}) died with exit code {code}; restarting it")
                server.restarts += 1
                try:
                    server.start()
                except AgentRLError as e:
                    raise ServerUnavailable(f"inference server {server.index} could not be restarted: {e}") from e
                self.say(f"inference server {server.index} is back at {server.url}")
            time.sleep(poll_s)
        self._pump.join(timeout=10)
        return self.trainer.returncode

    def stop(self) -> None:
        if self.trainer is not None and self.trainer.poll() is None:
            os.killpg(self.trainer.pid, signal.SIGTERM)  # torchrun forwards it to the ranks
            try:
                self.trainer.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.trainer.pid, signal.SIGKILL)
                self.trainer.wait(10)
        for server in self.servers:
            server.stop()


def launch(cfg: Any, run_dir: Path, *, echo: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the training job described by ``cfg`` in ``run_dir`` (config already saved there)."""
    run = Run(cfg, run_dir, echo=echo)
    try:
        urls = run.start_servers()
        (run_dir / "servers.json").write_text(json.dumps({"servers": urls}))
        run.start_trainer()
        code = run.watch()
        if code != 0:
            tail = "".join(run.trainer_lines[-30:])
            raise TrainerError(f"the trainer ranks failed (torchrun exit code {code}); the last of "
                               f"{run.log_dir / 'trainer.log'}:\n{tail}")
    finally:
        run.stop()
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    summary["events"] = run.events
    summary["server_restarts"] = sum(s.restarts for s in run.servers)
    return summary
