"""Fixtures for the inference tests: real ``agentrl serve`` processes on free ports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

AGENTRL = str(Path(sys.executable).parent / "agentrl")
READY = "agentrl serve: ready on "


class ServeProcess:
    """One ``agentrl serve`` subprocess; ``url`` once it printed its ready line."""

    def __init__(self, model_dir: Path, *args: str, startup_timeout: float = 180.0) -> None:
        cmd = [AGENTRL, "serve", "--model", str(model_dir), "--port", "0", "--threads", "1",
               "--context-length", "512", "--max-running-requests", "16", *args]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        self.url = ""
        ready = threading.Event()

        def read() -> None:
            for line in self.proc.stdout:
                self.lines.append(line)
                if line.startswith(READY):
                    self.url = line[len(READY):].strip()
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(startup_timeout) or not self.url:
            self.stop()
            raise RuntimeError("agentrl serve did not start:\n" + "".join(self.lines[-40:]))

    def kill(self) -> None:
        """SIGKILL: the server dies without answering anything."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)


@pytest.fixture(scope="session")
def second_model_dir(tmp_path_factory):
    """Another untrained tiny model of the same shapes (different seed): 'the new weights'."""
    from agentrl.tinymodel import init_tiny_model

    out = tmp_path_factory.mktemp("untrained-model-2")
    init_tiny_model(out, seed=1)
    return out


@pytest.fixture(scope="session")
def server(untrained_model_dir):
    """A shared server on the untrained model. Tests must leave it unpaused, at its version."""
    proc = ServeProcess(untrained_model_dir)
    yield proc.url
    proc.stop()


@pytest.fixture(scope="session")
def updatable_server(untrained_model_dir):
    """A server for tests that change its weights; each such test resets it first."""
    proc = ServeProcess(untrained_model_dir)
    yield proc
    proc.stop()


@pytest.fixture
def serve_factory():
    """Start extra servers for one test (stopped afterwards): ``serve_factory(model_dir, *args)``."""
    procs: list[ServeProcess] = []

    def start(model_dir, *args: str) -> ServeProcess:
        procs.append(ServeProcess(model_dir, *args))
        return procs[-1]

    yield start
    for p in procs:
        p.stop()


@pytest.fixture(scope="session")
def hf_model(untrained_model_dir):
    """The same checkpoint through transformers, for teacher-forced reference numbers."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(untrained_model_dir).eval()


@pytest.fixture(scope="session")
def tokenizer(untrained_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(untrained_model_dir)

