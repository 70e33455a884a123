"""``agentrl serve`` under hostile input (issue 16): one bad request never costs the others their
work, every request is bounded, the event loop stays free, and aborts do not scan the queue."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
import torch

from agentrl.api import SamplingParams
from agentrl.inference.decoder import Decoder
from agentrl.inference.prefix_cache import PrefixCache
from agentrl.inference.scheduler import GenRequest, Scheduler

from ..serving import until_generating

PROMPT = [60, 124, 117, 115, 101, 114, 124, 62, 72, 105, 33]
LONG = {"max_new_tokens": 150, "ignore_eos": True, "temperature": 0}


@pytest.mark.parametrize("bad", [
    {"input_ids": PROMPT, "sampling_params": {"top_k": 10**20}},
    {"input_ids": PROMPT, "return_logprob": True, "top_logprobs_num": -3},
    {"input_ids": PROMPT, "return_logprob": True, "top_logprobs_num": 10**6},
    {"input_ids": PROMPT, "sampling_params": {"n": 1000000}},
    {"input_ids": PROMPT, "sampling_params": {"min_p": 2}},
    {"input_ids": PROMPT, "sampling_params": {"stop_regex": "(unclosed"}},
], ids=["top_k-1e20", "top_logprobs_num-negative", "top_logprobs_num-huge", "n-million", "min_p-2", "bad-regex"])
async def test_a_bad_request_is_refused_and_the_running_ones_finish(server, bad):
    async with httpx.AsyncClient(timeout=120) as client:
        running = asyncio.create_task(client.post(server + "/generate", json={
            "input_ids": PROMPT, "sampling_params": LONG, "return_logprob": True}))
        await until_generating(server)
        r = await client.post(server + "/generate", json=bad)
        assert r.status_code == 400, r.text
        done = await running
    assert done.status_code == 200, done.text
    assert done.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 150}


def test_chat_top_logprobs_of_the_wrong_type_is_a_400(server):
    r = httpx.post(server + "/v1/chat/completions", timeout=30, json={
        "messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": "abc"})
    assert r.status_code == 400 and "top_logprobs must be an integer in [0, 64]" in r.text, r.text
    r = httpx.post(server + "/v1/chat/completions", timeout=30, json={
        "messages": [{"role": "user", "content": "hi"}], "n": 10**6})
    assert r.status_code == 400 and "n must be an integer in [1, 256]" in r.text, r.text


async def test_health_stays_fast_while_a_10mb_prompt_is_refused(server):
    """A 10 MB text used to be tokenized on the event loop (/health waited 19 s)."""
    text = "the quick brown fox " * (10 * 1024 * 1024 // 20)
    async with httpx.AsyncClient(timeout=120) as client:
        big = asyncio.create_task(client.post(server + "/generate", json={"text": text}))
        worst = 0.0
        while not big.done():
            t0 = time.perf_counter()
            assert (await client.get(server + "/health")).status_code == 200
            worst = max(worst, time.perf_counter() - t0)
            await asyncio.sleep(0.02)
        r = await big
    assert r.status_code == 400 and "longer than the model's context length (512 tokens)" in r.text, r.text
    assert worst < 5.0, f"/health took {worst:.2f} s while the big prompt was handled"


def test_a_body_over_the_limit_is_a_413(serve_factory, untrained_model_dir):
    proc = serve_factory(untrained_model_dir, "--max-request-bytes", "4096")
    r = httpx.post(proc.url + "/generate", json={"text": "x" * 10000}, timeout=30)
    assert r.status_code == 413 and "--max-request-bytes" in r.text, r.text


def test_the_queue_limit_refuses_with_503_and_a_request_larger_than_it_with_400(serve_factory, untrained_model_dir):
    proc = serve_factory(untrained_model_dir, "--max-queued-requests", "4")
    r = httpx.post(proc.url + "/generate", json={"input_ids": PROMPT, "sampling_params": {"n": 5}}, timeout=30)
    assert r.status_code == 400 and "split it" in r.text, r.text
    with httpx.Client(timeout=60) as client:
        # paused in place, the server queues the four and none can finish before the fifth comes
        assert client.post(proc.url + "/pause_generation", json={"mode": "in_place"}).status_code == 200
        threads = [threading.Thread(target=client.post, args=(proc.url + "/generate",),
                                    kwargs={"json": {"input_ids": PROMPT, "sampling_params": LONG}}) for _ in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while sum(client.get(proc.url + "/v1/loads").json()["loads"][0][k]
                  for k in ("num_running_reqs", "num_waiting_reqs")) < 4:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = client.post(proc.url + "/generate", json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1}})
        assert r.status_code == 503 and "queue is full" in r.text, r.text
        assert client.post(proc.url + "/continue_generation", json={}).status_code == 200
        for t in threads:
            t.join()


# ---------------------------------------------------------------- the engine itself


@pytest.fixture
def engine(untrained_model_dir):
    torch.set_num_threads(1)
    decoder = Decoder(untrained_model_dir, num_slots=8, max_len=128, pool_tokens=512)
    eng = Scheduler(decoder, eos_token_ids=set(), decode_text=lambda ids: " ".join(map(str, ids)),
                 prefix_cache=PrefixCache(512))
    eng.start()
    yield eng
    eng.shutdown()


def when_finished(reqs: list[GenRequest]) -> threading.Event:
    """An event the requests' ``notify`` sets once the last of them has finished."""
    left, done = [len(reqs)], threading.Event()

    def note(_: GenRequest, finished: bool) -> None:
        left[0] -= finished
        if not left[0]:
            done.set()
    for r in reqs:
        r.notify = note
    return done


