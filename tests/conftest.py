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


@pytest.fixture(scope="session")
def docker_ready():
    """A Docker engine answers and the sandbox image exists; else skip — or fail under CI,
    where `make test` sets both up."""
    import os

    try:
        import docker

        client = docker.from_env(timeout=10)
        client.ping()
        client.images.get("agentrl-sandbox:latest")
    except Exception as e:
        why = f"{type(e).__name__}: {e}"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but Docker is not usable ({why}); `make sandbox-image` should have set it up")
        pytest.skip(f"no Docker engine or sandbox image ({why}); run `make sandbox-image` as root")


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """A short real ``agentrl train`` run on the demo's config (3 steps, ~1 min): the real launcher,
    an ``agentrl serve``, torchrun and the rollout executor. Shared by the loop's tests and the
    viewer's as ``(run_dir, completed process)``; tests must not change it (copy it first)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    run_dir = tmp_path_factory.mktemp("train") / "run"
    small = ["steps=3", "eval.limit=40", "rollout.batch_size=4", "rollout.group_size=4", "checkpoint.every_steps=2",
             "max_minutes=null", "logging.trajectories_per_step=4"]
    out = subprocess.run([str(Path(sys.executable).parent / "agentrl"), "train", "examples/arith_grpo.yaml",
                          f"run_dir={run_dir}", *small], cwd=root, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return run_dir, out
