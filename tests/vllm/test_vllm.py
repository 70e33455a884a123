"""`RemoteEngine` against a real vLLM server (vLLM's CPU build): exact tokens and logprobs,
weight updates with requests in flight (from disk and by broadcast over torch.distributed),
broken weights refused, and the gateway over it driven by the unmodified `openai` SDK.
`agentrl train inference.engine=vllm` is tests/vllm/test_train_vllm.py."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import shutil
import sys

import httpx
import openai
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from agentrl.api import SamplingParams, sampled_spans
from agentrl.client import RemoteEngine
from agentrl.client.checkpoint_check import check_checkpoint
from agentrl.client.vllm_backend import VLLMBackend, sampling_params
from agentrl.errors import RequestRejected
from agentrl.process.services import ServiceProcess
from agentrl.rollout.renderer import ChatRenderer
from agentrl.trainer.publish import DistributedTransport, StagedTensors

PROMPTS = [[49, 50, 43, 55, 61], [52, 43, 56, 61], [57, 57, 45, 49, 52, 61]]


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def hf_logprobs(model, prompt: list[int], tokens: list[int]) -> list[float]:
    """log p(token) of each sampled token under the checkpoint, by transformers."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()


@pytest.fixture()
def perturbed(tiny_model_dir, tmp_path):
    """A copy of the model whose every weight is scaled: a different policy, same tensors."""
    out = tmp_path / "perturbed"
    shutil.copytree(tiny_model_dir, out)
    weights = load_file(out / "model.safetensors")
    save_file({k: v * 0.9 for k, v in weights.items()}, out / "model.safetensors", metadata={"format": "pt"})
    return out


def test_the_sampled_tokens_and_logprobs_are_exact(vllm_server, hf_model):
    """Greedy: vLLM's tokens are the checkpoint's argmax; every logprob (greedy and sampled at
    T = 1) is the checkpoint's own log-probability of the token, by transformers; a group of
    n = 4 comes back as 4 samples; stop ids end the output with the stop token kept."""
    async def main():
        async with RemoteEngine(vllm_server.url, api_key=vllm_server.key) as engine:
            greedy = await asyncio.gather(*(engine.generate(p, SamplingParams(max_new_tokens=12, temperature=0))
                                            for p in PROMPTS))
            group = await engine.generate_group(PROMPTS[0], SamplingParams(max_new_tokens=12, ignore_eos=True), 4)
            seeded = [await engine.generate_group(PROMPTS[1], SamplingParams(max_new_tokens=8, seed=7), 3)
                      for _ in range(2)]
            stop = await engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=12, temperature=0,
                                                                    stop_token_ids=[greedy[0].tokens[1]]))
            assert engine.config.engine == "auto" and isinstance(engine._backend, VLLMBackend)  # /v1/models
            return greedy, group, seeded, stop

    greedy, group, seeded, stop = asyncio.run(main())
    for prompt, c in zip(PROMPTS, greedy, strict=True):
        expect = hf_model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0, len(prompt):]
        assert c.tokens == expect.tolist()[: len(c.tokens)] and c.finish_reason in ("stop", "length")
        assert c.versions == [0] * len(c.tokens)
        assert c.logprobs == pytest.approx(hf_logprobs(hf_model, prompt, c.tokens), abs=2e-3)
    assert len(group) == 4 and all(len(c.tokens) == 12 and c.finish_reason == "length" for c in group)
    for c in group:
        assert c.logprobs == pytest.approx(hf_logprobs(hf_model, PROMPTS[0], c.tokens), abs=2e-3)
    assert [c.tokens for c in seeded[0]] == [c.tokens for c in seeded[1]]  # seeds seed, seed + 1, ...
    assert stop.tokens == greedy[0].tokens[:2] and stop.finish_reason == "stop"
    assert stop.matched_stop == greedy[0].tokens[1]


