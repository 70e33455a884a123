"""Weight updates over torch.distributed (SGLang's /init_weights_update_group,
/update_weights_from_distributed, /destroy_weights_update_group) on a real `agentrl serve`.

This test process is the trainer's rank 0 of a real gloo group with the server (rank 1): the
tensors travel by broadcast, the metadata over HTTP, through the same `DistributedTransport`
and `RemoteEngine` calls `agentrl train` makes."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import pytest
import torch
from safetensors.torch import load_file

from agentrl.api import SamplingParams
from agentrl.client import RemoteEngine
from agentrl.errors import RequestRejected
from agentrl.process.services import ServerProcess
from agentrl.trainer.publish import DistributedTransport, StagedTensors

PROMPT = [60, 124, 117, 115, 101, 114, 124, 62, 72, 105, 33]
GROUP = "agentrl_weights"


@pytest.fixture(scope="module")
def server(untrained_model_dir):
    """This module's own server (its weight groups and versions change in every test)."""
    with ServerProcess(untrained_model_dir, "--context-length", "512", "--max-running-requests", "16") as proc:
        yield proc.url


def outputs(url: str) -> tuple[list[int], list[int], list[float]]:
    """Greedy tokens, and a seeded sample at temperature 1 with its logprobs."""
    greedy = httpx.post(url + "/generate", timeout=60, json={
        "input_ids": PROMPT, "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}})
    sampled = httpx.post(url + "/generate", timeout=60, json={
        "input_ids": PROMPT, "return_logprob": True,
        "sampling_params": {"max_new_tokens": 12, "temperature": 1.0, "sampling_seed": 7, "ignore_eos": True}})
    assert greedy.status_code == sampled.status_code == 200, greedy.text + sampled.text
    triples = sampled.json()["meta_info"]["output_token_logprobs"]
    return greedy.json()["output_ids"], [t[1] for t in triples], [t[0] for t in triples]


def from_disk(url: str, model_dir, version: str) -> None:
    r = httpx.post(url + "/update_weights_from_disk", json={"model_path": str(model_dir), "weight_version": version},
                   timeout=60)
    assert r.status_code == 200 and r.json()["success"], r.text


def assert_serves_like_disk(url: str, model_dir, version: str | None = None) -> None:
    """The server is at ``version`` (when given) and serves exactly what ``model_dir`` loaded
    from disk serves: greedy tokens, seeded tokens and their logprobs."""
    if version is not None:
        assert httpx.get(url + "/model_info", timeout=10).json()["weight_version"] == version
    served = outputs(url)
    from_disk(url, model_dir, "disk")
    assert outputs(url) == served


def staged(model_dir, bucket_bytes: int, flat: bool = False) -> StagedTensors:
    """A checkpoint's tensors as the trainer stages them (name order, buckets of ``bucket_bytes``;
    ``flat``: each bucket as SGLang's flattened_bucket, one buffer of the tensors' bytes)."""
    buckets: list[list] = [[]]
    size = 0
    for name, t in load_file(model_dir / "model.safetensors").items():
        if buckets[-1] and size + t.numel() * 4 > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append((name, t))
        size += t.numel() * 4
    if not flat:
        return StagedTensors(buckets)
    return StagedTensors(buckets, [torch.cat([t.reshape(-1).view(torch.uint8) for _, t in b]) for b in buckets])


def transport() -> DistributedTransport:
    return DistributedTransport(master_address="127.0.0.1", backend="gloo", group_name=GROUP, timeout_s=60)


async def _send(url: str, tr: DistributedTransport, weights: StagedTensors, version: int) -> None:
    async with RemoteEngine(url) as engine:
        await _publish(engine, tr, weights, version)


async def _publish(engine: RemoteEngine, tr: DistributedTransport, weights: StagedTensors, version: int) -> None:
    """What WeightPublisher does on rank 0 with its transport: pause → send → continue."""
    await engine.pause()
    try:
        await tr.send(engine, weights, version)
    finally:
        await engine.resume()


@pytest.mark.parametrize("flat", [False, True], ids=["one-broadcast-per-tensor", "flattened-bucket"])
def test_a_broadcast_update_serves_what_the_same_weights_from_disk_serve(server, untrained_model_dir,
                                                                         second_model_dir, flat):
    from_disk(server, untrained_model_dir, "base")
    before = outputs(server)
    tr = transport()
    weights = staged(second_model_dir, bucket_bytes=200_000, flat=flat)
    assert len(weights.buckets) > 1  # one update in several requests
    asyncio.run(_send(server, tr, weights, 5))
    assert httpx.get(server + "/model_info", timeout=10).json()["weight_version"] == "5"
    broadcast = outputs(server)
    from_disk(server, second_model_dir, "disk")
    disk = outputs(server)
    assert broadcast[0] == disk[0] and broadcast[1] == disk[1]  # the same greedy and sampled tokens
    torch.testing.assert_close(torch.tensor(broadcast[2]), torch.tensor(disk[2]), rtol=0, atol=1e-5)
    assert broadcast[1] != before[1] or max(abs(a - b) for a, b in zip(broadcast[2], before[2], strict=True)) > 1e-3

    # the group stays open: a second update on it, back to the base weights, serves as they did
    asyncio.run(_send(server, tr, staged(untrained_model_dir, bucket_bytes=1 << 30, flat=flat), 6))
    after = outputs(server)
    assert after[:2] == before[:2]
    torch.testing.assert_close(torch.tensor(after[2]), torch.tensor(before[2]), rtol=0, atol=1e-5)
    asyncio.run(_close(server, tr))


async def _close(url: str, tr: DistributedTransport) -> None:
    async with RemoteEngine(url) as engine:
        await tr.close(engine)


def _bad(model_dir, how: str) -> tuple[list[tuple[str, torch.Tensor]], str]:
    tensors = list(load_file(model_dir / "model.safetensors").items())
    name = "model.layers.0.mlp.up_proj.weight"
    i = [n for n, _ in tensors].index(name)
    t = tensors[i][1]
    if how == "wrong-shape":
        tensors[i] = (name, torch.zeros(t.shape[0] + 1, t.shape[1]))
        return tensors, f"tensor {name!r} has shape ({t.shape[0] + 1}, {t.shape[1]}), expected {tuple(t.shape)}"
    if how == "nan":
        tensors[i] = (name, torch.full_like(t, float("nan")))
        return tensors, f"tensor {name!r} holds NaN or infinite values"
    tensors[i] = ("model.layers.0.mlp.extra.weight", t)
    return tensors, "tensor 'model.layers.0.mlp.extra.weight' is not part of the served architecture"


@pytest.mark.parametrize(("how", "flat"), [("wrong-shape", False), ("nan", False), ("unknown-name", False),
                                           ("wrong-shape", True), ("nan", True)])
def test_a_bad_update_is_a_400_naming_the_tensor_and_the_old_weights_keep_serving(server, untrained_model_dir,
                                                                                  second_model_dir, how, flat):
    from_disk(server, untrained_model_dir, "base")
    before = outputs(server)
    tr = transport()
    tensors, expected = _bad(second_model_dir, how)

    async def attempt() -> None:
        async with RemoteEngine(server) as engine:
            await tr.send(engine, staged(untrained_model_dir, 1 << 30), 1)  # forms the group
            group = tr.group
            names = [n for n, _ in tensors]
            dtypes = [str(t.dtype).removeprefix("torch.") for _, t in tensors]
            shapes = [list(t.shape) for _, t in tensors]
            sent = ([torch.cat([t.reshape(-1).view(torch.uint8) for _, t in tensors])] if flat
                    else [t for _, t in tensors])
            with pytest.raises(RequestRejected) as refused:
                await asyncio.gather(
                    engine.update_weights_from_distributed(names, dtypes, shapes, group_name=GROUP, version=9,
                                                           load_format="flattened_bucket" if flat else None),
                    asyncio.to_thread(group.broadcast, sent))
            assert refused.value.status_code == 400 and expected in str(refused.value), str(refused.value)
            # every tensor was received, so the group is still in step: a good update goes through on it
            await tr.send(engine, staged(untrained_model_dir, 1 << 30), 2)
            assert tr.group is group
            await tr.close(engine)

    asyncio.run(attempt())
    assert outputs(server) == before  # the refused tensors never served
    assert httpx.get(server + "/model_info", timeout=10).json()["weight_version"] == "2"


def test_destroy_then_init_again_and_a_group_left_out_of_step(server, untrained_model_dir, second_model_dir):
    from_disk(server, untrained_model_dir, "base")
    r = httpx.post(server + "/destroy_weights_update_group", json={"group_name": GROUP}, timeout=10)
    assert r.status_code == 400 and r.json() == {"success": False, "message": "The group to be destroyed does not exist."}
    tr = transport()

    async def scenario() -> None:
        async with RemoteEngine(server) as engine:
            await tr.send(engine, staged(second_model_dir, 1 << 30), 3)
            first_port = tr.group.store.port
            await tr.close(engine)
            assert tr.group is None
            # a new group (new port), the same name: init works again after destroy
            await tr.send(engine, staged(untrained_model_dir, 1 << 30), 4)
            assert tr.group is not None and tr.group.store.port != first_port
            # metadata that cannot be received (no such dtype): refused before receiving anything, so
            # the group is out of step and says so until it is destroyed and formed again
            with pytest.raises(RequestRejected, match="dtypes\\[0\\] must name a torch dtype"):
                await engine.update_weights_from_distributed(["model.norm.weight"], ["int99"], [[4]], group_name=GROUP)
            with pytest.raises(RequestRejected, match="out of step .* destroy it"):
                await engine.update_weights_from_distributed(["model.norm.weight"], ["float32"], [[4]],
                                                             group_name=GROUP)
            engine.needs_rejoin = True  # what the publisher does after a failed update
            await tr.send(engine, staged(second_model_dir, 1 << 30), 5)
            await tr.close(engine)

    asyncio.run(scenario())
    assert_serves_like_disk(server, second_model_dir, "5")


def test_init_refusals_name_the_field(server):
    base = {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2, "backend": "gloo"}
    for change, says in [({"backend": "nccl"}, "use backend 'gloo'"), ({"backend": "mpi"}, "backend must be one of"),
                         ({"rank_offset": 2}, "rank_offset 2 is outside world_size 2"),
                         ({"master_port": "x"}, "master_port is required")]:
        r = httpx.post(server + "/init_weights_update_group", json={**base, **change}, timeout=10)
        assert r.status_code == 400 and says in r.text, (change, r.text)
    r = httpx.post(server + "/update_weights_from_distributed", timeout=10,
                   json={"names": [], "dtypes": [], "shapes": [], "group_name": "nope"})
    assert r.status_code == 400 and "Please call `init_weights_update_group` first" in r.json()["message"]


def test_a_server_that_lost_the_broadcast_weights_waits_out_of_rotation_until_the_next_update(
        server, untrained_model_dir, second_model_dir):
    """Weights that came by broadcast cannot be re-sent to one server alone (the disk path re-loads
    the last checkpoint): a server found serving other weights — restarted, here played by a disk
    load — is kept from generating (paused with the others), and the next publish forms the group
    again with it and brings it back."""
    tr = transport()

    async def scenario() -> None:
        async with RemoteEngine(server) as engine:
            await _publish(engine, tr, staged(second_model_dir, 1 << 30, flat=True), 7)
            from_disk(server, untrained_model_dir, "restarted")  # it came back with other weights
            assert await engine.check_health() == {server: False}
            assert engine.needs_rejoin and engine.healthy_addresses() == []
            await _publish(engine, tr, staged(second_model_dir, 1 << 30, flat=True), 8)  # pause reaches it
            assert not engine.needs_rejoin and engine.healthy_addresses() == [server]
            await tr.close(engine)

    asyncio.run(scenario())
    assert_serves_like_disk(server, second_model_dir, "8")


# ---------------------------------------------------------------- overlapped updates (ours, not SGLang's)
# Against `agentrl serve` the transport broadcasts the buckets while the server generates
# ("agentrl_stage_only": received and checked into a staging copy) and the pause only covers
# /agentrl/commit_staged_weights, which swaps that copy in.


def _greedy(url: str, ids: list[int], n: int) -> list[int]:
    r = httpx.post(url + "/generate", timeout=60, json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def _generated(url: str) -> int:
    return httpx.get(url + "/server_info", timeout=10).json()["internal_states"][0]["num_generated_tokens"]


def test_a_bucket_is_received_while_the_server_goes_on_generating(server, untrained_model_dir, second_model_dir):
    """The receive runs on a worker thread: while a staged bucket waits for its broadcast, the
    engine and the event loop keep serving the old weights; only the commit changes them."""
    from_disk(server, untrained_model_dir, "1")
    before = outputs(server)
    tr = transport()
    weights = staged(second_model_dir, 1 << 30)
    (bucket,) = weights.buckets

    async def scenario() -> None:
        async with RemoteEngine(server) as engine, httpx.AsyncClient(timeout=60) as http:
            await tr._form(engine)
            assert tr.staging  # agentrl serve advertises it in /server_info
            names = [n for n, _ in bucket]
            receiving = asyncio.ensure_future(engine.update_weights_from_distributed(
                names, [str(t.dtype).removeprefix("torch.") for _, t in bucket], [list(t.shape) for _, t in bucket],
                group_name=GROUP, stage_only=True))
            await asyncio.sleep(0.5)  # the server now waits in the broadcast for its tensors
            assert not receiving.done()
            r = await http.post(server + "/generate", json={
                "input_ids": PROMPT, "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}})
            assert r.status_code == 200 and r.json()["output_ids"] == before[0]  # served meanwhile, old weights
            assert r.json()["meta_info"]["weight_version"] == "1"
            await asyncio.to_thread(tr.group.broadcast, [t for _, t in bucket])
            await receiving
            assert await asyncio.to_thread(outputs, server) == before  # staged is not served
            await engine.commit_staged_weights(GROUP, 2)
            assert engine.version == 2
            await tr.close(engine)

    asyncio.run(scenario())
    assert httpx.get(server + "/model_info", timeout=10).json()["weight_version"] == "2"
    committed = outputs(server)
    from_disk(server, second_model_dir, "disk")
    disk = outputs(server)
    assert committed[:2] == disk[:2]  # same greedy and seeded tokens as the same weights from disk
    torch.testing.assert_close(torch.tensor(committed[2]), torch.tensor(disk[2]), rtol=0, atol=1e-5)


@pytest.mark.parametrize("flat", [False, True], ids=["one-broadcast-per-tensor", "flattened-bucket"])
def test_an_overlapped_publish_switches_versions_exactly_at_the_commit(server, untrained_model_dir, second_model_dir,
                                                                      flat):
    """deliver (every bucket, generation going on) → pause → commit → continue, as the publisher
    runs it, with a long greedy request in flight: its tokens carry the old version up to the
    swap and the new one after, each from the weights of its version, and what the new weights
    serve afterwards equals the same weights loaded from disk."""
    from_disk(server, untrained_model_dir, "1")
    tr = transport()
    weights = staged(second_model_dir, bucket_bytes=200_000, flat=flat)
    assert len(weights.buckets) > 1

    async def scenario():
        async with RemoteEngine(server, version=1) as engine:
            await tr._form(engine)  # formed beforehand, so the request below outlives the delivery
            long = asyncio.ensure_future(engine.generate(PROMPT, SamplingParams(max_new_tokens=480, temperature=0,
                                                                                ignore_eos=True)))
            assert tr.staging
            await asyncio.to_thread(_wait_until_running, server)
            start = await asyncio.to_thread(_generated, server)
            await tr.deliver(engine, weights, 2)
            during = await asyncio.to_thread(_generated, server) - start
            assert engine.version == 1 and not long.done()
            await engine.pause()
            try:
                await tr.send(engine, weights, 2)
            finally:
                await engine.resume()
            assert engine.version == 2
            await tr.close(engine)
            return await long, during

    c, during = asyncio.run(scenario())
    assert during > 0  # tokens were generated while the buckets went over
    k = c.versions.index(2)
    assert k > 0 and c.versions == [1] * k + [2] * (480 - k) and len(c.tokens) == 480
    committed = outputs(server)  # several buckets staged, one swap: what the same weights from disk serve
    from_disk(server, second_model_dir, "disk")
    disk = outputs(server)
    assert committed[:2] == disk[:2]
    torch.testing.assert_close(torch.tensor(committed[2]), torch.tensor(disk[2]), rtol=0, atol=1e-5)
    from_disk(server, untrained_model_dir, "old")
    assert _greedy(server, PROMPT, k) == c.tokens[:k]  # the old weights up to the swap
    from_disk(server, second_model_dir, "new")
    assert _greedy(server, PROMPT + c.tokens[:k], 8) == c.tokens[k:k + 8]  # the new ones after it


def _wait_until_running(url: str) -> None:
    for _ in range(1000):
        if httpx.get(url + "/v1/loads", timeout=10).json()["loads"][0]["num_running_reqs"] > 0:
            return
        time.sleep(0.01)
    raise AssertionError("the request never started")


@pytest.mark.parametrize(("how", "flat"), [("nan", False), ("wrong-shape", True)])
def test_a_refused_delivery_drops_the_staged_weights_and_never_pauses(server, untrained_model_dir, second_model_dir,
                                                                      how, flat):
    from_disk(server, untrained_model_dir, "1")
    before = outputs(server)
    tensors, expected = _bad(second_model_dir, how)
    tr = transport()
    flat_bufs = [torch.cat([t.reshape(-1).view(torch.uint8) for _, t in tensors])] if flat else None
    bad = StagedTensors([staged(untrained_model_dir, 1 << 30).buckets[0], tensors], None)
    if flat:
        good = staged(untrained_model_dir, 1 << 30, flat=True)
        bad = StagedTensors([good.buckets[0], tensors], [good.flat[0], flat_bufs[0]])

    async def scenario() -> None:
        async with RemoteEngine(server, version=1) as engine:
            with pytest.raises(RequestRejected, match="staged so far are dropped") as refused:
                await tr.deliver(engine, bad, 2)
            assert expected in str(refused.value)
            assert tr.group is None  # disbanded: the next publish forms it again
            assert (await engine._http.get(server + "/ready", timeout=10)).status_code == 200  # never paused
            # a good publish afterwards goes through, overlapped again
            await tr.deliver(engine, staged(second_model_dir, 1 << 30, flat=flat), 3)
            await engine.pause()
            try:
                await tr.send(engine, staged(second_model_dir, 1 << 30, flat=flat), 3)
            finally:
                await engine.resume()
            await tr.close(engine)

    asyncio.run(scenario())
    assert httpx.get(server + "/model_info", timeout=10).json()["weight_version"] == "3"
    from_disk(server, untrained_model_dir, "1")
    assert outputs(server) == before  # the refused bucket never served (and the good one did not linger)


def test_commit_refusals_and_a_plain_update_drops_what_was_staged(server, untrained_model_dir, second_model_dir):
    from_disk(server, untrained_model_dir, "1")
    before = outputs(server)
    tr = transport()
    weights = staged(second_model_dir, 1 << 30)

    async def stage(engine: RemoteEngine) -> None:
        (bucket,) = weights.buckets
        await asyncio.gather(
            engine.update_weights_from_distributed(
                [n for n, _ in bucket], [str(t.dtype).removeprefix("torch.") for _, t in bucket],
                [list(t.shape) for _, t in bucket], group_name=GROUP, stage_only=True),
            asyncio.to_thread(tr.group.broadcast, [t for _, t in bucket]))

    async def scenario() -> None:
        async with RemoteEngine(server, version=1) as engine:
            await tr._form(engine)
            with pytest.raises(RequestRejected, match="Nothing is staged"):
                await engine.commit_staged_weights(GROUP, 2)
            # another update served between staging and commit: the commit is refused
            await stage(engine)
            await asyncio.to_thread(from_disk, server, untrained_model_dir, "1")
            with pytest.raises(RequestRejected, match="served weights changed"):
                await engine.commit_staged_weights(GROUP, 2)
            # a plain (SGLang) update drops what was staged and is swapped in on its own, as before
            await stage(engine)
            await tr.send(engine, staged(untrained_model_dir, 1 << 30), 4)
            with pytest.raises(RequestRejected, match="Nothing is staged"):
                await engine.commit_staged_weights(GROUP, 5)
            # the version goes with the commit, not with a staged bucket (refused before receiving)
            r = await engine._http.post(server + "/update_weights_from_distributed", json={
                "names": ["model.norm.weight"], "dtypes": ["float32"], "shapes": [[32]], "group_name": GROUP,
                "agentrl_stage_only": True, "weight_version": "6"})
            assert r.status_code == 400 and "go with /agentrl/commit_staged_weights" in r.json()["message"]
            await tr.close(engine)

    asyncio.run(scenario())
    assert httpx.get(server + "/model_info", timeout=10).json()["weight_version"] == "4"
    assert outputs(server) == before


class _SGLangLike(RemoteEngine):
    """A client of servers that cannot stage (SGLang): the transport must keep to SGLang's calls."""

    async def can_stage_weights(self) -> bool:
        return False

    async def commit_staged_weights(self, group_name: str, version: int) -> None:
        raise AssertionError("no commit route on SGLang")


def test_without_staging_every_bucket_goes_inside_the_pause(server, untrained_model_dir, second_model_dir):
    from_disk(server, untrained_model_dir, "1")
    tr = transport()
    weights = staged(second_model_dir, bucket_bytes=200_000)
    posted: list[dict] = []

    class Spy(httpx.AsyncHTTPTransport):  # what the server is sent
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.method == "POST":
                posted.append({"path": request.url.path, **json.loads(request.content)})
            return await super().handle_async_request(request)

    async def scenario() -> None:
        async with _SGLangLike(server, version=1, transport=Spy()) as engine:
            await tr.deliver(engine, weights, 2)
            assert not [p for p in posted if p["path"] == "/update_weights_from_distributed"]  # nothing before the pause
            await _publish(engine, tr, weights, 2)
            await tr.close(engine)

    asyncio.run(scenario())
    updates = [p for p in posted if p["path"] == "/update_weights_from_distributed"]
    assert len(updates) == len(weights.buckets) and not any("agentrl_stage_only" in p for p in updates)
    assert [p.get("weight_version") for p in updates] == [None] * (len(updates) - 1) + ["2"]
    assert_serves_like_disk(server, second_model_dir)


# ---------------------------------------------------------------- LoRA adapters by broadcast (ours)
# /agentrl/lora_adapter_from_distributed: an adapter's tensors under peft's names, with its config
# in the request, received into an adapter — merged into a staging copy of the base (committed
# by /agentrl/commit_staged_weights) or loaded by name — and checked as an adapter directory is.


def test_a_broadcast_adapter_is_checked_as_a_directory_is_and_merges_as_it_does(server, untrained_model_dir,
                                                                               random_adapter, tmp_path):
    from ..conftest import LORA_PROJECTIONS

    from_disk(server, untrained_model_dir, "1")
    before = outputs(server)
    adapter = random_adapter(untrained_model_dir, tmp_path / "adapter")
    tensors = list(load_file(adapter / "adapter_model.safetensors").items())
    config = {"peft_type": "LORA", "r": 8, "lora_alpha": 16.0, "target_modules": LORA_PROJECTIONS}
    tr = DistributedTransport(master_address="127.0.0.1", group_name=GROUP, timeout_s=60, adapters="merge")
    names = [n for n, _ in tensors]
    dtypes = ["float32"] * len(tensors)
    shapes = [list(t.shape) for _, t in tensors]

    async def scenario() -> None:
        async with RemoteEngine(server, version=1) as engine:
            # received, then refused, before any pause: a module the config does not target, a bad rank
            for lora_config, says in [
                    ({**config, "target_modules": ["q_proj"]}, "target_modules ['q_proj'] does not name"),
                    ({**config, "r": 4}, "lora_A of 'model.layers.0.mlp.down_proj.weight' has shape (8, 384), "
                                         "expected (4, 384) (r=4)")]:
                with pytest.raises(RequestRejected, match=re.escape(says)):
                    await tr.deliver(engine, StagedTensors([tensors], lora_config=lora_config), 2)
                assert (await engine._http.get(server + "/ready", timeout=10)).status_code == 200  # never paused
            # a config that is not a plain LoRA: refused before receiving (the group is then out of step)
            await tr._form(engine)
            with pytest.raises(RequestRejected, match="lora_config holds \\['use_dora'\\]"):
                await engine.stage_lora_adapter_from_distributed(names, dtypes, shapes, group_name=GROUP,
                                                                 config={**config, "use_dora": True})
            with pytest.raises(RequestRejected, match="out of step"):
                await engine.stage_lora_adapter_from_distributed(names, dtypes, shapes, group_name=GROUP,
                                                                 config=config)
            engine.needs_rejoin = True  # what the publisher does after a failed update
            # the adapter itself: merged while the server generates, served from the commit on
            await tr.deliver(engine, StagedTensors([tensors], lora_config=config), 3)
            info = (await engine._http.get(server + "/model_info", timeout=10)).json()
            assert info["weight_version"] == "1"  # staged, not served yet
            await _publish(engine, tr, StagedTensors([tensors], lora_config=config), 3)
            await tr.close(engine)
            # SGLang cannot take one: the transport says so before sending anything
            async with _SGLangLike(server, version=3) as sglang:
                with pytest.raises(RequestRejected, match="agentrl serve only .*transport: disk"):
                    await tr.deliver(sglang, StagedTensors([tensors], lora_config=config), 4)
                await tr.close(sglang)

    asyncio.run(scenario())
    # base + adapter, exactly as the same adapter directory merges from disk
    assert_serves_like_disk(server, adapter, "3")
    from_disk(server, untrained_model_dir, "1")
    assert outputs(server) == before  # the refused adapters never served, and the good one did not linger


def test_an_adapter_loaded_by_name_by_broadcast_serves_later_requests_and_a_server_without_it_waits(
        server, untrained_model_dir, random_adapter, tmp_path):
    """``adapters: load`` by broadcast: each publish loads ``agentrl-policy-v<N>`` before the pause
    and every later request names it, with version N on its tokens; it computes what the same
    directory loaded by name computes. A server found without it (restarted, here played by an
    unload) cannot be sent it alone: it waits out of rotation until the next publish."""
    from ..conftest import LORA_PROJECTIONS

    from_disk(server, untrained_model_dir, "1")
    adapter = random_adapter(untrained_model_dir, tmp_path / "adapter", seed=3)
    tensors = list(load_file(adapter / "adapter_model.safetensors").items())
    config = {"peft_type": "LORA", "r": 8, "lora_alpha": 16.0, "target_modules": LORA_PROJECTIONS}
    tr = DistributedTransport(master_address="127.0.0.1", group_name=GROUP, timeout_s=60, adapters="load")
    sampled = SamplingParams(max_new_tokens=12, temperature=1.0, seed=7, ignore_eos=True)

    async def publish(engine: RemoteEngine, version: int) -> None:
        st = StagedTensors([tensors], lora_config=config)
        await tr.deliver(engine, st, version)
        await _publish(engine, tr, st, version)

    async def scenario():
        async with RemoteEngine(server, version=1) as engine:
            await publish(engine, 2)
            served = await engine.generate(PROMPT, sampled)
            cards = (await engine._http.get(server + "/v1/models", timeout=10)).json()["data"][1:]
            r = await engine._http.post(server + "/unload_lora_adapter", json={"lora_name": "agentrl-policy-v2"})
            assert r.status_code == 200, r.text
            health = await engine.check_health()
            waiting = engine.needs_rejoin, engine.healthy_addresses()
            await publish(engine, 3)
            back = engine.needs_rejoin, engine.healthy_addresses(), await engine.generate(PROMPT, sampled)
            await tr.close(engine)
            r = await engine._http.post(server + "/load_lora_adapter", json={"lora_name": "dir", "lora_path": str(adapter)})
            assert r.status_code == 200, r.text
            by_dir = (await engine._http.post(server + "/generate", json={
                "input_ids": PROMPT, "lora_path": "dir", "return_logprob": True,
                "sampling_params": {"max_new_tokens": 12, "temperature": 1.0, "sampling_seed": 7, "ignore_eos": True}}
            )).json()["meta_info"]["output_token_logprobs"]
            await engine._http.post(server + "/unload_lora_adapter", json={"lora_name": "dir"})
            return served, cards, health, waiting, back, by_dir

    served, cards, health, waiting, back, by_dir = asyncio.run(scenario())
    assert [(c["id"], c["root"]) for c in cards] == [("agentrl-policy-v2", f"broadcast:{GROUP}")]
    assert served.versions == [2] * 12 and back[2].versions == [3] * 12
    assert served.tokens == [t[1] for t in by_dir] == back[2].tokens
    assert served.logprobs == [t[0] for t in by_dir]
    assert served.tokens != outputs(server)[1]  # the adapter changed what is sampled: the checks above could fail
    assert health == {server: False} and waiting == (True, [])
    assert back[:2] == (False, [server])
    assert httpx.get(server + "/model_info", timeout=10).json()["weight_version"] == "1"  # the base never changed
