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
])
def test_bad_values_name_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(TrainerConfig, None, [override])
