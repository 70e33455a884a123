"""The critic (agentrl.trainer.critic) in this process as a 1-rank gloo group: its values line up
with a plain HF value model's, GAE fills the batch, its update lowers the value loss, and a
checkpoint restores the value model and its optimizer exactly (the run's --resume:
tests/run/test_objectives_run.py)."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainer.actor import Actor
from agentrl.trainer.batch import TrainBatch, prepare_batch
from agentrl.trainer.checkpoint import load_checkpoint, save_checkpoint
from agentrl.trainer.critic import Critic
from agentrl.trainer.gae import gae
from agentrl.trainer.trainer_config import AdvantageConfig, CriticConfig, TrainerConfig

from .dist_worker import make_trajectories


def _config(**kw):
    base = dict(lr=1e-3, num_mini_batches=2, micro_batch_tokens=60, seed=0,
                advantages=AdvantageConfig(kind="gae"), critic=CriticConfig(lr=1e-2))
    return TrainerConfig(**{**base, **kw})


def _full(model):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return {k: v.clone() for k, v in get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)).items()}


@pytest.fixture(scope="module")
def pair(group, small_model):
    cfg = _config()
    actor = Actor(small_model, cfg)
    return actor, Critic(actor, cfg)


def test_values_are_a_plain_value_models_and_gae_fills_the_batch(pair):
    from transformers import AutoModelForTokenClassification

    actor, critic = pair
    batch = prepare_batch(make_trajectories(0, 0), version=0, config=critic.config)
    assert all(float(s["advantages"].abs().sum()) == 0 for s in batch.sequences)  # the critic's to fill
    stats = critic.assign_advantages(batch)
    plain = AutoModelForTokenClassification.from_pretrained(str(actor.model_dir), num_labels=1, dtype=torch.float32)
    plain.load_state_dict(_full(critic.model))
    plain.eval()
    for i, seq in enumerate(batch.sequences):
        with torch.no_grad():
            out = plain(input_ids=seq["input_ids"][None]).logits[0, :, 0]
        v = torch.cat([torch.zeros(1), out[:-1]])  # V of the state before each token: the previous position's output
        torch.testing.assert_close(critic.values[i], v * seq["loss_mask"], atol=1e-5, rtol=0)
        # γ = λ = 1 (the defaults): the reward minus the value, on every loss token
        reward = float(seq["token_rewards"].sum())
        on = seq["loss_mask"] > 0
        torch.testing.assert_close(seq["advantages"][on], reward - v[on], atol=1e-5, rtol=0)
        torch.testing.assert_close(critic.returns[i][on], torch.full((int(on.sum()),), reward), atol=1e-5, rtol=0)
        expected, _ = gae(seq["token_rewards"], v, seq["loss_mask"])
        torch.testing.assert_close(seq["advantages"], expected, atol=1e-5, rtol=0)
    assert stats["critic/adv_std"] > 0
    # no dropout before the head (HF's default 0.1): the update's forward sees the values GAE used,
    # and every rank computes the same ones (2 ranks had drifted from 1 with it)
    assert all(m.p == 0 for m in critic.model.modules() if isinstance(m, torch.nn.Dropout))
    empty = TrainBatch([], 0)  # every trajectory dropped (stale, failed): no pass, no step, no crash
    assert critic.assign_advantages(empty) == {} and critic.train_step(empty) == {}


def _value_error(critic, batch) -> float:
    """Mean |V - R| over the batch's loss tokens (γ = λ = 1: R is the reward, whatever V is)."""
    critic.assign_advantages(batch)
    n = sum(float(s["loss_mask"].sum()) for s in batch.sequences)
    return sum(float((critic.values[i] - critic.returns[i]).abs().sum()) for i in critic.values) / n


def test_the_update_lowers_the_value_loss_and_a_checkpoint_restores_it(pair, tmp_path):
    actor, critic = pair
    batch = prepare_batch(make_trajectories(1, 0), version=0, config=critic.config)
    before = _value_error(critic, batch)
    for _ in range(2):  # the same batch: the values move toward its returns
        critic.assign_advantages(batch)
        st = critic.train_step(batch)
    assert _value_error(critic, batch) < before
    assert st["critic/optimizer_steps"] == critic.optimizer_steps == 2 * 2  # two mini-batches a step
    save_checkpoint(critic, tmp_path / "critic")
    fresh = Critic(actor, critic.config)
    before = _full(fresh.model)
    assert any(not torch.equal(before[k], v) for k, v in _full(critic.model).items())  # it did move
    load_checkpoint(fresh, tmp_path / "critic")
    for k, v in _full(critic.model).items():
        assert torch.equal(_full(fresh.model)[k], v), k
    saved, restored = critic.optimizer.state_dict()["state"], fresh.optimizer.state_dict()["state"]
    assert saved.keys() == restored.keys() and len(saved) > 0
    for p in saved:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            a, b = saved[p][name], restored[p][name]
            a, b = (x.full_tensor() if hasattr(x, "full_tensor") else x for x in (a, b))
            assert torch.equal(a, b), (p, name)
    assert (fresh.optimizer_steps, fresh.version) == (critic.optimizer_steps, critic.version)


def test_a_lora_critic_trains_its_adapters_and_head_alone_and_a_checkpoint_restores_them(group, small_model, tmp_path):
    from agentrl.trainer.trainer_config import LoraConfig

    cfg = _config(lora=LoraConfig(rank=4))
    critic = Critic(Actor(small_model, cfg), cfg)
    trained = {n for n, p in critic.model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_" in n or ".modules_to_save." in n for n in trained)
    assert any("score" in n and ".modules_to_save." in n for n in trained)  # the new head trains in full
    frozen = {k: v for k, v in _full(critic.model).items() if k.removeprefix("base_model.model.").startswith("model.")
              and ".lora_" not in k}
    batch = prepare_batch(make_trajectories(1, 0), version=0, config=cfg)
    before = _value_error(critic, batch)
    for _ in range(2):
        critic.assign_advantages(batch)
        critic.train_step(batch)
    assert _value_error(critic, batch) < before
    after = _full(critic.model)
    assert all(torch.equal(after[k], v) for k, v in frozen.items())  # the body did not move
    save_checkpoint(critic, tmp_path / "critic")
    fresh = Critic(Actor(small_model, cfg), cfg)
    load_checkpoint(fresh, tmp_path / "critic")
    restored = _full(fresh.model)
    assert all(torch.equal(restored[k], v) for k, v in after.items())

