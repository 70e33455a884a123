"""Fuzzing every HTTP route of ``agentrl serve`` from its OpenAPI document (issue 16): bodies that
follow the documented shapes and bodies that break them (wrong types, missing and out-of-range
fields); any 5xx, or an answer slower than ``HANG_S``, fails (the ``openapi_fuzz`` fixture).

Bounded: ``EXAMPLES`` cases per operation and mode and ``COVERAGE`` boundary cases per
operation, derandomized; the server has a 192-token context, so that no generation is long
but SGLang's default ``max_new_tokens`` (128) fits beside a short prompt.
The generation schemas carry the server's bounds, so many drawn bodies are valid and reach
the engine — the test checks that they did (a fuzz test that only ever meets the parsers'
400s would not test the engine). Each case is followed by ``/resume_memory_occupation`` and
``/continue_generation``, since a fuzzed ``/release_memory_occupation`` or ``/pause_generation``
would otherwise hold every later ``/generate`` (as SGLang's do), and the server must still
answer ``/health`` and generate at the end."""

from __future__ import annotations

from collections import Counter

import httpx

from agentrl.process.services import ServerProcess

EXAMPLES = 10
COVERAGE = 60
HANG_S = 20.0
GENERATING = ("/generate", "/v1/chat/completions", "/v1/completions")


def test_no_route_answers_5xx_or_hangs(untrained_model_dir, openapi_fuzz):
    with ServerProcess(untrained_model_dir, "--context-length", "192", "--max-running-requests", "8", "--max-n", "4",
                       "--max-queued-requests", "64", "--max-top-logprobs-num", "5") as proc:
        url = proc.url
        answered: Counter[tuple[str, int]] = Counter()

        def resume(response) -> None:
            if response is not None:
                answered[response.request.path_url, response.status_code] += 1
            httpx.post(url + "/resume_memory_occupation", json={}, timeout=HANG_S)
            httpx.post(url + "/continue_generation", json={}, timeout=HANG_S)
        count, failures = openapi_fuzz(url, examples=EXAMPLES, hang_s=HANG_S, after=resume, coverage=COVERAGE)
        assert not failures, "\n".join(failures)
        assert count >= 19 * EXAMPLES
        generated = {path: answered[path, 200] for path in GENERATING}
        assert all(n >= 3 for n in generated.values()), (generated, sorted(answered.items()))
        r = httpx.post(url + "/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}},
                       timeout=HANG_S)
        assert r.status_code == 200 and len(r.json()["output_ids"]) <= 4
        assert httpx.get(url + "/health", timeout=HANG_S).status_code == 200
