"""``verifiers:<taskset>`` in the env-id places: what ``agentrl envs`` says of verifiers, and the error an
env id of it gets.

What it is: the ``ECOSYSTEMS`` entry of verifiers (``agentrl.plugins``). A verifiers taskset is
not a stepped env: verifiers' harness runs the model loop, so it is played by
``workflows.verifiers_harness:VerifiersWorkflow`` (an external agent through the gateway), in
verifiers' own environment (``.venv-verifiers``, ``make verifiers``). ``register`` therefore
refuses the id with a ``ConfigError`` saying so, and ``listing`` says whether that environment is
there. What it is not: the workflow (``workflows/verifiers_harness.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

from agentrl.errors import ConfigError

ID_FORM = "verifiers:<taskset>"
PYTHON_VAR = "AGENTRL_VERIFIERS_PYTHON"  # read by workflows/verifiers_harness.py too (the packages stay apart)
WORKFLOW = "workflows.verifiers_harness:VerifiersWorkflow"


def register(env_id: str) -> str:
    raise ConfigError(f"{env_id} is a verifiers taskset, played by its own harness rather than stepped as an env: "
                      f"use rollout.workflow: {WORKFLOW} with workflow_args: {{taskset: {env_id!r}}}")


def listing() -> str:
    python = Path(os.environ.get(PYTHON_VAR) or Path(__file__).resolve().parents[2] / ".venv-verifiers" / "bin" / "python")
    found = sorted(python.parent.parent.glob("lib/python*/site-packages/verifiers-*.dist-info"))
    if not python.is_file() or not found:
        return f"verifiers tasksets; not installed: make verifiers (its own venv; or set {PYTHON_VAR})"
    version = found[-1].name.removeprefix("verifiers-").removesuffix(".dist-info")
    return f"verifiers {version} in {python.parent.parent.name}: tasksets through their harness and the gateway ({WORKFLOW})"
