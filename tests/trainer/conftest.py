"""Fixtures of the trainer tests: a real ``agentrl serve`` to publish weights to; this process as a
1-rank gloo group and a small model for the actor's in-process checks."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from agentrl.process.services import ServerProcess, free_port

ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="module")
def group():
    """This process as rank 0 of a 1-rank gloo group (the actor's ``init_distributed``), torn down after the module."""
    saved = {k: os.environ.get(k) for k in ENV}
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    torch.set_num_threads(2)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    """A 2-layer, 32-wide model of the tiny demo architecture (random weights)."""
    from agentrl.model.tinymodel import init_tiny_model

    out = tmp_path_factory.mktemp("small-model")
    init_tiny_model(out, seed=0, hidden_size=32, num_layers=2)
    return out


@pytest.fixture
def serve(untrained_model_dir):
    """``agentrl serve`` on the untrained model at weight version 0; yields its base URL."""
    with ServerProcess(untrained_model_dir, "--context-length", "256", "--weight-version", "0") as proc:
        yield proc.url
