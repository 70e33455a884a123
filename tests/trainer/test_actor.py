"""The actor in this process as a 1-rank gloo group: invariances, skipped steps, loss settings.

(The 2-rank runs are in test_distributed.py; these are the cheap single-process checks.)
"""

from __future__ import annotations

import warnings

import pytest
import torch

from agentrl.trainer.actor import Actor
from agentrl.trainer.batch import prepare_batch
from agentrl.trainer.trainer_config import LossConfig, MismatchConfig, TrainerConfig

from .dist_worker import make_trajectories


def _config(**kw):
    base = dict(lr=1e-3, num_mini_batches=2, micro_batch_tokens=4096, seed=0)
    return TrainerConfig(**{**base, **kw})


def _weights(actor):
    return {k: v.full_tensor().detach().clone() for k, v in actor.model.state_dict().items()}


def _batch(config, step=0):
    return prepare_batch(make_trajectories(step, 0), version=0, config=config)


@pytest.mark.parametrize("attn", ["auto", "sdpa"])  # per-sequence SDPA; the explicit block mask
def test_logprobs_match_the_plain_hf_model(group, small_model, attn):
    from transformers import AutoModelForCausalLM

    actor = Actor(small_model, _config(micro_batch_tokens=50, attn_implementation=attn))
    assert actor.attn_implementation == {"auto": "sdpa_segments", "sdpa": "sdpa"}[attn]
    batch = _batch(actor.config)
    got = actor.compute_logprobs(batch)
    assert sorted(got) == list(range(len(batch)))
    ref = AutoModelForCausalLM.from_pretrained(str(small_model), dtype=torch.float32).eval()
    for i in (0, 5, 11):
        ids = batch.sequences[i]["input_ids"]
        with torch.no_grad():
            lp = ref(input_ids=ids[None]).logits[0, :-1].log_softmax(-1).gather(-1, ids[1:, None])[:, 0]
        torch.testing.assert_close(got[i][1:], lp, rtol=0, atol=1e-5)
        assert got[i][0] == 0.0


def test_micro_batch_split_does_not_change_the_step(group, small_model):
    """Packing into many small micro-batches (gradient accumulation) = one big micro-batch."""
    results = []
    for budget in (4096, 30):
        actor = Actor(small_model, _config(micro_batch_tokens=budget))
        stats = actor.train_step(_batch(actor.config))
        results.append((stats, _weights(actor)))
    (s1, w1), (s2, w2) = results
    assert s1["loss"] == pytest.approx(s2["loss"], rel=1e-5)
    assert s1["grad_norm"] == pytest.approx(s2["grad_norm"], rel=1e-5)
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-5, atol=1e-6, msg=k)


def test_sequence_level_objectives_do_not_depend_on_the_micro_batch_split(group, small_model):
    """Sequence-level ratios, sequence-level weights and sequence-mean aggregations see whole
    sequences in any packing (the pure functions' other kinds: tests/trainer/test_losses.py)."""
    loss = LossConfig(kind="gspo", aggregation="seq-mean-token-mean", mismatch=MismatchConfig(mode="tis", level="sequence"))
    results = []
    for budget in (4096, 30):
        actor = Actor(small_model, _config(micro_batch_tokens=budget, loss=loss))
        stats = actor.train_step(_batch(actor.config))
        results.append((stats, _weights(actor)))
    (s1, w1), (s2, w2) = results
    assert s1["loss"] == pytest.approx(s2["loss"], rel=1e-5)
    assert s1["grad_norm"] == pytest.approx(s2["grad_norm"], rel=1e-5) and s1["grad_norm"] > 0
    for key in ("mismatch/masked_frac", "mismatch/weight_std", "mismatch/weight_max", "clip_frac"):
        assert s1[key] == pytest.approx(s2[key], rel=1e-5, abs=1e-9), key
    # float32 sums in another order, through two AdamW steps at lr 1e-3 (an update of 1e-3 per weight)
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-5, atol=2e-5, msg=k)


def test_gradient_checkpointing_gives_the_same_step(group, small_model):
    a = Actor(small_model, _config())
    b = Actor(small_model, _config(gradient_checkpointing=True))
    sa, sb = a.train_step(_batch(a.config)), b.train_step(_batch(b.config))
    assert sa["loss"] == pytest.approx(sb["loss"], rel=1e-6)
    wa, wb = _weights(a), _weights(b)
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-5, atol=1e-6, msg=k)


