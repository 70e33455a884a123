"""SGLangRouter: SGLang's own router (``pip install sglang-router``) in front of the run's servers.

What it is: ``inference.router: sglang`` — ``agentrl train`` starts ``python -m
sglang_router.launch_router --worker-urls URL...`` on a free port of node 0, waits until the
router lists every server as a healthy worker (``GET /workers``), and rank 0 then sends its
generation calls to the router, which picks a worker by its policy (``cache_aware`` by
default: a prefix tree of the requests it routed, ``input_ids`` included). The router's
process is watched like the servers'; its log is ``RUN_DIR/logs/router.log``.

What the router does not do, and so what stays with ``RemoteEngine``: it forwards neither
``/pause_generation``, ``/continue_generation``, ``/update_weights_from_disk`` nor
``/update_weight_version`` (sglang-router 0.3: 404), so the weight-update protocol still
goes to every server directly. See docs/scaling.md for what works against ``agentrl serve``.

What it is not: a router of ours, nor a launcher of workers (the servers are started by the
launcher, or given as ``inference.servers``). Main hook: ``SGLangRouter(urls, cfg.inference,
log_path).start()``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agentrl.errors import ServerUnavailable
from agentrl.process.services import die_with_parent, free_port, stop_process


class SGLangRouter:
    """One ``sglang_router.launch_router`` process over ``worker_urls``; see the module docstring."""

    def __init__(self, worker_urls: list[str], inference: Any, log_path: Path, host: str = "127.0.0.1") -> None:
        if not worker_urls:
            raise ServerUnavailable("the SGLang router needs at least one inference server to route to")
        self.workers = [u.rstrip("/") for u in worker_urls]
        self.inference, self.log_path, self.host = inference, log_path, host
        self.port = free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        # a second free port for its Prometheus exporter (its default, 29000, is one per machine)
        from agentrl.http_edge import SERVER_KEY_ENV, server_key
        from agentrl.process.services import keyed_module

        # the servers' key (a run's), for the router's calls to them: added inside its process, not in argv
        launch = ["-c", keyed_module("sglang_router.launch_router", SERVER_KEY_ENV)] if server_key() else [
            "-m", "sglang_router.launch_router"]
        return [sys.executable, *launch, "--host", self.host, "--port", str(self.port),
                "--worker-urls", *self.workers, "--prometheus-port", str(free_port(self.host)),
                "--request-timeout-secs", str(int(self.inference.client.timeout)), "--log-level", "warn",
                *self.inference.router_args]

    def start(self) -> None:
        with open(self.log_path, "a") as log:  # the child has its own copy of the descriptor
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                            preexec_fn=die_with_parent())
        self.wait_ready(self.inference.startup_timeout_s)

    def wait_ready(self, timeout_s: float) -> None:
        """Until ``GET /workers`` lists every server, healthy."""
        import httpx

        from agentrl.http_edge import server_auth

        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        seen: list[Any] = []
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerUnavailable(f"the SGLang router exited with code {self.process.returncode}; "
                                        f"its last output:\n{self.tail()}")
            try:
                r = httpx.get(self.url + "/workers", headers=server_auth(), timeout=5.0)
                seen = r.json().get("workers", []) if r.status_code == 200 else []
            except (httpx.HTTPError, ValueError):
                seen = []
            healthy = {w.get("url", "").rstrip("/") for w in seen if w.get("is_healthy")}
            if healthy >= set(self.workers):
                return
            time.sleep(0.5)
        self.stop()
        raise ServerUnavailable(f"the SGLang router at {self.url} did not list {self.workers} as healthy workers "
                                f"within {timeout_s:.0f} s (it listed {seen}); see {self.log_path}")

    def poll(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def stop(self) -> None:
        stop_process(self.process)

    def tail(self) -> str:
        if not self.log_path.exists():
            return "(no output)"
        return "".join(self.log_path.read_text(errors="replace").splitlines(True)[-20:])