def test_vllm_as_a_distillation_teacher_scores_the_sampled_tokens_as_sampled(vllm_server, tiny_model_dir, monkeypatch):
    """On-policy distillation's teacher on vLLM (``/v1/completions`` with ``prompt_logprobs``,
    ``/tokenize``): the server that sampled the tokens scores them as it sampled them (reverse KL
    0 on every token), and its tokenizer passes the check against the student's."""
    from agentrl.api import Trajectory
    from agentrl.rollout.teacher import Teacher
    from agentrl.trainer.distill import TeacherConfig

    monkeypatch.setenv("AGENTRL_TEACHER_API_KEY", vllm_server.key)

    async def main():
        async with RemoteEngine(vllm_server.url, api_key=vllm_server.key) as engine:
            done = await engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=10, temperature=1.0, seed=1))
        p = PROMPTS[0]
        t = Trajectory(p + done.tokens, [0] * len(p) + [1] * len(done.tokens), [0.0] * len(p) + done.logprobs,
                       [-1] * len(p) + done.versions)
        teacher = Teacher(TeacherConfig(url=vllm_server.url, engine="vllm"), str(tiny_model_dir))
        try:
            await teacher.check_tokenizer()
            await teacher.score([t])
        finally:
            await teacher.aclose()
        return t

    t = asyncio.run(main())
    sampled = [(lp, tl) for m, lp, tl in zip(t.loss_mask, t.logprobs, t.teacher_logprobs, strict=True) if m]
    assert sampled and all(tl == pytest.approx(lp, abs=1e-3) for lp, tl in sampled), sampled


def test_weight_updates_with_requests_in_flight_lose_no_token(vllm_server, hf_model, tiny_model_dir, perturbed):
    """Five updates (pause, reload from disk, new version, reset the prefix cache, resume)
    while four 400-token requests run: every request ends with all 400 tokens, each tagged with
    the version that sampled it, versions never decrease, and every token carries the logprob
    of the checkpoint of its version (the perturbed one for odd versions), in every batch
    shape the updates happened to meet (a stale tied output layer shows in some only; the next
    test meets it every time)."""
    async def main():
        async with RemoteEngine(vllm_server.url, version=0, api_key=vllm_server.key) as engine:
            async def publish():
                for v in range(1, 6):
                    await until_tokens(engine, vllm_server, 40)
                    await engine.pause()
                    await engine.update_weights(str(perturbed if v % 2 else tiny_model_dir), v)
                    await engine.resume()
            try:
                runs, _ = await asyncio.gather(asyncio.gather(*(
                    engine.generate(PROMPTS[i % 3], SamplingParams(max_new_tokens=400, ignore_eos=True))
                    for i in range(4))), publish())
            finally:  # the committed weights back, for the other tests
                await engine.pause()
                await engine.update_weights(str(tiny_model_dir), 0)
                await engine.resume()
            return runs, dict(engine.stats)

    runs, stats = asyncio.run(main())
    assert stats["resumes"] >= 4, stats
    assert_every_token_is_its_version_s(runs, 400, 5, hf_model, perturbed)


def assert_every_token_is_its_version_s(runs, length: int, last: int, even, odd_dir) -> None:
    """Request ``i`` (prompt ``PROMPTS[i % 3]``) ran to all its ``length`` tokens; its versions
    never decrease, reach ``last`` and change at least twice; every token carries the logprob
    of its version's weights: ``even`` (a model) for even versions, ``odd_dir``'s for odd ones."""
    odd = AutoModelForCausalLM.from_pretrained(odd_dir, dtype=torch.float32).eval()
    for i, c in enumerate(runs):
        assert len(c.tokens) == length and c.finish_reason == "length"
        assert all(a <= b for a, b in itertools.pairwise(c.versions)), c.versions
        assert c.versions[-1] == last and len(set(c.versions)) >= 3, [k for k, _ in itertools.groupby(c.versions)]
        by_model = {m: hf_logprobs(m, PROMPTS[i % 3], c.tokens) for m in (even, odd)}
        expect = [by_model[odd if v % 2 else even][k] for k, v in enumerate(c.versions)]
        assert c.logprobs == pytest.approx(expect, abs=2e-3), [k for k, _ in itertools.groupby(c.versions)]


def test_an_update_reaches_the_tied_output_layer(vllm_server, hf_model, tiny_model_dir, perturbed):
    """The test model ties its output layer to its embedding (as Qwen2.5-0.5B and Llama 3.2 1B
    do). After an update, one request alone is sampled from the new checkpoint's logits: the
    CPU build's output layer is rebuilt from the new embedding (agentrl's worker extension;
    vLLM's own ``reload_weights`` leaves it on the one the server started with)."""
    async def main():
        async with RemoteEngine(vllm_server.url, version=0, api_key=vllm_server.key) as engine:
            await engine.pause()
            await engine.update_weights(str(perturbed), 1)
            await engine.resume()
            try:
                return await engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=8, temperature=0))
            finally:
                await engine.pause()
                await engine.update_weights(str(tiny_model_dir), 0)
                await engine.resume()

    assert hf_model.config.tie_word_embeddings
    c = asyncio.run(main())
    new = AutoModelForCausalLM.from_pretrained(perturbed, dtype=torch.float32).eval()
    assert c.versions == [1] * len(c.tokens)
    assert c.logprobs == pytest.approx(hf_logprobs(new, PROMPTS[0], c.tokens), abs=2e-3)


