"""Fixtures for the inference tests: real ``agentrl serve`` processes on free ports."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.process.services import ServerProcess


class ServeProcess(ServerProcess):
    """``agentrl serve`` as the inference tests run it: one thread, a 512-token context, 16 slots."""

    def __init__(self, model_dir: Path, *args: str, startup_timeout: float = 180.0) -> None:
        super().__init__(model_dir, "--context-length", "512", "--max-running-requests", "16", *args,
                         startup_timeout=startup_timeout)


@pytest.fixture(scope="session")
def second_model_dir(tmp_path_factory):
    """Another untrained tiny model of the same shapes (different seed): 'the new weights'."""
    from agentrl.model.tinymodel import init_tiny_model

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

