"""Muon's orthogonalization, its step size and the Muon/AdamW split of a model's weights."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainer.optim import Muon, MuonAdamW, orthogonalize


@pytest.mark.parametrize("shape", [(32, 96), (96, 32), (48, 48)])
def test_orthogonalize_pushes_every_singular_value_near_one(shape):
    g = torch.Generator().manual_seed(0)
    k = min(shape)
    u, _ = torch.linalg.qr(torch.randn(shape[0], k, generator=g))
    v, _ = torch.linalg.qr(torch.randn(shape[1], k, generator=g))
    m = u @ torch.diag(torch.logspace(-1, 1, k)) @ v.T  # singular values from 0.1 to 10
    out = orthogonalize(m)
    s = torch.linalg.svdvals(out)
    assert out.shape == m.shape and out.dtype == torch.float32
    assert s.min() > 0.5 and s.max() < 1.3, s
    # Same singular vectors: out is close to U V^T.
    assert torch.nn.functional.cosine_similarity((u @ v.T).flatten(), out.flatten(), dim=0) > 0.95


def test_orthogonalize_rejects_non_matrices():
    with pytest.raises(ValueError, match="2-D matrix"):
        orthogonalize(torch.ones(3))


def test_one_muon_step_moves_weights_by_about_the_adamw_rms():
    w = torch.nn.Parameter(torch.zeros(64, 256))
    w.grad = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    Muon([w], lr=1e-2, momentum=0.0).step()
    rms = w.detach().pow(2).mean().sqrt().item()
    assert 0.7 * 0.2e-2 < rms < 1.3 * 0.2e-2  # 0.2 * lr: what AdamW's first steps move by, roughly


def test_muon_minimizes_a_least_squares_problem():
    g = torch.Generator().manual_seed(2)
    x, target = torch.randn(256, 32, generator=g), torch.randn(32, 16, generator=g)
    y = x @ target
    w = torch.nn.Parameter(torch.zeros(32, 16))
    opt = Muon([w], lr=0.05)
    losses = []
    for _ in range(200):
        loss = (x @ w - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.05 * losses[0], losses[::20]


def test_muon_refuses_vectors_with_a_pointer_to_adamw():
    with pytest.raises(ValueError, match="2-D weights.*AdamW"):
        Muon([torch.nn.Parameter(torch.zeros(8))])


def test_muon_adamw_gives_hidden_matrices_to_muon_and_tied_embeddings_to_adamw():
    from transformers import AutoModelForCausalLM

    from agentrl.model.tinymodel import tiny_config

    model = AutoModelForCausalLM.from_config(tiny_config(hidden_size=32, num_layers=2))
    opt = MuonAdamW(model, lr=1e-3)
    muon = {id(p) for group in opt.muon.param_groups for p in group["params"]}
    adamw = {id(p) for group in opt.adamw.param_groups for p in group["params"]}
    embedding = model.get_input_embeddings().weight
    assert model.get_output_embeddings().weight is embedding  # tied
    assert id(embedding) in adamw and id(embedding) not in muon
    assert {id(p) for p in model.parameters()} == muon | adamw and not muon & adamw
    assert all(p.ndim == 2 for group in opt.muon.param_groups for p in group["params"])
    assert len(opt.param_groups) == 2
    for group in opt.param_groups:
        group["lr"] = 0.0  # one schedule drives both halves
    before = [p.detach().clone() for p in model.parameters()]
    model(input_ids=torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
