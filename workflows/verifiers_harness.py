"""VerifiersWorkflow: a verifiers taskset (``verifiers:<taskset>``) played by its own harness through the gateway.

What it is: ``ExternalAgentWorkflow`` whose agent program is ``workflows/verifiers_agent.py``, run
by verifiers' own Python (a separate environment, ``.venv-verifiers``, since verifiers 0.4 pins
``mcp==2.0`` and an older ``openai`` than ours; ``make test`` builds it). For each row
(``{"index": i}``: task i of the taskset) the program runs verifiers' ``run_episode`` with its
harness (the null harness, a chat program, by default) and a local subprocess runtime, the
model client pointed at this episode's gateway session; so every model call is recorded as an
external agent's are (exact tokens, one trajectory per call chain) and the episode's reward is
the taskset's rubric (``trace.reward``), posted by the program. Failures are data as for any
external agent: a failed verifiers episode exits non-zero (``env_error``), a hung one is killed.

Cost: each episode starts a Python process and verifiers' harness program (seconds of CPU), so
bound ``rollout.max_concurrent`` on a small machine: on 2 shared cores, 20 episodes started at once
all ran past a 240 s budget, while 2 at a time finish in about 10 s each.

What it is not: an env for ``EnvWorkflow`` (verifiers drives the loop; ``agentrl envs check`` does
not apply), nor Prime's remote runtimes or inference (never used here).

Main hook (a run's YAML)::

    rollout: {workflow: workflows.verifiers_harness:VerifiersWorkflow,
              workflow_args: {taskset: "verifiers:my_taskset"}, dataset: workflows.verifiers_harness:rows}
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from agentrl.errors import ConfigError
from workflows.external_agent import ExternalAgentWorkflow

ROOT = Path(__file__).resolve().parents[1]
AGENT = Path(__file__).resolve().parent / "verifiers_agent.py"
PYTHON_VAR = "AGENTRL_VERIFIERS_PYTHON"
"""Environment variable naming verifiers' Python (default: the repository's ``.venv-verifiers``)."""


def verifiers_python() -> str:
    python = os.environ.get(PYTHON_VAR) or str(ROOT / ".venv-verifiers" / "bin" / "python")
    if not Path(python).is_file():
        raise ConfigError(f"verifiers' Python {python} is missing: build it with `make verifiers` (a venv with "
                          f"pip install 'agentrl[verifiers]'), or set {PYTHON_VAR} to one that has verifiers 0.4")
    return python


def rows(seed: int, n: int = 1000) -> list[dict[str, Any]]:
    """Rows for ``rollout.dataset``: the taskset's tasks 0..n-1 by index."""
    return [{"index": i} for i in range(n)]


class VerifiersWorkflow(ExternalAgentWorkflow):
    """A verifiers taskset's episodes through the gateway; see the module docstring.

    ``taskset``: ``verifiers:<taskset>`` (or the bare id: a shipped taskset or a module exporting
    one in ``__all__``, found on the agent's ``PYTHONPATH``, which includes the current directory);
    ``tokenizer``; ``harness`` (``null``); ``env_config``: merged into verifiers' env config;
    ``python``: verifiers' interpreter; the rest as ``ExternalAgentWorkflow``'s.
    """

    run_inputs: ClassVar[tuple[str, ...]] = ("tokenizer",)
    """What it takes from a run (``agentrl.rollout.workflow_inputs``)."""

    def __init__(self, taskset: str, tokenizer: str | Path | Any, *, harness: str = "null",
                 env_config: Mapping[str, Any] | None = None, python: str | None = None,
                 timeout_s: float = 900.0, **kwargs: Any) -> None:
        name = taskset.removeprefix("verifiers:")
        if not name:
            raise ConfigError("taskset must be 'verifiers:<taskset>'")
        python = python or verifiers_python()
        command = [python, str(AGENT), "--taskset", name, "--harness", harness,
                   "--env-config", json.dumps(dict(env_config or {}))]
        bin_dir = str(Path(python).parent)  # verifiers' chat program is started with its `uv`
        extra_env = {"PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
                     "PYTHONPATH": os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p),
                     **dict(kwargs.pop("extra_env", None) or {})}
        super().__init__(command, tokenizer, timeout_s=timeout_s, extra_env=extra_env, **kwargs)
        self.taskset = name
