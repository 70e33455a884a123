"""MiniSweAgentWorkflow: mini-swe-agent 2.x, unchanged, playing agentrl/Repo-v0 through the gateway.

What it is: ``ExternalAgentWorkflow`` whose agent program is ``workflows/mini_swe_agent_runner.py``
run by mini-swe-agent's own Python (``.venv-mswea``, ``make mswea``: its litellm pins are its
own). Per episode: the env (``agentrl/Repo-v0``) starts the task's container from its warm pool;
the runner gets the container's id on stdin and runs mini-swe-agent's ``DefaultAgent`` with its
SWE-bench config, its ``LitellmModel`` (``hosted_vllm/<model_name>``, ``api_base`` the episode's
gateway session) and its ``DockerEnvironment`` pointed at that container (``docker exec`` per
command, as mini-swe-agent does; it neither starts nor removes the container). When the agent
has submitted and exited, the repository is graded as the env grades it (for SWE-bench: the diff
in a fresh container, swebench's report) and the reward lands on the session's last call, so the
recorded trajectories carry it. Failures are data as for any external agent.

What it is not: a sandbox for mini-swe-agent's own process (it runs on this host, reaching the
engine through ``DOCKER_HOST`` or the default socket), nor a change to mini-swe-agent.

Main hook (a run's YAML)::

    rollout: {workflow: workflows.mini_swe_agent:MiniSweAgentWorkflow, dataset: instances.jsonl,
              workflow_args: {env_kwargs: {command_timeout_s: 60}}}
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl.api import InferenceClient, Trajectory
from agentrl.errors import ConfigError
from agentrl.rollout.gateway import Session
from workflows.external_agent import ExternalAgentWorkflow

ROOT = Path(__file__).resolve().parents[1]
RUNNER = Path(__file__).resolve().parent / "mini_swe_agent_runner.py"
PYTHON_VAR = "AGENTRL_MSWEA_PYTHON"
"""Environment variable naming mini-swe-agent's Python (default: the repository's ``.venv-mswea``)."""
MSWEA_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "MSWEA_COST_TRACKING": "ignore_errors", "MSWEA_CONFIGURED": "1"}


def mswea_python() -> str:
    python = os.environ.get(PYTHON_VAR) or str(ROOT / ".venv-mswea" / "bin" / "python")
    if not Path(python).exists():
        raise ConfigError(f"mini-swe-agent's Python {python} does not exist; run `make mswea` "
                          f"(or set {PYTHON_VAR} to a Python with mini-swe-agent 2.x)")
    return python


class MiniSweAgentWorkflow(ExternalAgentWorkflow):
    """mini-swe-agent on ``agentrl/Repo-v0``'s tasks; see the module docstring.

    ``tokenizer``: the policy's model directory or tokenizer; ``env_kwargs``: ``RepoEnv``'s;
    ``model_name``: the name mini-swe-agent asks for (``hosted_vllm/<model_name>``);
    ``step_limit``: mini-swe-agent's step limit (0: none); the rest as ``ExternalAgentWorkflow``.
    """

    def __init__(self, tokenizer: str | Path | Any, env_kwargs: Mapping[str, Any] | None = None, *,
                 model_name: str = "policy", step_limit: int = 50, timeout_s: float = 1800.0, **kwargs: Any) -> None:
        extra = {**MSWEA_ENV, "AGENTRL_MSWEA_MODEL": model_name, "AGENTRL_MSWEA_STEP_LIMIT": str(step_limit),
                 **kwargs.pop("extra_env", {})}
        super().__init__([mswea_python(), str(RUNNER)], tokenizer, "agentrl/Repo-v0", env_kwargs,
                         timeout_s=timeout_s, extra_env=extra, **kwargs)
        self._envs_of: dict[str, Any] = {}

    async def _play(self, client: InferenceClient, row: Mapping[str, Any]) -> list[Trajectory]:
        url = await self._base_url()
        assert self.envs is not None
        async with self.envs.lease() as env:
            await self.envs.reset(env, row)
            raw = env.unwrapped
            if not hasattr(raw.session, "box"):
                raise ConfigError("mini-swe-agent runs `docker exec` in the episode's container on this machine's "
                                  "engine: its episodes cannot run on sandbox services (leave sandbox.services empty)")
            task = {"task": dict(row), "instruction": raw.repo_task.instruction, "image": raw.repo_task.spec.image,
                    "container_id": raw.session.box.container.id, "workdir": raw.session.workdir}
            key = task["container_id"]
            self._envs_of[key] = raw
            try:
                return await self._run(client, url, {**row, "_container": key}, task, None)
            finally:
                self._envs_of.pop(key, None)

    async def _agent_done(self, session: Session, row: Mapping[str, Any]) -> None:
        env = self._envs_of.get(row["_container"])
        if env is None or not session.chat.conversation.calls:
            return
        facts = await env.grade()
        session.chat.set_last_reward(float(facts["score"]))
        session.metadata.update({k: facts[k] for k in ("resolved", "f2p_fixed", "p2p_kept") if k in facts})
