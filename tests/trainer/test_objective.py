"""trainer.loss.kind names a built-in objective or the user's own function; the mismatch
weights and the KL penalty wrap whichever it is."""

from __future__ import annotations

import textwrap

import pytest
import torch

from agentrl.errors import ConfigError
from agentrl.trainer.losses import aggregation_weights, decoupled_ppo_loss, kl_k3
from agentrl.trainer.objective import LossInputs, objective_loss, resolve_objective
from agentrl.trainer.trainer_config import LossConfig, MismatchConfig

LP = [-0.5, -1.0, -1.5, -0.3]
PROX = [-1.0, -1.0, -1.0, 0.0]
BEHAV = [-1.0, -2.0, -3.0, 0.0]
ADV = [1.0, -2.0, 0.5, 0.0]
MASK = [1.0, 1.0, 1.0, 0.0]


def inputs(lp=None):
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    mask, seg = t(MASK), torch.tensor([0, 0, 1, 1])
    return LossInputs(lp if lp is not None else t(LP), t(PROX), t(BEHAV), t(ADV), mask, seg,
                      aggregation_weights(mask, seg, aggregation="token-mean", total_loss_tokens=3),
                      total_loss_tokens=3)


USER_LOSS = '''
    import torch

    def sign_loss(inputs, config):
        """-A·log π on the loss tokens, scaled by the mismatch weights when there are some."""
        w = inputs.behaviour_weights if inputs.behaviour_weights is not None else inputs.loss_mask
        loss = (-inputs.advantages * inputs.logprobs * w * inputs.token_weights).sum()
        return loss, {"user/weighted_tokens": (w > 0).sum() / inputs.total_loss_tokens}

    not_a_function = 3
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_objectives.py").write_text(textwrap.dedent(USER_LOSS))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_objectives"


def test_a_user_function_is_the_objective_and_gets_the_mismatch_weights(user_module):
    cfg = LossConfig(kind=f"{user_module}:sign_loss", mismatch=MismatchConfig(mode="tis", upper=2.0))
    fn = resolve_objective(cfg.kind)
    lp = torch.tensor(LP, dtype=torch.float64, requires_grad=True)
    loss, st = objective_loss(inputs(lp), cfg, objective=fn)
    # ρ = e^(prox − behav) = (1, e, e^2) → min(ρ, 2) = (1, 2, 2): −(1·1·−0.5 + −2·2·−1 + 0.5·2·−1.5)/3 = −(0.5 + 4 − 1.5)/3
    assert loss.item() == pytest.approx(-(-0.5 + 4.0 - 1.5) / 3)
    assert st["user/weighted_tokens"].item() == pytest.approx(1.0)
    assert st["mismatch/truncated_frac"].item() == pytest.approx(2 / 3)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([-1 / 3, 4 / 3, -1 / 3, 0.0], dtype=torch.float64))


def test_the_kl_penalty_is_added_to_any_objective(user_module):
    ref = torch.tensor([-1.5, -1.0, -1.0, 0.0], dtype=torch.float64)
    cfg = LossConfig(kind=f"{user_module}:sign_loss", kl_coef=0.1)
    base, _ = objective_loss(inputs(), cfg)
    with_kl, st = objective_loss(inputs(), cfg, ref_logprobs=ref)
    kl = (kl_k3(torch.tensor(LP, dtype=torch.float64), ref) * torch.tensor(MASK, dtype=torch.float64)).sum() / 3
    assert with_kl.item() == pytest.approx(base.item() + 0.1 * kl.item())
    assert st["kl_ref"].item() == pytest.approx(kl.item(), rel=1e-6)


def test_a_builtin_kind_through_the_objective_is_its_pure_function():
    loss, _ = objective_loss(inputs(), LossConfig(kind="decoupled_ppo"))
    ref, _ = decoupled_ppo_loss(*(torch.tensor(x, dtype=torch.float64) for x in (LP, PROX, BEHAV, ADV, MASK)),
                                total_loss_tokens=3)
    assert loss.item() == pytest.approx(ref.item())


def test_bad_user_paths_say_what_is_wrong(user_module):
    with pytest.raises(ConfigError, match="trainer.loss.kind.*expected a function"):
        resolve_objective(f"{user_module}:not_a_function")
    with pytest.raises(ConfigError, match="trainer.loss.kind.*has no 'nope'"):
        resolve_objective(f"{user_module}:nope")
    with pytest.raises(ConfigError, match="trainer.loss.kind.*not found"):
        resolve_objective("no_such_module_here:loss")
