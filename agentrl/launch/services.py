"""Starting local ``agentrl serve`` processes: the embedded inference servers of a run.

What it is: ``ServerProcess(model_dir, ...)``, one ``agentrl serve`` subprocess on a free
port, ready (its ``url`` known) when the constructor returns, stopped by ``stop()`` or at
the end of a ``with`` block. Used by the demo, the benchmarks and the tests; a training run
that has no external servers starts its own with it. What it is not: a launcher for SGLang
(``python -m sglang.launch_server`` on GPU machines; pass their URLs to ``RemoteEngine``).

The server prints ``agentrl serve: ready on http://HOST:PORT`` once its model is loaded;
everything it prints is kept in ``lines`` for error messages.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from agentrl.errors import ServerUnavailable

READY = "agentrl serve: ready on "


class ServerProcess:
    """One ``agentrl serve`` subprocess on a free port of 127.0.0.1."""

    def __init__(self, model_dir: str | Path, *args: str, threads: int = 1, startup_timeout: float = 180.0,
                 extra_env: dict[str, str] | None = None) -> None:
        cmd: Sequence[str] = [str(Path(sys.executable).parent / "agentrl"), "serve", "--model", str(model_dir),
                              "--port", "0", "--threads", str(threads), *args]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false",
               **(extra_env or {})}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        self.url = ""
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line)
                if line.startswith(READY) and not self.url:
                    self.url = line[len(READY):].strip()
                    ready.set()
            ready.set()  # the process ended: wake the constructor either way

        threading.Thread(target=read, name="agentrl-serve-output", daemon=True).start()
        if not ready.wait(startup_timeout) or not self.url:
            self.stop()
            tail = "".join(self.lines[-40:]) or "(no output)"
            raise ServerUnavailable(
                f"agentrl serve --model {model_dir} did not become ready within {startup_timeout:.0f} s; "
                f"its last output:\n{tail}"
            )

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill(self) -> None:
        """SIGKILL: the server dies without answering anything (for failure tests)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