def run_all(engine: Scheduler, reqs: list[GenRequest], timeout: float = 60) -> None:
    done = when_finished(reqs)
    engine.submit(*reqs)
    assert done.wait(timeout), "the engine did not finish the requests"


@pytest.mark.parametrize("poison", ["sampling", "forward"])
def test_a_request_that_fails_inside_the_engine_fails_alone(engine, poison):
    """Validation keeps such requests out; if one gets in anyway (an engine bug), it is finished
    with its own error and the others of its batch are computed as if it was not there."""
    good = [GenRequest(f"good-{i}", PROMPT[: 5 + i], SamplingParams(max_new_tokens=6, temperature=0)) for i in range(3)]
    if poison == "sampling":  # an overflow when the batch's settings become tensors
        bad = GenRequest("bad", PROMPT, SamplingParams(max_new_tokens=6, top_k=10**20))
    else:  # a token id past the embedding table: the packed forward pass raises
        bad = GenRequest("bad", PROMPT + [10**6], SamplingParams(max_new_tokens=6))
    run_all(engine, [*good, bad])
    alone = [GenRequest(f"alone-{i}", PROMPT[: 5 + i], SamplingParams(max_new_tokens=6, temperature=0)) for i in range(3)]
    run_all(engine, alone)
    assert bad.finish_reason["type"] == "abort" and bad.finish_reason["status_code"] == 500
    assert "engine error" in bad.finish_reason["message"]
    for g, a in zip(good, alone, strict=True):
        assert g.finish_reason == {"type": "length", "length": 6}
        assert g.output_ids == a.output_ids


class CountingId(str):
    """A request id that counts how often it is compared by prefix or equality."""

    calls = 0

    def startswith(self, *args):
        CountingId.calls += 1
        return str.startswith(self, *args)

    def __eq__(self, other):
        CountingId.calls += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_aborting_queued_requests_one_by_one_does_not_scan_the_queue(engine):
    engine.pause("in_place").result(timeout=10)  # nothing is admitted: all wait in the queue
    n = 2000
    reqs = [GenRequest(CountingId(f"q{i}"), PROMPT, SamplingParams(max_new_tokens=4)) for i in range(n)]
    finished = when_finished(reqs)
    engine.submit(*reqs)
    CountingId.calls = 0
    for r in reqs:
        engine.abort(str(r.rid))
    assert finished.wait(30)
    engine.resume().result(timeout=10)
    # a scan per abort compares every live id: ~n^2 / 2 = 2,000,000 calls; a dict lookup a few
    assert CountingId.calls <= 4 * n, CountingId.calls
    assert all(r.finish_reason == {"type": "abort", "message": "Abort in waiting queue"} for r in reqs)


def test_requests_that_come_with_a_pause_wait_and_the_memory_can_be_released(untrained_model_dir):
    """A pause, then requests, in one batch of the engine's commands (an aborted client re-sends at
    once): they wait in the queue, none enters a slot, so /release_memory_occupation is accepted."""
    torch.set_num_threads(1)
    decoder = Decoder(untrained_model_dir, num_slots=8, max_len=128, pool_tokens=512)
    eng = Scheduler(decoder, eos_token_ids=set(), decode_text=lambda ids: " ".join(map(str, ids)))
    reqs = [GenRequest(f"r{i}", PROMPT, SamplingParams(max_new_tokens=4)) for i in range(4)]
    done = when_finished(reqs)
    paused = eng.pause("abort")  # queued before the thread starts: the first drain runs them together
    eng.submit(*reqs)
    eng.start()
    try:
        paused.result(timeout=10)
        eng.release_memory({"kv_cache", "weights"}).result(timeout=10)
        assert eng.load() == {"num_running_reqs": 0, "num_waiting_reqs": 4}
        eng.resume_memory({"kv_cache", "weights"}).result(timeout=10)
        eng.resume().result(timeout=10)
        assert done.wait(60)
        assert all(r.finish_reason == {"type": "length", "length": 4} for r in reqs)
    finally:
        eng.shutdown()


