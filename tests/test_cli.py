"""The CLI as a user types it: a real subprocess of the installed console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

AGENTRL = str(Path(sys.executable).parent / "agentrl")


def test_help_lists_subcommands_and_each_has_help():
    r = subprocess.run([AGENTRL, "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    block = r.stdout.split("  COMMAND\n", 1)[1].split("\n\n", 1)[0]
    listed = [line.split()[0] for line in block.splitlines() if line.startswith("    ") and line.split()]
    assert {"model", "serve", "sandbox", "envs"} <= set(listed), r.stdout
    for name in listed:
        sub = subprocess.run([AGENTRL, name, "--help"], capture_output=True, text=True, timeout=120)
        assert sub.returncode == 0 and "usage: agentrl" in sub.stdout, (name, sub.stderr)


def test_no_subcommand_prints_help_and_fails():
    r = subprocess.run([AGENTRL], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "usage: agentrl" in r.stdout


SURFACE = Path(__file__).parent / "data" / "cli_surface.json"


def help_flags(*command: str) -> set[str]:
    """The option strings ``agentrl COMMAND --help`` lists (each option line's names, metavars dropped)."""
    r = subprocess.run([AGENTRL, *command, "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (command, r.stderr)
    flags = set()
    for line in r.stdout.splitlines():
        if line.startswith("  -"):
            names = line.strip().split("  ", 1)[0]
            flags |= {part.split(" ", 1)[0] for part in names.split(", ")}
    return flags


def test_every_flag_and_config_key_of_before_the_restructuring_is_still_there():
    """Issue 22 moved and renamed modules and generated flags from the config dataclasses; the
    surface users type is what it was (``tests/data/cli_surface.json``, taken before the change).
    New flags and keys may be added; none may disappear."""
    before = json.loads(SURFACE.read_text())
    for path, flags in before["commands"].items():
        assert set(flags) <= help_flags(*path.split()[1:]), path
    r = subprocess.run([AGENTRL, "train", "--help-config"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    keys = {line.split()[0] for line in r.stdout.splitlines() if line and not line.startswith(" ")}
    assert set(before["run_config_keys"]) <= keys


def test_overrides_may_come_after_flags():
    """Issue 31: ``agentrl eval CONFIG --k 4 eval.limit=50`` said "unrecognized arguments"; the
    overrides now reach the config whatever their place (a misspelt key proves they arrived)."""
    r = subprocess.run([AGENTRL, "eval", "examples/arith_grpo.yaml", "--k", "4", "eval.limt=50"],
                       capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 2 and "did you mean 'eval.limit'" in r.stderr, r.stderr
    r = subprocess.run([AGENTRL, "model", "tiny", "--no-progress", "sft_steps=bogus", "--out", "/nonexistent/x"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "config key 'sft_steps'" in r.stderr, r.stderr
    r = subprocess.run([AGENTRL, "eval", "examples/arith_grpo.yaml", "--no-such-flag"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unrecognized arguments: --no-such-flag" in r.stderr, r.stderr


def test_serve_and_gateway_flags_are_their_configs_with_the_defaults_of_before():
    """Issue 22: ``agentrl serve`` and ``agentrl gateway`` declared their flags by hand beside
    ServeConfig, Gateway's keyword defaults and the run's gateway section; now the flags come
    from ServeConfig and GatewayConfig, and say what they said."""
    from agentrl.cli import build_parser

    parser = build_parser()
    serve = parser.parse_args(["serve", "--model", "m"])
    assert (serve.host, serve.port, serve.device, serve.max_running_requests, serve.disable_radix_cache,
            serve.api_key, serve.max_request_bytes, serve.log_level) == (
        "127.0.0.1", 30000, "cpu", 64, False, None, 64 << 20, "warning")
    assert parser.parse_args(["serve", "--model", "m", "--disable-radix-cache"]).disable_radix_cache is True
    gateway = parser.parse_args(["gateway", "--model", "m", "--upstream", "u", "--upstream", "v",
                                 "--session-timeout", "3"])
    assert (gateway.upstream, gateway.port, gateway.session_timeout_s, gateway.max_sessions,
            gateway.max_session_tokens, gateway.max_body_bytes, gateway.default_max_tokens) == (
        ["u", "v"], 30100, 3.0, 4096, 65536, 4 << 20, 1024)


def test_a_flag_out_of_bounds_is_one_line_naming_its_key():
    r = subprocess.run([AGENTRL, "gateway", "--model", "m", "--upstream", "http://127.0.0.1:9",
                        "--session-timeout", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == (
        "agentrl gateway: error: config key 'session_timeout_s': got 0.0, expected a value > 0"), r.stderr


def test_renamed_run_keys_are_still_accepted_with_a_warning_naming_the_new_key():
    import warnings

    from agentrl.config import load_config
    from agentrl.run.run_config import RunConfig

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config(RunConfig, None, ["model=examples/tiny-model", "rollout.episode_timeout_s=30",
                                            "inference.request_timeout_s=7",
                                            "rollout.workflow_args.env_id=agentrl/Arith-v0"])
    said = " ".join(str(w.message) for w in caught if issubclass(w.category, FutureWarning))
    assert "rollout.workflow_args.timeout_s" in said and "inference.client.timeout" in said
    # one episode budget (the workflow's own) and one client timeout, nothing left in the old keys
    assert cfg.rollout.workflow_args == {"timeout_s": 30.0, "env_id": "agentrl/Arith-v0"}
    assert cfg.rollout.episode_timeout_s is None
    assert cfg.inference.client.timeout == 7.0 and cfg.inference.request_timeout_s is None


def test_a_workflow_argument_the_workflow_does_not_take_is_one_line_naming_the_key(tmp_path):
    out = subprocess.run([str(Path(sys.executable).parent / "agentrl"), "train", "examples/arith_grpo.yaml",
                          f"run_dir={tmp_path / 'run'}", "rollout.workflow_args.colour=blue"],
                         capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "rollout.workflow_args" in out.stderr and "colour" in out.stderr and "Traceback" not in out.stderr
