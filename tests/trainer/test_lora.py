"""LoRA in the actor (this process as a 1-rank gloo group): only the adapters train, and the
adapter a checkpoint writes is peft's own — ``PeftModel.from_pretrained`` computes what the
trainer does. (The two-rank run and --resume are in tests/run/test_train.py.)"""

from __future__ import annotations

import pytest
import torch

from agentrl.errors import CheckpointError, ConfigError
from agentrl.trainer.actor import Actor
from agentrl.trainer.batch import prepare_batch
from agentrl.trainer.checkpoint import load_checkpoint, save_checkpoint
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
    with pytest.raises(ConfigError, match="weight_sync.transport"):
        TrainerConfig(lora=LORA, weight_sync=WeightSyncConfig(transport="distributed"))
