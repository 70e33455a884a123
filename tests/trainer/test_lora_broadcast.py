"""LoRA adapters over the distributed transport, against a real ``agentrl serve``: the actor (this
process as a 1-rank gloo group) broadcasts its adapter alone over a gloo group of its own with the
server, which merges it into its base (``adapters: merge``) or loads it by name (``load``). What
it serves then is what the merged checkpoint serves from disk; a request in flight across a
publish loses no token; a broken adapter is refused while the old weights keep serving. (The
disk transport's LoRA tests are in test_lora.py; a whole ``agentrl train`` in tests/run/test_train.py.)"""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from agentrl.api import SamplingParams
from agentrl.trainer.actor import Actor
from agentrl.trainer.checkpoint import export_adapter

from ..serving import until_generating
from .test_lora import PROMPT, _batch, _config

LONG = 300
GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)
# greedy answers carry the log-probability of the one-hot choice (0); a seeded sample at
# temperature 1 carries the model's own, which is what is compared
SAMPLED = SamplingParams(max_new_tokens=24, temperature=1.0, ignore_eos=True, seed=7)


async def _publish_across_a_request(publisher, engine, url: str, actor, version: int):
    """Publish ``version`` while a ``LONG``-token request runs; returns it and where ``version`` begins."""
    job = asyncio.create_task(engine.generate(PROMPT, SamplingParams(max_new_tokens=LONG, temperature=1.0,
                                                                     ignore_eos=True, seed=5)))
    await until_generating(url, min_tokens=20)
    await publisher.apublish(actor.model, version)
    out = await job
    return out, out.versions.index(version) if version in out.versions else -1


