"""Config loading: YAML + dotted overrides; every mistake is one line naming the key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pytest
import yaml

from agentrl.config import describe, load_config, option, save_config
from agentrl.errors import ConfigError


@dataclass
class OptimConfig:
    lr: float = option(1e-5, help="learning rate", gt=0)
    betas: list[float] = option([0.9, 0.999], help="AdamW betas")


@dataclass
class RunConfig:
    name: str = option("run", help="run name")
    steps: int = option(10, help="training steps", ge=1)
    device: Literal["cpu", "cuda"] = option("cpu", help="where to run")
    backend: str = option("local", help="sandbox backend", choices=["local", "docker"])
    seed: int | None = option(None, help="random seed; none = random")
    optim: OptimConfig = option(OptimConfig, help="optimizer")


def test_yaml_then_overrides(tmp_path):
    p = tmp_path / "run.yaml"
    p.write_text(yaml.safe_dump({"steps": 5, "optim": {"lr": 0.001}}))
    cfg = load_config(RunConfig, p, ["optim.lr=3e-4", "seed=7", "name=demo"])
    assert (cfg.steps, cfg.optim.lr, cfg.seed, cfg.name) == (5, 3e-4, 7, "demo")
    assert cfg.optim.betas == [0.9, 0.999]


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(RunConfig, None, ["steps=3"])
    path = save_config(cfg, tmp_path / "out" / "config.yaml")
    assert load_config(RunConfig, path) == cfg


def test_defaults_are_not_shared_between_instances():
    a, b = load_config(RunConfig), load_config(RunConfig)
    a.optim.betas.append(1.0)
    assert b.optim.betas == [0.9, 0.999]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["stpes=3"], "unknown config key 'stpes'; did you mean 'steps'?"),
        (["optim.lrr=1"], "unknown config key 'optim.lrr'; did you mean 'optim.lr'?"),
        (["steps=three"], "config key 'steps': expected an integer, got str 'three'"),
        (["steps=1.5"], "config key 'steps': expected an integer, got float 1.5"),
        (["steps=0"], "config key 'steps': got 0, expected a value >= 1"),
        (["optim.lr=-1"], "config key 'optim.lr': got -1.0, expected a value > 0"),
        (["device=tpu"], "config key 'device': got 'tpu', expected one of ['cpu', 'cuda']"),
        (["backend=dokcer"], "did you mean 'docker'?"),
        (["optim=3"], "config key 'optim': expected a section (mapping), got int 3"),
        (["optim.betas=0.9"], "config key 'optim.betas': expected a list"),
        (["steps"], "must look like key=value"),
        (["steps=true"], "config key 'steps': expected an integer, got bool True"),
    ],
)
def test_bad_values_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(RunConfig, None, overrides)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_bad_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(RunConfig, tmp_path / "missing.yaml")
    p = tmp_path / "list.yaml"
    p.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(RunConfig, p)
    p.write_text("steps: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(RunConfig, p)


def test_describe_lists_nested_keys_with_help():
    rows = {key: (default, help_) for key, _, default, help_ in describe(RunConfig)}
    assert rows["optim.lr"] == (1e-5, "learning rate")
    assert rows["steps"] == (10, "training steps")
