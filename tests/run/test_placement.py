"""``placement: auto`` picks colocated where the servers would share the trainer's GPU and
decoupled elsewhere (on a CPU too: measured faster there), and says why; colocated gives each
phase every core. The machine's cores and GPUs are faked: unit tests of the rule."""

from __future__ import annotations

import pytest
import torch

from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.run import run_config
from agentrl.run.run_config import RunConfig, apply_placement, choose_placement


def config(*overrides: str) -> RunConfig:
    return load_config(RunConfig, "examples/arith_grpo.yaml", list(overrides))


@pytest.mark.parametrize(("overrides", "placement", "why"), [
    ([], "decoupled", "a CPU"),
    (["rollout.source=gateway"], "decoupled", "rollout.source gateway"),
    (["inference.servers=[http://127.0.0.1:1]"], "decoupled", "inference.servers run elsewhere"),
    (["launcher=ray"], "decoupled", "launcher ray"),
    (["placement=colocated"], "colocated", "placement set"),
])
def test_auto_picks_by_the_machine_and_says_why(overrides, placement, why):
    got, reason = choose_placement(config(*overrides))
    assert got == placement and why in reason


@pytest.mark.parametrize(("gpus", "placement"), [(1, "colocated"), (2, "decoupled")])
def test_on_gpus_colocated_when_the_servers_would_share_the_trainers(monkeypatch, gpus, placement):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    assert choose_placement(config("device=cuda"))[0] == placement


def test_colocated_gives_each_phase_every_core(monkeypatch):
    monkeypatch.setattr(run_config, "usable_cores", lambda: 8)
    cfg = config("placement=colocated", "world_size=2", "inference.num_servers=2")
    line = apply_placement(cfg)
    assert (cfg.placement, cfg.threads, cfg.inference.threads) == ("colocated", 4, 4)
    assert "take turns, each with all 8 cores (threads=4, inference.threads=4)" in line
    cfg = config("placement=auto")
    assert apply_placement(cfg).startswith("placement decoupled (a CPU")
    assert (cfg.placement, cfg.threads, cfg.inference.threads) == ("decoupled", 1, 1)  # the YAML's, untouched
    with pytest.raises(ConfigError, match="'placement': colocated runs on one machine"):
        apply_placement(config("placement=colocated", "launcher=ray"))
