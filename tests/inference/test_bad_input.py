"""Every bad request gets a 4xx JSON error that says what was wrong, never a 500 or a hang;
a client that goes away frees its slot."""

from __future__ import annotations

import asyncio

import httpx
import pytest

PROMPT = [60, 124, 117, 115, 101, 114, 124, 62, 72, 105, 33]
SP = {"max_new_tokens": 4}

CASES = [
    # (route, raw body or JSON, expected substring of the message)
    ("/generate", b"{not json", "not valid JSON"),
    ("/generate", b"", "body is empty"),
    ("/generate", [1, 2], "must be a JSON object"),
    ("/generate", {"input_ids": PROMPT, "sampling_params": {"max_tokens": 4}}, "unknown field `max_tokens`"),
    ("/generate", {"input_ids": PROMPT, "sampling_params": {"seed": 1}}, "unknown field `seed`"),
    ("/generate", {"input_ids": list(range(200)) * 3, "sampling_params": SP},
     "The input (600 tokens) is longer than the model's context length (512 tokens)"),
    ("/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 600}},
     "exceeds the model's maximum context length of 512"),
    ("/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens must be an integer >= 0"),
    ("/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": "5"}}, "max_new_tokens must be"),
    ("/generate", {"input_ids": PROMPT, "sampling_params": {"temperature": -0.5}}, "temperature"),
    ("/generate", {"input_ids": PROMPT, "sampling_params": {"top_p": 0}}, "top_p must be a number in (0, 1]"),
    ("/generate", {"input_ids": PROMPT, "sampling_params": {"top_k": 0}}, "top_k must be -1"),
    ("/generate", {"input_ids": PROMPT, "sampling_params": {"stop": [1]}}, "stop must be"),
    ("/generate", {"input_ids": PROMPT, "sampling_params": {"regex": "a+"}}, "regex is a grammar constraint"),
    ("/generate", {"input_ids": PROMPT, "sampling_params": {"json_schema": "{}"}}, "json_schema is a grammar"),
    ("/generate", {"input_ids": PROMPT, "text": "hi"}, "Either text or input_ids"),
    ("/generate", {"sampling_params": SP}, "Either text or input_ids"),
    ("/generate", {"input_ids": []}, "input_ids cannot be empty"),
    ("/generate", {"input_ids": [1, 99999]}, "outside the vocabulary"),
    ("/generate", {"input_ids": ["a"]}, "list of token ids"),
    ("/generate", {"input_ids": PROMPT, "return_logprob": True, "logprob_start_len": 99},
     "logprob_start_len must be -1 (no prompt logprobs) or a prompt position in [0, 11]"),
    ("/pause_generation", {"mode": "freeze"}, "mode must be one of"),
    ("/abort_request", {"rid": 5}, "rid must be a string"),
    ("/update_weights_from_disk", {}, "has no model_path"),
    ("/update_weights_from_disk", b"[", "not valid JSON"),
    ("/v1/chat/completions", b"{", "not valid JSON"),
    ("/v1/chat/completions", {"model": "m"}, "messages must be a non-empty list"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, "role must be"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": -2},
     "max_new_tokens must be an integer >= 0"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
     "function": {"name": "f"}}], "tool_choice": "required"}, "tool_choice 'required' is not supported"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 600}]}, "longer than the model's"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": -1},
     "max_new_tokens must be an integer >= 0"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": True, "n": 2},
     "n > 1 is not supported with stream=true"),
    ("/v1/completions", {"prompt": "hi", "echo": True}, "echo is not supported"),
    ("/v1/completions", {"prompt": {"a": 1}}, "prompt must be"),
    # each of these was a 500: a Python error (UnicodeEncodeError on the echoed id, ValueError,
    # RecursionError, OverflowError) escaping the parsers
    ("/generate", b'{"input_ids": [1], "rid": "\\ud800"}', "lone surrogate"),  # echoed, then unencodable
    ("/update_weight_version", b'{"new_version": "v\\udfff"}', "lone surrogate"),
    ("/generate", b'{"input_ids": [' + b"9" * 5000 + b"]}", "not valid JSON"),  # past int's 4,300 digits
    ("/generate", b"[" * 100_000, "nested too deeply"),
    ("/generate", b'{"input_ids": [1], "sampling_params": {"temperature": 1' + b"0" * 400 + b"}}",
     "got an integer of 401 digits"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "top_p": -1' + b"0" * 400 + b"}",
     "top_p must be a number in (0, 1]"),
]


@pytest.mark.parametrize(("route", "body", "expected"), CASES, ids=[f"{c[0]}:{c[2][:30]}" for c in CASES])
def test_bad_input_gets_a_4xx_that_says_what_was_wrong(server, route, body, expected):
    if isinstance(body, bytes):
        r = httpx.post(server + route, content=body, headers={"content-type": "application/json"}, timeout=30)
    else:
        r = httpx.post(server + route, json=body, timeout=30)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert expected in r.text, r.text
    r.json()  # always JSON


