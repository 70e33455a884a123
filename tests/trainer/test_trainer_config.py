"""TrainerConfig loads from dotted overrides and names the key when a value is wrong."""

from __future__ import annotations

import pytest

from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.trainer.trainer_config import TrainerConfig


def test_overrides_reach_nested_sections():
    cfg = load_config(TrainerConfig, None, ["lr=3e-4", "loss.kind=ppo", "loss.behaviour_weight_cap=null",
                                            "advantages.std_normalize=false"])
    assert (cfg.lr, cfg.loss.kind, cfg.loss.behaviour_weight_cap, cfg.advantages.std_normalize) == (
        3e-4, "ppo", None, False)


@pytest.mark.parametrize("override, match", [
    ("loss.kind=grpo", "loss.kind"),
    ("num_mini_batches=0", "num_mini_batches"),
    ("betas=[0.9]", "betas"),
    ("loss.eps_hihg=0.3", "did you mean"),
    ("loss.kind=gpso", "did you mean 'gspo'"),
    ("loss.aggregation=seq-mean-token-summ", "did you mean 'seq-mean-token-sum'"),
    ("advantages.kind=rlo", "did you mean 'rloo'"),
    ("loss.mismatch.mode=tiss", "did you mean 'tis'"),
])
def test_bad_values_name_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(TrainerConfig, None, [override])


def test_combinations_that_mean_nothing_are_refused():
    with pytest.raises(ConfigError, match="ppo anchors its ratio on π_behav"):
        load_config(TrainerConfig, None, ["loss.kind=ppo", "loss.mismatch.mode=tis"])
    with pytest.raises(ConfigError, match="overlong_buffer_tokens"):
        load_config(TrainerConfig, None, ["advantages.overlong_max_tokens=100", "advantages.overlong_buffer_tokens=100"])
    with pytest.raises(ConfigError, match="do not combine yet"):
        load_config(TrainerConfig, None, ["advantages.kind=gae", "distill.teacher.url=http://127.0.0.1:30100"])
    with pytest.raises(ConfigError, match="trainer.critic.value_clip|critic.value_clip"):
        load_config(TrainerConfig, None, ["advantages.kind=gae", "critic.value_clip=0"])
    cfg = load_config(TrainerConfig, None, ["advantages.kind=gae", "advantages.lam=0.95", "critic.lr=3e-6"])
    assert (cfg.advantages.lam, cfg.critic.lr, cfg.critic.model) == (0.95, 3e-6, None)
