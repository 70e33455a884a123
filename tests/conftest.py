"""Shared fixtures. Component fixtures live in the conftest.py of each test folder."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def untrained_model_dir(tmp_path_factory):
    """An untrained tiny model + tokenizer on disk (fast to make; weights are random)."""
    from agentrl.tinymodel import init_tiny_model

    out = tmp_path_factory.mktemp("untrained-model")
    init_tiny_model(out, seed=0)
    return out
