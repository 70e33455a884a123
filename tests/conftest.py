"""Shared fixtures. Component fixtures live in the conftest.py of each test folder."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def untrained_model_dir(tmp_path_factory):
    """An untrained tiny model + tokenizer on disk (fast to make; weights are random)."""
    from agentrl.model.tinymodel import init_tiny_model

    out = tmp_path_factory.mktemp("untrained-model")
    init_tiny_model(out, seed=0)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir():
    """The committed, trained demo model (`examples/tiny-model`, built by `agentrl model tiny`)."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "tiny-model"
    if not (path / "config.json").is_file():
        pytest.fail(f"{path} is missing; rebuild it with `agentrl model tiny --out {path}`")
    return path


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir):
    """One ``agentrl serve`` on the trained tiny model (weight version 0), shared by the rollout
    and workflow tests. Tests must leave it unpaused, at its version."""
    from agentrl.launch.services import ServerProcess

    with ServerProcess(tiny_model_dir, "--weight-version", "0", "--max-running-requests", "64") as proc:
        yield proc