def test_lora_adapters_load_by_name_and_a_request_in_flight_loses_no_token(vllm_server, tiny_model_dir, tmp_path,
                                                                           random_adapter):
    """A LoRA run's publish on vLLM (``trainer.weight_sync.adapters: load``): the adapter loads at
    run time (``/v1/load_lora_adapter``) before the pause, and from the pause on every request
    names it; a request running across the switch keeps every token, each tagged with its
    version, and the tokens after it carry the peft-merged checkpoint's logprobs."""
    from agentrl.client.publishing import lora_name
    from agentrl.trainer.lora import merge_adapter

    random_adapter(tiny_model_dir, tmp_path / "adapter", rank=8)

    async def main():
        async with RemoteEngine(vllm_server.url, version=0, api_key=vllm_server.key) as engine:
            async def publish():
                await engine.load_lora_adapter(str(tmp_path / "adapter"), 1)
                await until_tokens(engine, vllm_server, 40)
                await engine.pause()
                await engine.serve_lora_adapter(1)
                await engine.resume()
            try:
                run, _ = await asyncio.gather(
                    engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=300, ignore_eos=True)), publish())
                after = await engine.generate(PROMPTS[1], SamplingParams(max_new_tokens=12, temperature=0))
            finally:
                async with httpx.AsyncClient(timeout=30, headers=vllm_server.auth) as http:
                    await http.post(vllm_server.url + "/v1/unload_lora_adapter", json={"lora_name": lora_name(1)})
            return run, after

    run, after = asyncio.run(main())
    merged = AutoModelForCausalLM.from_pretrained(merge_adapter(tmp_path / "adapter", tmp_path / "merged",
                                                                base_dir=tiny_model_dir), dtype=torch.float32).eval()
    assert len(run.tokens) == 300 and run.finish_reason == "length"
    at = run.versions.index(1)
    assert 40 <= at and run.versions == [0] * at + [1] * (300 - at)
    prompt = PROMPTS[0] + run.tokens[:at]
    assert run.logprobs[at:at + 20] == pytest.approx(hf_logprobs(merged, prompt, run.tokens[at:at + 20]), abs=2e-3)
    expect = merged.generate(torch.tensor([PROMPTS[1]]), max_new_tokens=12, do_sample=False)[0, len(PROMPTS[1]):]
    assert after.tokens == expect.tolist()[: len(after.tokens)] and after.versions == [1] * len(after.tokens)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    # the adapter changed the policy: the checks above could fail
    assert hf_logprobs(base, prompt, run.tokens[at:at + 20]) != pytest.approx(run.logprobs[at:at + 20], abs=2e-3)


def test_colocated_memory_release_sleeps_and_wakes_vllm_around_an_update(vllm_server, hf_model, tiny_model_dir,
                                                                          perturbed):
    """Colocated training's cycle on vLLM (inference.release_memory): pause, /sleep (level 1),
    the weights woken for an update from disk, the KV cache woken by resume. vLLM's CPU build
    frees no memory on /sleep (its worker says so), but its engine goes through the same states:
    asleep until the last tag wakes, then scheduling again. A request in flight keeps every token."""
    async def sleeping(client) -> bool:
        return (await client.get(vllm_server.url + "/is_sleeping")).json()["is_sleeping"]

    async def main():
        async with RemoteEngine(vllm_server.url, version=0, api_key=vllm_server.key) as engine, httpx.AsyncClient(timeout=30, headers=vllm_server.auth) as client:
            job = asyncio.create_task(engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=300, ignore_eos=True)))
            await until_tokens(engine, vllm_server, 40)
            await engine.pause()
            await engine.release_memory()
            states = [await sleeping(client)]
            await engine.occupy_memory(weights_only=True)
            states.append(await sleeping(client))  # the KV cache still asleep
            try:
                await engine.update_weights(str(perturbed), 1)
            finally:
                await engine.resume()
            states.append(await sleeping(client))
            out = await job
            await engine.pause()  # the committed weights back, for the other tests
            await engine.update_weights(str(tiny_model_dir), 0)
            await engine.resume()
            return out, states

    out, states = asyncio.run(main())
    assert states == [True, True, False]
    assert len(out.tokens) == 300 and out.finish_reason == "length"
    at = out.versions.index(1)
    assert 40 <= at and out.versions == [0] * at + [1] * (300 - at)
    last = AutoModelForCausalLM.from_pretrained(perturbed, dtype=torch.float32).eval()
    prompt = PROMPTS[0] + out.tokens[:at]
    assert out.logprobs[at:at + 20] == pytest.approx(hf_logprobs(last, prompt, out.tokens[at:at + 20]), abs=2e-3)


