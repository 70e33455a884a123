"""Fixtures of the trainer tests: a real ``agentrl serve`` to publish weights to; this process as a
1-rank gloo group and a small model for the actor's in-process checks."""

from __future__ import annotations

import pytest
import torch

from agentrl.process.services import ServerProcess
from agentrl.run.local_launcher import one_rank_group


@pytest.fixture(scope="module")
def group():
    """This process as rank 0 of a 1-rank gloo group (the actor's ``init_distributed``), torn down after the module."""
    torch.set_num_threads(2)
    with one_rank_group():
        yield


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
