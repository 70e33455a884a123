"""Config loading: YAML + dotted overrides; every mistake is one line naming the key."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Literal

import pytest
import yaml

from agentrl.config import add_arguments, describe, from_args, load_config, option, save_config
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


@dataclass
class SamplingConfig:
    temperature: float = option(1.0, help="softmax temperature", ge=0)
    max_new_tokens: int = option(256, help="tokens per call", ge=1)


@dataclass
class EvalConfig:
    sampling: SamplingConfig = option(SamplingConfig(temperature=0.0), help="greedy by default")


@dataclass
class Outer:
    eval: EvalConfig = option(EvalConfig, help="evaluation")


def test_a_section_given_in_part_keeps_its_default_instance():
    """Issue 22: ``eval.sampling.max_new_tokens=48`` filled the other sampling keys from
    SamplingConfig's own defaults, so greedy evaluation silently sampled at temperature 1.0."""
    cfg = load_config(Outer, None, ["eval.sampling.max_new_tokens=48"])
    assert (cfg.eval.sampling.temperature, cfg.eval.sampling.max_new_tokens) == (0.0, 48)
    assert load_config(Outer).eval.sampling.temperature == 0.0
    assert load_config(Outer, None, ["eval.sampling.temperature=0.7"]).eval.sampling.max_new_tokens == 256
    a, b = load_config(Outer), load_config(Outer)
    a.eval.sampling.temperature = 2.0  # the default instance is copied, never shared
    assert b.eval.sampling.temperature == 0.0 and Outer().eval.sampling.temperature == 0.0
    rows = {key: default for key, _, default, _ in describe(Outer)}
    assert rows["eval.sampling.temperature"] == 0.0  # --help-config shows the default in force


@dataclass
class ServerConfig:
    model: str = option(help="checkpoint directory")
    port: int = option(30000, help="port to listen on", ge=0, le=65535)
    timeout_s: float = option(600.0, help="idle seconds", gt=0, flag="--timeout")
    device: Literal["cpu", "cuda"] = option("cpu", help="where it runs")
    backend: str = option("local", help="backend", choices=("local", "docker"))
    limit: int | None = option(None, help="most requests; none: no limit", ge=1)
    no_cache: bool = option(False, help="compute every prompt in full")
    keep: bool = option(True, help="keep a cache")
    secret: str = option("", help="not a flag", cli=False)


def parser_of(cls) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="x")
    add_arguments(parser, cls)
    return parser


def test_flags_come_from_the_dataclass():
    parser = parser_of(ServerConfig)
    cfg = from_args(ServerConfig, parser.parse_args(["--model", "m"]))
    assert cfg == ServerConfig(model="m")
    cfg = from_args(ServerConfig, parser.parse_args(
        ["--model", "m", "--port", "0", "--timeout", "2.5", "--device", "cuda", "--backend", "docker",
         "--limit", "3", "--no-cache", "--no-keep"]), secret="k")
    assert (cfg.port, cfg.timeout_s, cfg.device, cfg.backend, cfg.limit, cfg.no_cache, cfg.keep, cfg.secret) == (
        0, 2.5, "cuda", "docker", 3, True, False, "k")
    text = parser.format_help()
    assert "--timeout TIMEOUT_S" in text and "--timeout-s" not in text and "--secret" not in text
    assert "port to listen on (default: 30000)" in text and "(default: None)" not in text


@pytest.mark.parametrize("argv, message", [
    ([], "the following arguments are required: --model"),
    (["--model", "m", "--device", "tpu"], "invalid choice: 'tpu'"),
    (["--model", "m", "--port", "x"], "invalid int value: 'x'"),
])
def test_flags_argparse_refuses(argv, message, capsys):
    with pytest.raises(SystemExit):
        parser_of(ServerConfig).parse_args(argv)
    assert message in capsys.readouterr().err


def test_flag_values_are_validated_like_config_keys():
    args = parser_of(ServerConfig).parse_args(["--model", "m", "--port", "70000"])
    with pytest.raises(ConfigError, match=r"^config key 'port': got 70000, expected a value <= 65535$"):
        from_args(ServerConfig, args)
    args = parser_of(ServerConfig).parse_args(["--model", "m", "--timeout", "0"])
    with pytest.raises(ConfigError, match="config key 'timeout_s': got 0.0, expected a value > 0"):
        from_args(ServerConfig, args)


def test_a_field_without_a_flag_type_must_say_so():
    with pytest.raises(TypeError, match=r"OptimConfig.betas: .* option\(..., cli=False\)"):
        parser_of(OptimConfig)


def test_rollout_dataset_is_said_to_be_needed_only_by_workflow_sources():
    """Issue 49: --help-config marked rollout.dataset required where source gateway needs none."""
    from agentrl.config import describe
    from agentrl.run.run_config import RunConfig

    [help_] = [h for key, _, _, h in describe(RunConfig) if key == "rollout.dataset"]
    assert "required with source workflow; source gateway and recorded steps need none" in help_