def test_a_broadcast_adapter_serves_what_its_merged_checkpoint_serves_from_disk(group, small_model, tmp_path):
    """``merge``, then ``load``, on one server: each publish moves the adapter's bytes alone;
    base + adapter by broadcast gives the merged checkpoint's greedy tokens and log-probabilities
    (1e-5); a request in flight across a publish keeps every token, each tagged with its version."""
    from safetensors.torch import load_file

    from agentrl.client.remote_engine import RemoteEngine
    from agentrl.errors import RequestRejected
    from agentrl.process.services import ServerProcess
    from agentrl.trainer.lora import merge_adapter
    from agentrl.trainer.publish import DistributedTransport, WeightPublisher

    actor = Actor(small_model, _config())

    async def scenario(url: str):
        async with RemoteEngine([url], timeout=120) as engine, httpx.AsyncClient(timeout=60) as client:
            async def both():
                return await engine.generate(PROMPT, GREEDY), await engine.generate(PROMPT, SAMPLED)

            async def served_version():
                return (await client.get(url + "/model_info")).json()["weight_version"]

            found = {"base": await both()}
            # merged in the pause here (overlap false); before it in tests/inference/test_weight_sync.py and a run
            merge = DistributedTransport(master_address="127.0.0.1", group_name="merged", adapters="merge",
                                         overlap=False, timeout_s=60)
            publisher = WeightPublisher(merge, engine)
            actor.train_step(_batch(actor.config, 0))
            await publisher.apublish(actor.model, 1)
            actor.train_step(_batch(actor.config, 1))
            found["merge_interrupted"] = await _publish_across_a_request(publisher, engine, url, actor, 2)
            found["merge"] = await both()
            found["staged"] = merge.stage(actor.model, 2)  # what each publish broadcast
            found["merge_version"] = await served_version()
            await merge.close(engine)

            # the merged checkpoint of the same adapter, from disk
            adapter = export_adapter(actor.model, tmp_path / "adapter")
            merged = merge_adapter(adapter, tmp_path / "merged", base_dir=small_model)
            await engine.update_weights(str(merged), 3)
            found["disk"] = await both()

            await engine.update_weights(str(small_model), 4)  # the base again; now by name
            load = DistributedTransport(master_address="127.0.0.1", group_name="by_name", adapters="load", timeout_s=60)
            publisher = WeightPublisher(load, engine)
            await publisher.apublish(actor.model, 5)
            found["load"] = await both()
            actor.train_step(_batch(actor.config, 2))
            found["load_interrupted"] = await _publish_across_a_request(publisher, engine, url, actor, 6)
            found["names"] = [c["id"] for c in (await client.get(url + "/v1/models")).json()["data"][1:]]
            found["load_version"] = await served_version()

            # a broken adapter is refused, in either mode; what was served goes on
            lora_b = next(p for n, p in actor.model.named_parameters() if ".lora_B." in n)
            with torch.no_grad():
                kept, lora_b.data[0, 0] = lora_b.data[0, 0].item(), float("nan")
            for transport, version in ((load, 7), (merge, 8)):
                with pytest.raises(RequestRejected, match="NaN"):
                    await WeightPublisher(transport, engine).apublish(actor.model, version)
            with torch.no_grad():
                lora_b.data[0, 0] = kept
            found["after_refusal"] = await both()
            found["names_after"] = [c["id"] for c in (await client.get(url + "/v1/models")).json()["data"][1:]]
            await load.close(engine)
            return found, load_file(adapter / "adapter_model.safetensors")

    with ServerProcess(small_model, "--context-length", "512", "--weight-version", "0") as proc:
        found, on_disk = asyncio.run(scenario(proc.url))

    # only the adapter's bytes moved: peft's tensors, as export_adapter writes them
    staged = found["staged"]
    assert staged.lora_config == {"peft_type": "LORA", "r": 4, "lora_alpha": 8.0, "use_rslora": False,
                           "target_modules": sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                     "down_proj"])}
    assert sorted(n for b in staged.buckets for n, _ in b) == sorted(on_disk)
    assert staged.nbytes == sum(t.numel() * t.element_size() for t in on_disk.values())
    # a full publish moves the base's bytes; the adapter is r (in + out) per in x out projection:
    # a quarter of them in this 32-wide model at r = 4, a few thousandths in a 4096-wide one at r = 8
    model_bytes = sum(p.numel() * p.element_size() for n, p in actor.model.named_parameters() if "lora_" not in n)
    assert staged.nbytes < model_bytes / 6, (staged.nbytes, model_bytes)

    # merged by broadcast, loaded by name by broadcast, merged from disk: the same tokens and log-probabilities
    (gm, sm), (gd, sd), (gl, sl) = found["merge"], found["disk"], found["load"]
    assert gm.tokens == gd.tokens == gl.tokens and sm.tokens == sd.tokens == sl.tokens
    assert gm.versions == sm.versions == [2] * 24 and gl.versions == sl.versions == [5] * 24
    torch.testing.assert_close(torch.tensor(sm.logprobs), torch.tensor(sd.logprobs), rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.tensor(sl.logprobs), torch.tensor(sd.logprobs), rtol=0, atol=1e-5)
    # ... which the base model does not give (the checks above could fail)
    assert (torch.tensor(found["base"][1].logprobs) - torch.tensor(sm.logprobs)).abs().max() > 1e-3

    # a request in flight across each publish: every token, tagged with the version that made it
    for key, old, new in (("merge_interrupted", 1, 2), ("load_interrupted", 5, 6)):
        out, k = found[key]
        assert out.finish_reason == "length" and len(out.tokens) == LONG, key
        assert 20 <= k < LONG and out.versions == [old] * k + [new] * (LONG - k), (key, k)
    # merged: the server's weights moved to each version; by name, its weights stayed the base's
    assert found["merge_version"] == "2" and found["load_version"] == "4"
    assert found["names"] == ["agentrl-policy-v5", "agentrl-policy-v6"]
    # the refused adapters left what was served: adapter 6 by name, on every later request
    assert found["names_after"] == found["names"]
    assert found["after_refusal"][1].versions == [6] * 24
    assert found["after_refusal"][1].tokens != sl.tokens or found["after_refusal"][1].logprobs != sl.logprobs