def test_an_escaped_surrogate_pair_is_text_not_a_lone_surrogate(server):
    body = b'{"text": "hi \\ud83d\\ude00", "rid": "pair-\\ud83d\\ude00", "sampling_params": {"max_new_tokens": 2}}'
    r = httpx.post(server + "/generate", content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["id"] == "pair-\U0001f600"


async def test_duplicate_rid_in_flight_is_refused(server):
    async with httpx.AsyncClient(timeout=60) as client:
        first = asyncio.create_task(client.post(server + "/generate", json={
            "input_ids": PROMPT, "rid": "dup-rid", "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}))
        async with asyncio.timeout(30):
            while True:
                if (await client.get(server + "/v1/loads")).json()["loads"][0]["num_running_reqs"]:
                    break
                await asyncio.sleep(0.01)
        second = await client.post(server + "/generate", json={"input_ids": PROMPT, "rid": "dup-rid"})
        await client.post(server + "/abort_request", json={"rid": "dup-rid"})
        aborted = (await first).json()
    assert second.status_code == 400 and "Duplicate request ID detected: dup-rid" in second.text
    assert aborted["meta_info"]["finish_reason"]["type"] == "abort"


async def test_a_disconnected_stream_frees_its_slot(server):
    async with httpx.AsyncClient(timeout=60) as client:
        before = (await client.get(server + "/server_info")).json()["internal_states"][0]["num_generated_tokens"]
        async with client.stream("POST", server + "/generate", json={
                "input_ids": PROMPT, "stream": True,
                "sampling_params": {"max_new_tokens": 480, "ignore_eos": True}}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    break  # the client walks away after the first chunk
        async with asyncio.timeout(30):
            while True:
                info = (await client.get(server + "/server_info")).json()["internal_states"][0]
                if info["num_running_reqs"] == 0:
                    break
                await asyncio.sleep(0.01)
    assert info["num_generated_tokens"] - before < 480, "the request ran to its end after the client left"


async def test_a_disconnected_waiting_request_is_dropped(server):
    async with httpx.AsyncClient(timeout=60) as client:
        await client.post(server + "/pause_generation", json={"mode": "in_place"})
        try:
            with pytest.raises(httpx.ReadTimeout):
                await client.post(server + "/generate", json={"input_ids": PROMPT}, timeout=0.5)
            async with asyncio.timeout(30):
                while True:
                    if not (await client.get(server + "/v1/loads")).json()["loads"][0]["num_waiting_reqs"]:
                        break
                    await asyncio.sleep(0.05)
        finally:
            await client.post(server + "/continue_generation", json={})


def test_the_schema_and_the_parser_read_one_declaration_of_each_sampling_key():
    """Each numeric sampling key's edges, as ``GET /openapi.json`` states them, are where the
    parser starts refusing: both come from ``validation.SAMPLING``."""
    from agentrl.errors import Refused
    from agentrl.inference.openapi import sampling_params
    from agentrl.inference.validation import SAMPLING, Bounds, parse_sampling

    bounds = Bounds(context_length=64, vocab_size=100, max_n=8, max_top_logprobs=5)
    schema = sampling_params(bounds)["properties"]
    assert set(schema) == set(SAMPLING)
    checked = 0
    for name, key in SAMPLING.items():
        if key.kind not in ("number", "integer") or name in ("max_new_tokens", "min_new_tokens"):
            continue  # those two are bounded by the prompt too (checked below)
        s, step = schema[name], (1 if key.kind == "integer" else 1e-3)
        lo = s.get("minimum", s.get("exclusiveMinimum"))
        ok_lo = lo + step if "exclusiveMinimum" in s else lo
        parse_sampling({name: ok_lo, "max_new_tokens": 4}, prompt_len=3, bounds=bounds)
        with pytest.raises(Refused, match=name):
            parse_sampling({name: (lo if "exclusiveMinimum" in s else lo - step), "max_new_tokens": 4},
                           prompt_len=3, bounds=bounds)
        if "maximum" in s:
            parse_sampling({name: s["maximum"], "max_new_tokens": 4}, prompt_len=3, bounds=bounds)
            with pytest.raises(Refused, match=name):
                parse_sampling({name: s["maximum"] + step, "max_new_tokens": 4}, prompt_len=3, bounds=bounds)
        checked += 1
    assert checked >= 9  # temperature, top_p, min_p, three penalties, n, the seed, stream_interval
    assert schema["max_new_tokens"]["maximum"] == 63
    with pytest.raises(Refused, match="context length"):
        parse_sampling({"max_new_tokens": 62}, prompt_len=3, bounds=bounds)