def test_a_chat_template_in_the_request_is_refused_unless_the_server_trusts_them(server):
    """Issue 49: ``chat_template_kwargs.chat_template`` was rendered on the event loop: a loop in
    it froze /health, and ``'x' * 100000000`` was accepted. Refused now, as vLLM refuses it
    without ``--trust-request-chat-template``; the template variables still reach the template."""
    messages = [{"role": "user", "content": "hi"}]
    for body in ({"chat_template_kwargs": {"chat_template": "{{ 'x' * 100000000 }}"}},
                 {"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}):
        r = httpx.post(server + "/v1/chat/completions", timeout=30, json={"messages": messages, **body})
        assert r.status_code == 400 and "--trust-request-chat-template" in r.text, r.text
    r = httpx.post(server + "/v1/chat/completions", timeout=30, json={
        "messages": messages, "max_tokens": 2, "chat_template_kwargs": {"enable_thinking": False}})
    assert r.status_code == 200, r.text


async def test_a_trusted_request_template_renders_within_bounds(tokenizer):
    """With the flag, a request's template renders in a child process: one that loops for hours
    is stopped at the time bound, one that builds a huge string is refused, and the event loop
    keeps its pace meanwhile; a plain one renders as the tokenizer would."""
    from agentrl.errors import Refused
    from agentrl.inference.request_template import render_bounded

    messages = [{"role": "user", "content": "hi"}]

    def render(template: str):
        return lambda: tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False)

    ticks = 0

    async def tick():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    t0 = time.perf_counter()
    with pytest.raises(Refused, match="did not render within 1 s"):
        await render_bounded(render("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"),
                             timeout_s=1.0)
    took = time.perf_counter() - t0
    ticker.cancel()
    assert took < 3.0 and ticks > took / 0.01 / 3, (took, ticks)  # the loop kept ticking
    with pytest.raises(Refused, match="more than 8,388,608|more than 256 MiB"):
        await render_bounded(render("{% set s = 'x' * 100000000 %}{{ s }}"), memory_bytes=256 << 20)
    with pytest.raises(Refused, match="could not render these messages: .*UndefinedError"):
        await render_bounded(render("{{ nope.attr }}"))
    plain = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    assert await render_bounded(render(plain)) == render(plain)() == "<user>hi"


def test_an_adapter_config_that_is_a_fifo_is_refused_at_once(server, tmp_path):
    """Issue 49: a ``lora_path`` whose ``adapter_config.json`` was a FIFO held a thread of the
    shared worker pool until something wrote to it; now what is not a plain file is refused."""
    import os

    os.mkfifo(tmp_path / "adapter_config.json")
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    t0 = time.perf_counter()
    r = httpx.post(server + "/load_lora_adapter", timeout=30, json={"lora_name": "fifo", "lora_path": str(tmp_path)})
    assert r.status_code == 400 and "is not a regular file" in r.text, r.text
    assert time.perf_counter() - t0 < 5


async def test_a_hung_adapter_read_holds_neither_the_worker_pool_nor_the_route(untrained_model_dir):
    """A read that never ends (a hung network file system) runs on a thread of its own: the call
    is refused at its timeout, the shared pool keeps working, and the next read waits its turn."""
    import threading

    from agentrl.errors import Refused
    from agentrl.inference.serve_config import ServeConfig
    from agentrl.inference.state import ServerState

    state = ServerState(ServeConfig(model=str(untrained_model_dir)))
    release = threading.Event()
    hung = [asyncio.create_task(state.read_adapter_files(release.wait, timeout_s=0.5)) for _ in range(40)]
    # 40 hung reads would have taken every thread of the default pool; it still answers at once
    assert await asyncio.wait_for(asyncio.to_thread(lambda: 7), 2) == 7
    for task in hung:
        with pytest.raises(Refused, match="more than 0.5 s"):
            await task
    release.set()
    assert await state.read_adapter_files(lambda: "read") == "read"


def test_content_parts_are_rendered_as_their_text(server, tokenizer):
    """Issue 49: OpenAI content parts (``[{"type": "text", ...}]``) were rendered as their
    Python repr; they are their text now, as the gateway reads them, and an image part is a 400."""
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "1+2?"}]}]
    plain = [{"role": "user", "content": "What is 1+2?"}]
    ids = []
    for messages in (parts, plain):
        r = httpx.post(server + "/v1/chat/completions", timeout=30, json={
            "messages": messages, "max_tokens": 1, "return_token_ids": True})
        assert r.status_code == 200, r.text
        ids.append(r.json()["choices"][0]["prompt_token_ids"])
    assert ids[0] == ids[1] and "{'type'" not in tokenizer.decode(ids[0])
    r = httpx.post(server + "/v1/chat/completions", timeout=30, json={"messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})
    assert r.status_code == 400 and "only text parts are supported" in r.text, r.text


def test_a_context_longer_than_the_model_s_positions_is_refused(untrained_model_dir):
    """Issue 49: ``--context-length 4096`` was accepted on a model of 1,024 positions."""
    from agentrl.errors import ConfigError
    from agentrl.inference.serve_config import ServeConfig
    from agentrl.inference.state import ServerState

    with pytest.raises(ConfigError, match="longer than this model's max_position_embeddings \\(1024\\)"):
        ServerState(ServeConfig(model=str(untrained_model_dir), context_length=4096))
