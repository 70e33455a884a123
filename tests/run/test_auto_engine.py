"""``inference.engine: auto``: the engine follows the model's size on a CPU, and says why.

The rule (``auto_engine``) is pure: vLLM at or above ``inference.auto_vllm_parameters`` on a CPU when
it can serve the run, agentrl serve otherwise. ``check_run_config`` applies it once the model is
known, counting the parameters from the checkpoint's headers (the demo model: 1,019,520), so every
later check sees a named engine.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.run.inference_config import auto_engine
from agentrl.run.run_config import RunConfig, check_run_config

ROOT = Path(__file__).resolve().parents[2]
TINY_PARAMETERS = 1_019_520


@pytest.mark.parametrize(("parameters", "device", "above", "usable", "engine", "words"), [
    (10**6, "cpu", None, None, "agentrl", "no vLLM size is set"),
    (10**6, "cpu", 10**8, None, "agentrl", "below inference.auto_vllm_parameters=100,000,000"),
    (10**8, "cpu", 10**8, None, "vllm", "at least inference.auto_vllm_parameters"),
    (10**9, "cpu", 10**8, "vLLM is not installed (make vllm)", "agentrl", "but vLLM is not installed"),
    (10**9, "cuda", 10**8, None, "agentrl", "measured on CPUs only"),
])
def test_the_rule(parameters, device, above, usable, engine, words):
    chosen, why = auto_engine(parameters, device=device, vllm_above=above, vllm_usable=usable)
    assert chosen == engine and words in why, why


def test_check_run_config_decides_auto_by_the_checkpoint(capsys):
    def run(*overrides: str) -> RunConfig:
        cfg = load_config(RunConfig, ROOT / "examples" / "arith_grpo.yaml",
                          [f"model={ROOT / 'examples/tiny-model'}", "inference.engine=auto", *overrides])
        check_run_config(cfg)
        return cfg

    assert run(f"inference.auto_vllm_parameters={TINY_PARAMETERS + 1}").inference.engine == "agentrl"
    assert "1.0 M parameters, below" in capsys.readouterr().out
    # the size rule would pick vLLM, but a run against listed servers starts none
    cfg = run(f"inference.auto_vllm_parameters={TINY_PARAMETERS}", "inference.servers=[http://127.0.0.1:9]")
    assert cfg.inference.engine == "agentrl"
    assert "inference.servers lists 1 running server(s)" in capsys.readouterr().out
