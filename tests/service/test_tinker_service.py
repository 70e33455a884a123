"""`agentrl service` driven by the unmodified tinker SDK (0.38, in .venv-tinker; `make tinker`).

One real `agentrl service` on the tiny model, sampling through the suite's shared `agentrl serve`
(per-request adapters); each test runs one scenario of `sdk_calls.py` in the SDK's own venv and
checks what the SDK got back. The bug stories: a route the SDK calls that we answer in a shape it
cannot read (it raises, or polls forever); a loss that is not the SDK docs' definition; a sampler
that samples the base model instead of the saved adapter; a resumed client whose optimizer state
was lost (its next step differs from the one the saved client took); one client's steps leaking
into another's adapter; a bad request that crashes the service or poisons the client.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agentrl.cli.service_command import READY
from agentrl.process.services import ServiceProcess

ROOT = Path(__file__).resolve().parents[2]
TINKER_PYTHON = ROOT / ".venv-tinker" / "bin" / "python"
KEY = "tml-agentrl-test-key"


@pytest.fixture(scope="module")
def service(tiny_server, tiny_model_dir, tmp_path_factory):
    if not TINKER_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {TINKER_PYTHON} is missing; `make tinker` (part of `make test`) makes it")
        pytest.skip("no .venv-tinker: run `make tinker` for the tinker SDK's tests")
    cmd = [str(Path(sys.executable).parent / "agentrl"), "service", "--model", str(tiny_model_dir), "--port", "0",
           "--api-key", KEY, "--dir", str(tmp_path_factory.mktemp("service")), "--sampler", tiny_server.url]
    with ServiceProcess(cmd, ready=READY, env={**os.environ, "OMP_NUM_THREADS": "1"}) as proc:
        yield proc


def run_in_tinker_venv(service, script: str, *args: str) -> dict:
    """Run one of this folder's scripts on the SDK's interpreter; its last stdout line, parsed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(TINKER_BASE_URL=service.url, TINKER_API_KEY=KEY, TINKER_TELEMETRY="0", OMP_NUM_THREADS="1")
    r = subprocess.run([str(TINKER_PYTHON), str(Path(__file__).parent / script), *args], env=env,
                       capture_output=True, text=True, timeout=400)
    assert r.returncode == 0 and r.stdout.strip(), (r.stderr[-3000:], service.tail())
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def sdk_results(service) -> dict:
    """Every scenario of sdk_calls.py, in one run of the SDK."""
    return run_in_tinker_venv(service, "sdk_calls.py")


def close(a, b, tol=2e-3) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, abs_tol=tol) for x, y in zip(a, b, strict=True))


def test_the_sdk_trains_samples_and_scores_through_every_route(sdk_results, tiny_model_dir):
    got = sdk_results["train"]
    assert got["models"] == [str(Path(tiny_model_dir).resolve())]
    assert got["is_lora"] and got["rank"] == 4 and got["tokenizer_id"] == got["models"][0]
    assert got["losses"][-1] < got["losses"][0] and sum(got["after"]) > sum(got["before"])
    # each RL loss is the SDK docs' definition, computed here from the logprobs the service returned
    t = np.array(got["rl"]["ppo"]["target"], dtype=np.float64)
    q, a = np.array(got["rl"]["sampling"]), np.array(got["rl"]["advantages"])
    ratio = np.exp(t - q)
    seq = np.exp((t - q)[np.array(got["rl"]["mask"]) != 0].mean())  # gspo: the sequence's ratio, every token
    expected = {"importance_sampling": -(ratio * a).sum(),
                "ppo": -np.minimum(ratio * a, np.clip(ratio, 0.9, 1.1) * a).sum(),
                "cispo": -(np.clip(ratio, 0.9, 1.1) * t * a).sum(),
                "gspo": -np.minimum(seq * a, np.clip(seq, 0.9, 1.1) * a).sum()}
    for loss, value in expected.items():
        assert math.isclose(got["rl"][loss]["loss"], value, rel_tol=1e-4, abs_tol=1e-4), loss
    # samples from the saved adapter: n of them, with a logprob per token
    assert len(got["samples"]) == 3 and all(1 <= len(s) <= 6 for s in got["samples"])
    assert all(len(lp) == len(s) and max(lp) <= 0 for s, lp in zip(got["samples"], got["sample_logprobs"], strict=True))
    stop, eos = 45, 257  # SEQ_A[5], the tiny model's <|end|>: generation ends at one or at max_tokens
    assert stop not in got["stopped"][:-1] and (got["stopped"][-1] in (stop, eos) or len(got["stopped"]) == 8)
    # compute_logprobs of the saved adapter is the trained model; of the base, the untrained one
    assert got["scored"][0] is None and close(got["scored"][1:], got["after"])
    assert close(got["base_scored"][1:], got["before"])
    assert got["saved"].endswith("/sampler_weights/trained") and got["saved"] in got["checkpoints"]


def test_load_state_resumes_with_the_optimizer(sdk_results):
    got = sdk_results["resume"]
    assert got["path"].startswith("tinker://") and "/weights/two-steps" in got["path"]
    assert close(got["loaded"], got["saved_at"], 1e-5)
    # the resumed client's next step is the saved client's next step: Adam's moments came along
    assert close(got["resumed_step"], got["continued"], 1e-4)
    assert not close(got["continued"], got["saved_at"], 1e-3)
    assert close(got["reloaded"], got["saved_at"], 1e-5)


def test_two_clients_keep_their_adapters_apart(sdk_results):
    got = sdk_results["two_clients"]
    assert got["idle_after"] == got["idle_before"]  # exactly: nobody's steps touched it
    assert sum(got["b_own"]) > sum(got["b_before"])
    assert not close(got["a_on_b"], got["b_own"], 1e-2)
    # the three scorings went to agentrl serve together, each naming its own adapter
    assert close(got["sampled"][0][1:], got["a_own"]) and close(got["sampled"][1][1:], got["b_own"])
    assert close(got["sampled"][2][1:], got["a_on_b"])


def test_bad_requests_are_refused_with_the_sdks_errors_and_the_client_goes_on(sdk_results):
    got = sdk_results["bad"]
    kind, category, message = got["shape"]
    assert kind == "RequestFailedError" and category == "user" and "weights" in message and "(11,)" in message
    assert got["base"][:2] == ["BadRequestError", 400] and "is not served here" in got["base"][2]
    assert got["path"][:2] == ["NotFoundError", 404]
    assert got["key"][:2] == ["AuthenticationError", 401]
    assert got["still_trains"][1] < got["still_trains"][0]


def test_the_cookbooks_rl_and_sl_loops_train_through_the_service(service, tiny_model_dir, tmp_path):
    got = run_in_tinker_venv(service, "cookbook_runs.py", str(Path(tiny_model_dir).resolve()), str(tmp_path))
    rl_steps = [m for m in got["rl"] if "env/all/reward/total" in m]
    assert [m["step"] for m in rl_steps] == [0, 1]  # math_rl's arithmetic env: sampled, rewarded, trained
    assert all(m["env/all/total_episodes"] == 8 for m in rl_steps)
    sl_nll = [m["train_mean_nll"] for m in got["sl"] if "train_mean_nll" in m]
    assert len(sl_nll) == 3 and sl_nll[-1] < sl_nll[0]  # the same batch each step: its loss falls
    own = got["own"]  # the cookbook's RL trainer on the tiny model's own task: evaluated, trained
    assert own[0]["env/all/total_episodes"] == 4 and own[0]["test/env/all/total_episodes"] == 4
