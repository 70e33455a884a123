"""LoRA in the actor (this process as a 1-rank gloo group): only the adapters train, and the
adapter a checkpoint writes is peft's own — ``PeftModel.from_pretrained`` computes what the
trainer does. (The two-rank run and --resume are in tests/run/test_train.py.)"""

from __future__ import annotations

import pytest
import torch

from agentrl.cli import main as cli_main
from agentrl.errors import CheckpointError, ConfigError, ModelError
from agentrl.trainer.actor import Actor
from agentrl.trainer.batch import prepare_batch
from agentrl.trainer.checkpoint import load_checkpoint, save_checkpoint
from agentrl.trainer.lora import find_adapter
from agentrl.trainer.publish import DistributedTransport
from agentrl.trainer.trainer_config import LoraConfig, TrainerConfig, WeightSyncConfig

from .dist_worker import make_trajectories

LORA = LoraConfig(rank=4, alpha=8.0)


def _config(**kw):
    base = dict(lr=2e-2, num_mini_batches=2, micro_batch_tokens=4096, seed=0, lora=LORA)
    return TrainerConfig(**{**base, **kw})


def _named(actor):
    return {k: v.full_tensor().detach().clone() for k, v in actor.model.state_dict().items()}


def _batch(config, step=0):
    return prepare_batch(make_trajectories(step, 0), version=0, config=config)


def test_only_the_adapters_get_gradients_and_optimizer_state(group, small_model):
    actor = Actor(small_model, _config())
    before = _named(actor)
    adapters = {k for k in before if ".lora_A." in k or ".lora_B." in k}
    # q, k, v, o, gate, up, down in each of the 2 layers, A and B each
    assert len(adapters) == 2 * 7 * 2
    for step in range(2):
        stats = actor.train_step(_batch(actor.config, step))
        assert stats["optimizer_steps"] == 2 * (step + 1) and stats["skipped_steps"] == 0
    after = _named(actor)
    for k in before:
        if k in adapters:
            continue
        assert torch.equal(after[k], before[k]), f"{k} is outside the adapters and changed"
    assert all(not torch.equal(after[k], before[k]) for k in adapters if ".lora_B." in k)
    # AdamW holds state for the adapters' parameters and nothing else
    trainable = {id(p) for p in actor.model.parameters() if p.requires_grad}
    state = actor.optimizer.state
    assert len(state) == len(adapters) and {id(p) for p in state} == trainable
    assert sum(len(g["params"]) for g in actor.optimizer.param_groups) == len(adapters)