def staged_from(model_dir, bucket_bytes: int) -> StagedTensors:
    """A checkpoint's tensors as the trainer's ``DistributedTransport`` stages them: in name
    order, in flattened buckets of at most ``bucket_bytes``."""
    buckets: list[list[tuple[str, torch.Tensor]]] = [[]]
    for name, t in load_file(model_dir / "model.safetensors").items():
        if buckets[-1] and sum(x.nbytes for _, x in buckets[-1]) + t.nbytes > bucket_bytes:
            buckets.append([])
        buckets[-1].append((name, t))
    return StagedTensors(buckets, [torch.cat([t.reshape(-1).view(torch.uint8) for _, t in b]) for b in buckets])


async def weight_info(server) -> dict:
    async with httpx.AsyncClient(timeout=30, headers=server.auth) as http:
        return (await http.get(server.url + "/weight_info")).json()


def test_weights_by_broadcast_over_torch_distributed_with_requests_in_flight_lose_no_token(
        vllm_server, hf_model, tiny_model_dir, perturbed):
    """``trainer.weight_sync.transport: distributed`` on vLLM: this process, as the trainer's
    rank 0, forms a gloo group with the server's worker (agentrl's worker extension) and sends
    three updates by broadcast, each in several flattened buckets, while four 300-token requests
    run. Every request ends with all its tokens, versions never decrease, and every token
    carries the logprob of its version's weights (the tied output layer included); the group is
    formed once and left at the end."""
    tr = DistributedTransport(master_address="127.0.0.1", backend="gloo", timeout_s=120)
    updates = {v: staged_from(perturbed if v % 2 else tiny_model_dir, bucket_bytes=100_000) for v in (1, 2, 3)}
    assert len(updates[1].buckets) > 2

    async def main():
        async with RemoteEngine(vllm_server.url, version=0, api_key=vllm_server.key) as engine:
            groups = []

            async def publish():
                for v, weights in updates.items():
                    await until_tokens(engine, vllm_server, 40)
                    await engine.pause()
                    try:
                        await tr.send(engine, weights, v)
                    finally:
                        await engine.resume()
                    groups.append(tr.group)
            try:
                runs, _ = await asyncio.gather(asyncio.gather(*(
                    engine.generate(PROMPTS[i % 3], SamplingParams(max_new_tokens=300, ignore_eos=True))
                    for i in range(4))), publish())
                info = await weight_info(vllm_server)
            finally:  # the committed weights back, for the other tests
                await tr.close(engine)
                await engine.pause()
                await engine.update_weights(str(tiny_model_dir), 0)
                await engine.resume()
            return runs, groups, info

    runs, groups, info = asyncio.run(main())
    assert groups[0] is not None and groups == [groups[0]] * 3 and tr.group is None
    assert info["weight_version"] == "3"
    assert_every_token_is_its_version_s(runs, 300, 3, hf_model, perturbed)


