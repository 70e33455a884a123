"""Fixtures of the trainer tests: a real ``agentrl serve`` to publish weights to."""

from __future__ import annotations

import pytest

from agentrl.process.services import ServerProcess


@pytest.fixture
def serve(untrained_model_dir):
    """``agentrl serve`` on the untrained model at weight version 0; yields its base URL."""
    with ServerProcess(untrained_model_dir, "--context-length", "256", "--weight-version", "0") as proc:
        yield proc.url
