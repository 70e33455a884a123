"""Fixtures of the trainer tests: a real ``agentrl serve`` to publish weights to."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

READY = "agentrl serve: ready on "


@pytest.fixture
def serve(untrained_model_dir):
    """``agentrl serve`` on the untrained model at weight version 0; yields its base URL."""
    cmd = [str(Path(sys.executable).parent / "agentrl"), "serve", "--model", str(untrained_model_dir),
           "--port", "0", "--threads", "1", "--context-length", "256", "--weight-version", "0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    url: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(READY):
                url.append(line[len(READY):].strip())
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        if not ready.wait(180) or not url:
            raise RuntimeError("agentrl serve did not start:\n" + "".join(lines[-40:]))
        yield url[0]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