def test_non_finite_gradient_skips_the_optimizer_step(group, small_model):
    actor = Actor(small_model, _config(num_mini_batches=1))
    before = _weights(actor)
    batch = _batch(actor.config)
    batch.sequences[3]["advantages"][-1] = float("nan")
    with pytest.warns(RuntimeWarning, match="gradient norm is nan"):
        stats = actor.train_step(batch)
    assert stats["skipped_steps"] == 1 and stats["optimizer_steps"] == 0
    for k, v in _weights(actor).items():
        assert torch.equal(v, before[k]), k
    stats = actor.train_step(_batch(actor.config, step=1))  # the next one goes through
    assert stats["skipped_steps"] == 0 and stats["optimizer_steps"] == 1


@pytest.mark.parametrize("kind", ["ppo", "reinforce"])
def test_other_loss_settings_train(group, small_model, kind):
    actor = Actor(small_model, _config(loss=LossConfig(kind=kind)))
    before = _weights(actor)
    stats = actor.train_step(_batch(actor.config))
    assert stats["optimizer_steps"] == 2 and torch.isfinite(torch.tensor(stats["loss"]))
    assert ("clip_frac" in stats) == (kind == "ppo")
    assert any(not torch.equal(v, before[k]) for k, v in _weights(actor).items())


def test_kl_penalty_against_the_frozen_reference(group, small_model):
    actor = Actor(small_model, _config(loss=LossConfig(kl_coef=0.5)))
    assert actor.ref_model is not None
    s1 = actor.train_step(_batch(actor.config))
    s2 = actor.train_step(_batch(actor.config, step=1))
    # the first mini-batch of step 1 is still at the reference weights (KL 0); later ones moved
    assert 0.0 <= s1["kl_ref"] < s2["kl_ref"]
    ref = actor.compute_logprobs(_batch(actor.config), reference=True)
    now = actor.compute_logprobs(_batch(actor.config))
    assert any((ref[i] - now[i]).abs().max() > 1e-4 for i in ref)


def test_an_empty_batch_changes_no_weight_but_counts_as_a_step(group, small_model):
    actor = Actor(small_model, _config())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        empty = prepare_batch([], version=0, config=actor.config)
    before = _weights(actor)
    with pytest.warns(RuntimeWarning, match="without loss tokens"):
        stats = actor.train_step(empty)
    assert stats["empty_batch"] == 1 and actor.version == 1 and actor.optimizer_steps == 0
    assert all(torch.equal(v, before[k]) for k, v in _weights(actor).items())


def test_lr_schedule_warmup_then_cosine(group, small_model):
    """The actor's schedule is agentrl.trainer.optim.warmup_cosine: total_steps counts the steps after warmup."""
    actor = Actor(small_model, _config(warmup_steps=3, total_steps=10, min_lr_ratio=0.1))
    f = actor.scheduler.lr_lambdas[0]
    assert [round(f(s), 4) for s in (0, 1, 2)] == [0.3333, 0.6667, 1.0]
    assert f(3) == pytest.approx(1.0) and f(8) == pytest.approx(0.55) and f(13) == pytest.approx(0.1)
    assert f(100) == pytest.approx(0.1)


def test_bfloat16_compute_keeps_float32_master_weights(group, small_model):
    """The mixed-precision path GPUs take by default, run on CPU: bf16 compute, fp32 weights."""
    actor = Actor(small_model, _config(dtype="bfloat16"))
    assert actor.compute_dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in actor.model.parameters())
    batch = _batch(actor.config)
    low = actor.compute_logprobs(batch)
    full = Actor(small_model, _config()).compute_logprobs(batch)
    for i in low:
        torch.testing.assert_close(low[i], full[i], rtol=0, atol=0.1)  # bf16 has 8 bits of mantissa
    before = _weights(actor)
    stats = actor.train_step(batch)
    assert stats["optimizer_steps"] == 2 and stats["skipped_steps"] == 0
    after = _weights(actor)
    assert all(v.dtype == torch.float32 for v in after.values())
    assert any(not torch.equal(v, before[k]) for k, v in after.items())


@pytest.mark.parametrize("minis", [1, 2])
def test_the_logged_samples_token_stats_are_those_before_the_update(group, small_model, minis):
    # one mini-batch: taken from the update's own forward pass (no pass of their own); two: a pass first
    actor = Actor(small_model, _config(num_mini_batches=minis))
    batch = _batch(actor.config)
    from agentrl.trainer.batch import TrainBatch

    expected = actor.compute_token_stats(TrainBatch(batch.sequences[:3], batch.version))
    before = _weights(actor)
    actor.train_step(batch, token_stats=3)
    assert any(not torch.equal(v, before[k]) for k, v in _weights(actor).items())  # it did update
    got = actor.last_token_stats
    assert sorted(got) == sorted(expected) == [0, 1, 2]
    for i, (lp, ent) in expected.items():
        torch.testing.assert_close(got[i][0], lp, atol=1e-5, rtol=0)
        torch.testing.assert_close(got[i][1], ent, atol=1e-5, rtol=0)
