"""Shared fixtures. Component fixtures live in the conftest.py of each test folder."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

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
    from agentrl.process.services import ServerProcess

    with ServerProcess(tiny_model_dir, "--weight-version", "0", "--max-running-requests", "64") as proc:
        yield proc


@pytest.fixture(scope="session")
def docker_ready():
    """A Docker engine answers and the sandbox image exists; else skip — or fail under CI,
    where `make test` sets both up."""
    import os

    try:
        import docker

        with contextlib.closing(docker.from_env(timeout=10)) as client:
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


LORA_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="session")
def random_adapter():
    """``random_adapter(model_dir, out, seed=0, rank=8, targets=LORA_PROJECTIONS)``: a peft LoRA
    adapter on ``model_dir`` (``lora_alpha`` 2 x rank) with random, non-zero A and B — one that
    changes what the tiny models sample — saved at ``out``, for the tests that serve adapters."""
    def make(model_dir, out, *, seed: int = 0, rank: int = 8, targets: list[str] = LORA_PROJECTIONS):
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                               LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets,
                                          init_lora_weights=False))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.mul_(3.0)  # peft's random init, scaled
        model.save_pretrained(out)
        return out
    return make


@pytest.fixture(scope="session")
def openapi_fuzz():
    """``openapi_fuzz(url, examples=, hang_s=, ...) -> (cases, failures)``: fuzz an HTTP
    service from its OpenAPI document, for the fuzz tests of ``agentrl serve`` and the sandbox
    service. schemathesis builds the cases (bodies, path and query parameters that follow the
    schema, and ones that break it), hypothesis runs them, and every answer is checked to be no
    5xx and to come within ``hang_s`` seconds. Bounded: ``examples`` cases per operation and
    mode, derandomized, so a failure reproduces. (The cases are drawn through schemathesis'
    strategies directly rather than its pytest plugin, so that one test sends every operation
    to one live server process, with hooks around each case, and reports every failure at
    once.)"""
    return _fuzz


def _fuzz(url: str, *, examples: int, hang_s: float, headers: dict[str, str] | None = None,
          before: Callable[[Any], None] | None = None, after: Callable[[Any], None] | None = None,
          coverage: int = 0) -> tuple[int, list[str]]:
    """Send the cases of every operation of ``url``'s ``/openapi.json``; returns how many cases
    ran and the failures. ``before(case)`` may change a schemathesis case before it is sent
    (e.g. put a live session's id in its path); ``after(response or None)`` runs after each
    case (e.g. to undo a pause).

    Two phases per operation: schemathesis' *coverage* cases (each field at its boundaries, of
    a wrong type, missing; at most ``coverage`` of them, spread evenly over the list), then
    ``examples`` random cases per mode (shapes that follow the schema, and that break it)."""
    import requests
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(url + "/openapi.json", headers=dict(headers or {}))
    failures: list[str] = []
    count = 0

    def runner(op, mode, session):
        @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy(generation_mode=mode))
        def run(case) -> None:
            send(case, f"{op.label} [{mode.value}]", session)
        return run

    def send(case, where: str, session) -> None:
        nonlocal count
        count += 1
        response = None
        if before is not None:
            before(case)
        body = f"{case.formatted_path} {getattr(case, 'body', None)!r}"[:300]
        try:
            response = case.call(base_url=url, session=session, headers=headers, timeout=hang_s)
            if response.status_code >= 500:
                failures.append(f"{where} -> {response.status_code} {response.text[:300]!r} for {body}")
        except requests.Timeout:
            failures.append(f"{where}: no answer within {hang_s} s for {body}")
        except requests.ConnectionError as e:
            failures.append(f"{where}: connection failed ({e}) for {body}")
        finally:
            if after is not None:
                after(response)

    with requests.Session() as session:
        for result in schema.get_all_operations():
            op = result.ok()
            cases = list(schema.iter_coverage_cases(op, generation_modes=list(GenerationMode),
                                                    generation_config=schema.config.generation))
            picked = cases[:: max(1, -(-len(cases) // coverage))] if coverage else []
            for case in picked:
                send(case, f"{op.label} [coverage]", session)
            for mode in GenerationMode:
                try:
                    runner(op, mode, session)()
                except Unsatisfiable:  # nothing to break in a route without parameters or body
                    pass
    return count, failures


OPENENV_SUM_ENV = '''
import random
from openenv.core.env_server import Action, Environment, Observation, State, create_app


class SumAction(Action):
    message: str


class SumObservation(Observation):
    prompt: str = ""


class SumEnv(Environment[SumAction, SumObservation, State]):
    """a+b+c, answered in \\\\boxed{}: reward 1 when right, done after one reply."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state, self.answer = State(step_count=0), 0

    def reset(self, seed=None, episode_id=None, **kwargs):
        rng = random.Random(seed)
        a, b, c = (rng.randrange(10, 100) for _ in range(3))
        self.answer, self._state = a + b + c, State(episode_id=episode_id, step_count=0)
        return SumObservation(prompt=f"What is {a}+{b}+{c}?")

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        return SumObservation(done=True, reward=float(f"\\\\boxed{{{self.answer}}}" in action.message))

    @property
    def state(self):
        return self._state


app = create_app(SumEnv, SumAction, SumObservation, env_name="sum", max_concurrent_envs=64)
'''


@contextlib.contextmanager
def openenv_server(folder, module: str):
    """``module:app`` (an OpenEnv ``create_app``) in ``folder``, served by uvicorn on 127.0.0.1 until
    the block ends: its URL."""
    import subprocess
    import sys
    import time

    import httpx

    from agentrl.process.services import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", f"{module}:app", "--host", "127.0.0.1", "--port",
                             str(port)], cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-2000:]
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="session")
def openenv_sum_server(tmp_path_factory):
    """An OpenEnv ``Environment`` defined here (``OPENENV_SUM_ENV``), served by OpenEnv's own ``create_app``
    (uvicorn) on 127.0.0.1: ``(url, folder of its module)``. Shared by the OpenEnv adapter's tests and
    verifiers' ``openenv`` taskset's."""
    folder = tmp_path_factory.mktemp("openenv")
    (folder / "sum_env.py").write_text(OPENENV_SUM_ENV)
    with openenv_server(folder, "sum_env") as url:
        yield url, folder