def test_a_checkpoint_holds_a_peft_adapter_that_computes_what_the_trainer_does(group, small_model, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    actor = Actor(small_model, _config())
    for step in range(2):
        actor.train_step(_batch(actor.config, step))
    path = save_checkpoint(actor, tmp_path / "ckpt")
    assert sorted(p.name for p in (path / "adapter").iterdir()) == ["adapter_config.json",
                                                                     "adapter_model.safetensors"]
    # the shards hold the adapters (and their AdamW moments), not the frozen base
    from torch.distributed.checkpoint import FileSystemReader

    saved = FileSystemReader(str(path / "dcp")).read_metadata().state_dict_metadata
    weights = [k for k in saved if k.startswith("model.")]
    assert len(weights) == 2 * 7 * 2 and all(".lora_A." in k or ".lora_B." in k for k in weights), weights

    batch = _batch(actor.config, 2)
    ours = actor.compute_logprobs(batch)
    base = AutoModelForCausalLM.from_pretrained(str(small_model), dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, str(path / "adapter")).eval()
    for i in range(len(batch)):
        ids = batch.sequences[i]["input_ids"]
        with torch.no_grad():
            lp = peft_model(input_ids=ids[None]).logits[0, :-1].log_softmax(-1).gather(-1, ids[1:, None])[:, 0]
        torch.testing.assert_close(ours[i][1:], lp, rtol=0, atol=1e-5)
    # `agentrl model merge` (its entry point, in this process) on the checkpoint: a plain HF model that computes the same
    merged_dir = tmp_path / "merged"
    assert cli_main(["model", "merge", str(tmp_path / "ckpt"), "--out", str(merged_dir)]) == 0
    assert not list(merged_dir.glob("adapter*")) and (merged_dir / "tokenizer.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir), dtype=torch.float32).eval()
    for i in (0, 7):
        ids = batch.sequences[i]["input_ids"]
        with torch.no_grad():
            lp = merged(input_ids=ids[None]).logits[0, :-1].log_softmax(-1).gather(-1, ids[1:, None])[:, 0]
        torch.testing.assert_close(ours[i][1:], lp, rtol=0, atol=1e-5)
    with pytest.raises(ModelError, match="holds no LoRA adapter"):
        find_adapter(small_model)

    plain = AutoModelForCausalLM.from_pretrained(str(small_model), dtype=torch.float32).eval()
    ids = batch.sequences[0]["input_ids"]
    with torch.no_grad():  # the adapter changed the policy: the check above could fail
        lp0 = plain(input_ids=ids[None]).logits[0, :-1].log_softmax(-1).gather(-1, ids[1:, None])[:, 0]
    assert (lp0 - ours[0][1:]).abs().max() > 1e-3

    # restored into a fresh actor: the same policy, and the same next step
    again = Actor(small_model, _config())
    load_checkpoint(again, path)
    for i, lp in again.compute_logprobs(batch).items():
        assert torch.equal(lp, ours[i])
    s1, s2 = actor.train_step(batch), again.train_step(batch)
    assert s1["loss"] == s2["loss"]
    a, b = _named(actor), _named(again)
    assert all(torch.equal(a[k], b[k]) for k in a)

    with pytest.raises(CheckpointError, match="trainer.lora"):
        load_checkpoint(Actor(small_model, _config(lora=LoraConfig())), path)


def test_lora_settings_are_checked():
    with pytest.raises(ConfigError, match="lora.target_modules"):
        LoraConfig(rank=4, target_modules=["q_proj", "embed_tokens"])
    # an adapter goes over either transport (the broadcast: test_lora_broadcast.py)
    sync = TrainerConfig(lora=LORA, weight_sync=WeightSyncConfig(transport="distributed")).weight_sync
    assert sync.transport == "distributed" and sync.adapters == "auto"
    with pytest.raises(ValueError, match="adapters must be one of"):
        DistributedTransport(master_address="127.0.0.1", adapters="merged")


PROMPT = [1, 2, 3, 4, 5]
LONG = 500


def _teacher_forced(model_dir, tokens):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = torch.tensor([PROMPT + tokens])
    with torch.no_grad():
        logp = model(input_ids=ids).logits[0, :-1].log_softmax(-1)
    return logp.gather(-1, ids[0, 1:, None])[:, 0][len(PROMPT) - 1:]


async def _publish_twice_across_a_request(actor, publisher, engine, url: str):
    """Train and publish version 1; train again and publish version 2 while a ``LONG``-token
    request runs: it loses no token, and its tokens carry 1 up to the update, 2 after. Returns
    it and where version 2 begins."""
    import asyncio

    from agentrl.api import SamplingParams

    from ..serving import until_generating

    actor.train_step(_batch(actor.config, 0))
    await publisher.apublish(actor.model, 1)
    actor.train_step(_batch(actor.config, 1))
    job = asyncio.create_task(engine.generate(PROMPT, SamplingParams(max_new_tokens=LONG, temperature=1.0,
                                                                     ignore_eos=True, seed=5)))
    await until_generating(url, min_tokens=20)
    await publisher.apublish(actor.model, 2)
    out = await job
    assert out.finish_reason == "length" and len(out.tokens) == LONG
    k = out.versions.index(2)
    assert 20 <= k < LONG and out.versions == [1] * k + [2] * (LONG - k)
    return out, k


def test_agentrl_serve_merges_each_published_adapter_into_its_base(group, small_model, tmp_path):
    """The trainer publishes adapters only; the server serves base + the newest adapter — what
    the merged checkpoint serves when loaded from disk — a request interrupted by the update
    loses no token and carries each token's version, and a broken adapter is refused while the
    old weights keep serving."""
    import asyncio

    import httpx
    from safetensors.torch import load_file, save_file

    from agentrl.api import SamplingParams
    from agentrl.client.remote_engine import RemoteEngine
    from agentrl.errors import RequestRejected
    from agentrl.process.services import ServerProcess
    from agentrl.trainer.lora import merge_adapter
    from agentrl.trainer.publish import DiskTransport, WeightPublisher

    actor = Actor(small_model, _config())
    root = tmp_path / "weights"
    greedy = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)
    # greedy answers carry the log-probability of the one-hot choice (0); a seeded sample at
    # temperature 1 carries the model's own, which is what is compared
    sampled = SamplingParams(max_new_tokens=24, temperature=1.0, ignore_eos=True, seed=7)

    async def scenario(url: str):
        async with RemoteEngine([url], timeout=120) as engine:
            async def both():
                return await engine.generate(PROMPT, greedy), await engine.generate(PROMPT, sampled)

            publisher = WeightPublisher(DiskTransport(root, source_dir=small_model, keep_last=2), engine)
            interrupted = await _publish_twice_across_a_request(actor, publisher, engine, url)
            served = await both()
            merged = merge_adapter(root / "v000002", tmp_path / "merged", base_dir=small_model)
            await engine.update_weights(str(merged), 3)
            from_disk = await both()

            bad = tmp_path / "bad"
            bad.mkdir()
            (bad / "adapter_config.json").write_bytes((root / "v000002" / "adapter_config.json").read_bytes())
            tensors = load_file(root / "v000002" / "adapter_model.safetensors")
            name = next(k for k in tensors if "lora_B" in k)
            tensors[name][0, 0] = float("nan")
            save_file(tensors, bad / "adapter_model.safetensors")
            with pytest.raises(RequestRejected, match="NaN"):  # staged before a pause, as a LoRA run does
                await engine.stage_weights(str(bad))
            with pytest.raises(RequestRejected, match="NaN"):
                await engine.update_weights(str(bad), 4)
            async with httpx.AsyncClient(timeout=30) as client:
                info = (await client.get(url + "/model_info")).json()
            still = await both()

            # a staged adapter serves when the same path is updated, as reading it then would; a
            # staged copy of another path is dropped (the base is now the merged checkpoint)
            async with httpx.AsyncClient(timeout=60) as client:
                async def update(path, **extra):
                    r = await client.post(url + "/update_weights_from_disk", json={"model_path": str(path), **extra})
                    assert r.status_code == 200, r.text
                    return r.json()["message"]
                await update(root / "v000002", agentrl_stage_only=True)
                assert "staged before" in await update(root / "v000002", weight_version="5")
                restaged = await both()
                await update(root / "v000001", agentrl_stage_only=True)
                assert "staged before" not in await update(root / "v000002", weight_version="6")
                refreshed = await both()
                assert "staged before" not in await update(root / "v000001", weight_version="7")
            return interrupted, served, from_disk, info, still, restaged, refreshed

    with ServerProcess(small_model, "--context-length", "512", "--weight-version", "0") as proc:
        interrupted, served, from_disk, info, still, restaged, refreshed = asyncio.run(scenario(proc.url))

    # only the adapter went to disk, never the full weights
    for v in root.iterdir():
        assert sorted(p.name for p in v.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    # the same greedy tokens and log-probabilities as the merged checkpoint loaded from disk
    (g2, s2), (g3, s3) = served, from_disk
    assert g2.tokens == g3.tokens and s2.tokens == s3.tokens
    assert g2.versions == s2.versions == [2] * 24 and g3.versions == s3.versions == [3] * 24
    torch.testing.assert_close(torch.tensor(s2.logprobs), torch.tensor(s3.logprobs), rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.tensor(s2.logprobs), _teacher_forced(tmp_path / "merged", s2.tokens),
                               rtol=0, atol=1e-4)
    # ... which the base model does not give (the checks above could fail)
    assert (_teacher_forced(small_model, s2.tokens) - torch.tensor(s2.logprobs)).abs().max() > 1e-3
    # the interrupted request: every token, each from the weights its version names (v2 = base + adapter 2,
    # not adapter 1 merged on top of adapter 1)
    out, k = interrupted
    v1 = merge_adapter(root / "v000001", tmp_path / "merged1", base_dir=small_model)
    torch.testing.assert_close(torch.tensor(out.logprobs[:k]), _teacher_forced(v1, out.tokens)[:k], rtol=0, atol=1e-4)
    torch.testing.assert_close(torch.tensor(out.logprobs[k:]), _teacher_forced(tmp_path / "merged", out.tokens)[k:],
                               rtol=0, atol=1e-4)
    # the broken adapter was refused; version 3 kept serving
    assert info["weight_version"] == "3" and still[1].tokens == s3.tokens and still[1].logprobs == s3.logprobs
    # staged or read in the pause, the same weights: base (now the merged checkpoint) + adapter 2
    assert restaged[0].tokens == refreshed[0].tokens and restaged[1].logprobs == refreshed[1].logprobs
    assert restaged[1].versions == [5] * 24 and refreshed[1].versions == [6] * 24
    assert (torch.tensor(restaged[1].logprobs) - torch.tensor(s2.logprobs)).abs().max() > 1e-3


def test_adapters_published_by_name_serve_every_later_request(group, small_model, tmp_path):
    """``trainer.weight_sync.adapters: load`` (what a LoRA run does on SGLang), against agentrl
    serve's SGLang routes: each publish loads ``agentrl-policy-v<N>`` before the pause and, in it,
    every later request names it; a request interrupted by the update loses no token and carries
    each token's version; what it serves equals the same adapter merged (to 1e-5); adapters older
    than the previous one are unloaded."""
    import asyncio

    import httpx

    from agentrl.api import SamplingParams
    from agentrl.client.remote_engine import RemoteEngine
    from agentrl.process.services import ServerProcess
    from agentrl.trainer.publish import DiskTransport, WeightPublisher

    actor = Actor(small_model, _config())
    root = tmp_path / "weights"
    sampled = SamplingParams(max_new_tokens=24, temperature=1.0, ignore_eos=True, seed=7)
    body = {"input_ids": PROMPT, "return_logprob": True,
            "sampling_params": {"max_new_tokens": 24, "temperature": 1.0, "ignore_eos": True, "sampling_seed": 7}}

    async def scenario(url: str):
        async with RemoteEngine([url], timeout=120) as engine, httpx.AsyncClient(timeout=60) as client:
            async def names():
                return [c["id"] for c in (await client.get(url + "/v1/models")).json()["data"][1:]]

            publisher = WeightPublisher(DiskTransport(root, source_dir=small_model, adapters="load"), engine)
            await _publish_twice_across_a_request(actor, publisher, engine, url)  # adapter 1, then 2
            served = await engine.generate(PROMPT, sampled)
            held = await names()
            # the same adapter merged into the served weights (the other way agentrl serve takes one)
            r = await client.post(url + "/update_weights_from_disk", json={"model_path": str(root / "v000002")})
            assert r.status_code == 200, r.text
            merged = (await client.post(url + "/generate", json=body)).json()["meta_info"]["output_token_logprobs"]
            await client.post(url + "/update_weights_from_disk", json={"model_path": str(small_model)})
            base = (await client.post(url + "/generate", json=body)).json()["meta_info"]["output_token_logprobs"]
            actor.train_step(_batch(actor.config, 2))
            await publisher.apublish(actor.model, 3)
            return served, held, merged, base, await names(), engine.version

    with ServerProcess(small_model, "--context-length", "512", "--weight-version", "0") as proc:
        served, held, merged, base, later, version = asyncio.run(scenario(proc.url))

    assert served.versions == [2] * 24 and version == 3
    assert [t[1] for t in merged] == served.tokens
    torch.testing.assert_close(torch.tensor(served.logprobs), torch.tensor([t[0] for t in merged]), rtol=0, atol=1e-5)
    assert [t[1] for t in base] != served.tokens  # the adapter changed what is sampled: the checks above could fail
    assert held == ["agentrl-policy-v1", "agentrl-policy-v2"] and later == ["agentrl-policy-v2", "agentrl-policy-v3"]


def test_model_merge_never_removes_what_it_did_not_make(small_model, tmp_path):
    """Issue 49: ``--out`` was removed whatever it was, then the merge renamed into place —
    ``--out runs/`` deleted every run, ``--out RUN_DIR`` its checkpoints, ``--out`` the adapter or
    the base replaced what was read. Each is refused now, on copies here, with nothing lost; a
    non-empty target is replaced only with ``--force``."""
    import shutil

    from transformers import AutoModelForCausalLM

    from agentrl.trainer.lora import apply_lora

    base = shutil.copytree(small_model, tmp_path / "base")
    run = tmp_path / "runs" / "r1"
    adapter = run / "checkpoints" / "step_000002" / "trainer" / "adapter"
    wrapped = apply_lora(AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32), LORA)
    wrapped.save_pretrained(str(adapter))
    (run / "checkpoints" / "latest").write_text("step_000002")
    (run / "metrics.jsonl").write_text("{}\n")
    before = sorted(str(p) for p in tmp_path.rglob("*"))

    def merge(out, *extra):
        return cli_main(["model", "merge", str(run), "--out", str(out), *extra])

    for out in (tmp_path / "runs", run, adapter, adapter / "merged", base, tmp_path):
        assert merge(out) == 2, out
        assert merge(out, "--force") == 2, out  # --force replaces a stranger's directory, never an input
    assert cli_main(["model", "merge", str(run), "--out", ""]) == 2
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before

    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert merge(other) == 2 and (other / "notes.txt").read_text() == "mine"
    assert merge(other, "--force") == 0 and (other / "config.json").is_file() and not (other / "notes.txt").exists()
    assert merge(tmp_path / "fresh") == 0 and (tmp_path / "fresh" / "config.json").is_file()
    assert not list(tmp_path.glob(".*partial")) and sorted(str(p) for p in run.rglob("*")) == [
        p for p in before if p.startswith(f"{run}/")]


def test_model_merge_refuses_a_nan_adapter(small_model, tmp_path):
    """Issue 49: a NaN adapter merged into a NaN checkpoint (serve refuses the same adapter)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from agentrl.trainer.lora import apply_lora, merge_adapter

    adapter = tmp_path / "adapter"
    apply_lora(AutoModelForCausalLM.from_pretrained(str(small_model), dtype=torch.float32), LORA).save_pretrained(
        str(adapter))
    weights = load_file(adapter / "adapter_model.safetensors")
    name = next(k for k in weights if "lora_B" in k)
    save_file({**weights, name: torch.full_like(weights[name], float("nan"))}, adapter / "adapter_model.safetensors")
    with pytest.raises(ModelError, match="non-finite weights .*NaN or inf"):
        merge_adapter(adapter, tmp_path / "merged", base_dir=small_model)
    assert not (tmp_path / "merged").exists() and not list(tmp_path.glob(".merged*"))