@pytest.mark.parametrize("damage", ["nan", "wrong-shape", "unknown-name"])
def test_broken_weights_by_broadcast_are_refused_and_the_group_stays_in_step(damage, vllm_server, tiny_model_dir):
    """The worker receives every byte of a broadcast, then checks it before loading any: each
    damage is refused naming the tensor, the server goes on sampling what it sampled before at
    the same version, and a good update goes through on the same group."""
    weights = load_file(tiny_model_dir / "model.safetensors")
    name = "model.layers.0.mlp.up_proj.weight"
    t = weights[name]
    if damage == "nan":
        weights[name] = t.clone().index_fill_(0, torch.tensor([3]), float("nan"))
    elif damage == "wrong-shape":
        weights[name] = torch.zeros(t.shape[0] + 1, t.shape[1])
    else:
        weights["model.layers.0.mlp.extra.weight"] = weights.pop(name)
    expected = {"nan": f"tensor {name!r} holds non-finite values",
                "wrong-shape": f"tensor {name!r} has shape [{t.shape[0] + 1}, {t.shape[1]}], the served",
                "unknown-name": "tensor 'model.layers.0.mlp.extra.weight' is not in the served checkpoint"}[damage]
    tr = DistributedTransport(master_address="127.0.0.1", backend="gloo", timeout_s=120)
    good = staged_from(tiny_model_dir, bucket_bytes=1 << 30)

    async def main():
        async with RemoteEngine(vllm_server.url, api_key=vllm_server.key) as engine:
            greedy = SamplingParams(max_new_tokens=10, temperature=0)
            before = await engine.generate(PROMPTS[2], greedy)
            await engine.pause()
            try:
                await tr.send(engine, good, 1)  # forms the group
                group = tr.group
                names = list(weights)
                with pytest.raises(RequestRejected, match=re.escape(expected)):
                    await asyncio.gather(
                        engine.update_weights_from_distributed(
                            names, [str(x.dtype).removeprefix("torch.") for x in weights.values()],
                            [list(x.shape) for x in weights.values()], group_name=tr.group_name, version=2,
                            load_format="flattened_bucket"),
                        asyncio.to_thread(group.broadcast, [torch.cat([x.reshape(-1).view(torch.uint8)
                                                                        for x in weights.values()])]))
                refused_at = engine.version
                await tr.send(engine, good, 3)  # every byte was received: the group is still in step
                assert tr.group is group
            finally:
                await tr.close(engine)
                await engine.resume()
            after = await engine.generate(PROMPTS[2], greedy)
            served = (await weight_info(vllm_server))["weight_version"]
            await engine.pause()  # version 0 back, for the other tests
            await engine.update_weights(str(tiny_model_dir), 0)
            await engine.resume()
            return before, after, refused_at, served

    before, after, refused_at, served = asyncio.run(main())
    assert refused_at == 1 and served == "3"
    assert after.tokens == before.tokens and after.versions == [3] * len(after.tokens)
    assert after.logprobs == pytest.approx(before.logprobs, abs=1e-5)


def test_broadcast_weights_need_agentrl_s_worker_extension(vllm_server):
    """What a vLLM server started without agentrl's worker extension answers is turned into one
    line saying what to start it with (checked against the same server, asking for a worker
    method it does not have)."""
    async def main():
        async with RemoteEngine(vllm_server.url, api_key=vllm_server.key) as engine:
            await (await engine._resolve())._worker_calls("agentrl_no_such_method", [{}])

    with pytest.raises(RequestRejected, match="run without agentrl's worker extension.*--worker-extension-cls"):
        asyncio.run(main())


async def until_tokens(engine: RemoteEngine, server, n: int) -> None:
    """Until the server has produced ``n`` more tokens (vLLM's Prometheus counter)."""
    url = server.url
    async with httpx.AsyncClient(timeout=10, headers=server.auth) as http:
        def count(text: str) -> float:
            return sum(float(line.split()[-1]) for line in text.splitlines()
                       if line.startswith("vllm:generation_tokens_total"))
        start = count((await http.get(url + "/metrics")).text)
        async with asyncio.timeout(60):
            while True:
                if count((await http.get(url + "/metrics")).text) - start >= n:
                    return
                await asyncio.sleep(0.02)


@pytest.mark.parametrize("damage", ["truncated", "wrong-shape", "nan", "missing-tensor", "no-files"])
def test_broken_weights_are_refused_and_the_old_ones_keep_serving(damage, vllm_server, tiny_model_dir, tmp_path):
    """vLLM loads whatever it is given (a missing file ends the server), so the client checks
    a checkpoint against the served one first: each damage is refused in one line naming it,
    and the server goes on sampling what it sampled before, at the same version."""
    bad = tmp_path / "bad"
    shutil.copytree(tiny_model_dir, bad)
    path = bad / "model.safetensors"
    weights = load_file(path)
    name = "model.layers.0.mlp.up_proj.weight"
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:-1000])
    elif damage == "wrong-shape":
        save_file({**weights, name: weights[name][:-1]}, path)
    elif damage == "nan":
        save_file({**weights, name: weights[name].clone().index_fill_(0, torch.tensor([3]), float("nan"))}, path)
    elif damage == "missing-tensor":
        save_file({k: v for k, v in weights.items() if k != name}, path)
    else:
        path.unlink()
    expected = {"truncated": "truncated", "wrong-shape": "the served model's is", "nan": "non-finite",
                "missing-tensor": "lacks", "no-files": "no [*].safetensors"}[damage]

    async def main():
        async with RemoteEngine(vllm_server.url, api_key=vllm_server.key) as engine:
            greedy = SamplingParams(max_new_tokens=10, temperature=0)
            before = await engine.generate(PROMPTS[2], greedy)
            await engine.pause()
            try:
                with pytest.raises(RequestRejected, match=expected):
                    await engine.update_weights(str(bad), 7)
            finally:
                await engine.resume()
            after = await engine.generate(PROMPTS[2], greedy)
            return before, after, engine.version

    before, after, version = asyncio.run(main())
    assert after == before and version == 0
    assert httpx.get(vllm_server.url + "/weight_info", headers=vllm_server.auth).json()["weight_version"] in ("default", "0")


