"""SGLang's frontend language (``sglang.lang``: ``RuntimeEndpoint``, ``gen``, ``select``,
streaming) works unchanged against ``agentrl serve`` (issue 16). It sends every sampling field at
its default (``stop_regex: []``, ``regex: null``, ``min_p: 0``, ...) and scores ``select``'s
choices with prompt logprobs (``logprob_start_len``, ``input_token_logprobs``).

The frontend comes from the sglang wheel installed without its dependencies (they pull CUDA)
by ``make sglang-frontend``; the driver (``sglang_frontend_driver.py``) runs in a subprocess with
it on PYTHONPATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

FRONTEND = Path(sys.executable).parent.parent / "sglang-frontend"
DRIVER = Path(__file__).with_name("sglang_frontend_driver.py")


@pytest.fixture(scope="module")
def frontend():
    if not (FRONTEND / ".installed").is_file():
        why = f"sglang's frontend is not installed in {FRONTEND}; run `make sglang-frontend`"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set: {why}")
        pytest.skip(why)
    return FRONTEND


def drive(frontend: Path, url: str, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(frontend)}
    r = subprocess.run([sys.executable, str(DRIVER), url, *args], capture_output=True, text=True, timeout=300,
                       env=env, cwd=str(DRIVER.parent))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_gen_select_and_streaming_work_unchanged(frontend, serve_factory, untrained_model_dir, hf_model, tokenizer):
    proc = serve_factory(untrained_model_dir, "--api-key", "frontend-key")
    out = drive(frontend, proc.url, "frontend-key")
    question = "Q: what colour is the sky?\nA:"
    greedy = httpx.post(proc.url + "/generate", headers={"Authorization": "Bearer frontend-key"}, timeout=60, json={
        "text": question, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}).json()["text"]
    assert out["answer"] == greedy and out["streamed_answer"] == greedy
    assert out["pick"] in ("red", "green", "blue") and out["streamed_pick"] == out["pick"]
    # select's scores: the mean logprob of each choice's tokens from two before the prompt's end
    prompt = question + greedy + "\nPick one: "
    n = len(tokenizer.encode(prompt, add_special_tokens=False))
    want = []
    for choice in ("red", "green", "blue"):
        ids = tokenizer.encode(prompt + choice, add_special_tokens=False)
        with torch.no_grad():
            logp = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), -1)
        want.append(sum(logp[j - 1, ids[j]].item() for j in range(n - 1, len(ids))) / (len(ids) - n + 1))
    assert out["normalized_prompt_logprobs"] == pytest.approx(want, abs=1e-4)
    assert out["pick"] == ("red", "green", "blue")[max(range(3), key=want.__getitem__)]