def test_what_vllm_cannot_do_is_refused_by_name():
    with pytest.raises(RequestRejected, match="stop_regex"):
        sampling_params(SamplingParams(stop_regex=["x+"]))
    sp = sampling_params(SamplingParams(min_new_tokens=2, repetition_penalty=1.1, seed=3, logit_bias={5: -1.0}))
    assert sp["min_tokens"] == 2 and sp["repetition_penalty"] == 1.1 and sp["seed"] == 3
    assert sp["logit_bias"] == {"5": -1.0} and sp["logprobs"] == 0


def test_a_good_checkpoint_passes_the_check(tiny_model_dir, perturbed, caplog):
    assert check_checkpoint(perturbed, tiny_model_dir) is None
    with caplog.at_level("WARNING"):  # a served model on another machine: compared with nothing, still read
        assert check_checkpoint(perturbed, "/nonexistent/served/elsewhere") is None
    assert "not a directory this process can read" in caplog.text


def test_the_gateway_over_vllm_with_the_openai_sdk(vllm_server, tiny_model_dir, tmp_path):
    """`agentrl gateway --upstream` a vLLM server: the unmodified SDK converses, and each call's
    recorded tokens decode to what the SDK received, with the loss mask on the sampled ones."""
    admin = "admin-key-for-vllm-tests"
    cmd = [os.path.join(os.path.dirname(sys.executable), "agentrl"), "gateway", "--model", str(tiny_model_dir),
           "--upstream", vllm_server.url, "--port", "0", "--api-key", admin, "--out", str(tmp_path / "out"),
           "--served-model-name", "tiny"]
    renderer = ChatRenderer(tiny_model_dir)
    upstream_key = {**os.environ, "AGENTRL_SERVE_API_KEY": vllm_server.key}  # the gateway sends it upstream
    with ServiceProcess(cmd, ready="agentrl gateway: ready on ", env=upstream_key) as gateway:
        session = httpx.post(f"{gateway.url}/v1/sessions", headers={"Authorization": f"Bearer {admin}"},
                             json={}).json()
        client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
        messages = [{"role": "user", "content": "What is 12+30?"}]
        received = []
        for _ in range(2):
            r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=40, temperature=0.7,
                                               seed=11)
            received.append(r.choices[0].message.content or "")
            messages += [{"role": "assistant", "content": received[-1]}, {"role": "user", "content": "Sure?"}]
        ended = httpx.post(f"{gateway.url}/v1/sessions/{session['session_id']}/end",
                           headers={"Authorization": f"Bearer {session['api_key']}"},
                           json={"return_trajectories": True, "style": "individual"}).json()
    calls = ended["trajectories"]
    assert len(calls) == 2, json.dumps(ended)[:500]
    for t, content in zip(calls, received, strict=True):
        [(start, end)] = sampled_spans(t["loss_mask"])
        assert end == len(t["input_ids"])
        assert renderer.decode(t["input_ids"][start:end], skip_special_tokens=True) == content


def test_the_dev_routes_a_run_needs_answer_only_its_key(vllm_server):
    """Issue 49: with ``VLLM_SERVER_DEV_MODE=1`` and no key, any local user reached
    ``/collective_rpc`` (another checkpoint loaded into the run's server) and
    ``/update_weight_version`` (stale samples labelled fresh). Every route but /health needs the key."""
    for route in ("/collective_rpc", "/update_weight_version", "/sleep", "/pause", "/weight_info", "/v1/models"):
        assert httpx.post(vllm_server.url + route, json={}).status_code == 401, route
    assert httpx.get(vllm_server.url + "/health").status_code == 200
    assert httpx.get(vllm_server.url + "/weight_info", headers=vllm_server.auth).status_code == 200
