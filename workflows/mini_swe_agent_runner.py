"""mini-swe-agent's side of MiniSweAgentWorkflow: one episode, run by mini-swe-agent's own Python.

Reads ``{"task", "instruction", "image", "container_id", "workdir"}`` on stdin and runs
mini-swe-agent 2.x unchanged: its ``DefaultAgent`` with its SWE-bench config
(``config/benchmarks/swebench.yaml``), its ``LitellmModel`` on ``hosted_vllm/$AGENTRL_MSWEA_MODEL``
at ``$OPENAI_BASE_URL`` (the episode's gateway session, key ``$OPENAI_API_KEY``), and its
``DockerEnvironment`` on the episode's container — only told not to start or remove one
(agentrl's pool owns it). Exits 0 when the agent finished (submitted or hit its limits); the
host grades the repository. Standard library and mini-swe-agent only: nothing of agentrl.
"""

from __future__ import annotations

import json
import os
import sys

import yaml
from minisweagent.agents.default import DefaultAgent
from minisweagent.config import builtin_config_dir
from minisweagent.environments.docker import DockerEnvironment
from minisweagent.models.litellm_model import LitellmModel


class EpisodeContainer(DockerEnvironment):
    """mini-swe-agent's Docker environment on a container that agentrl started and will remove."""

    def __init__(self, container_id: str, **kwargs) -> None:
        self._episode_container = container_id
        super().__init__(**kwargs)

    def _start_container(self) -> None:
        self.container_id = self._episode_container

    def cleanup(self) -> None:
        """The container is the episode's: agentrl destroys it when the episode ends."""


def main() -> None:
    task = json.load(sys.stdin)
    config = yaml.safe_load((builtin_config_dir / "benchmarks" / "swebench.yaml").read_text())
    env_config = {k: v for k, v in config.get("environment", {}).items() if k != "environment_class"}
    env_config.update(image=task["image"], cwd=task["workdir"])
    env = EpisodeContainer(task["container_id"], **env_config)
    model_config = config["model"]
    model = LitellmModel(**{**model_config, "model_name": f"hosted_vllm/{os.environ.get('AGENTRL_MSWEA_MODEL', 'policy')}",
                            "model_kwargs": {**model_config.get("model_kwargs", {}), "api_base": os.environ["OPENAI_BASE_URL"],
                                             "api_key": os.environ["OPENAI_API_KEY"]},
                            "cost_tracking": "ignore_errors"})
    agent_config = {**config["agent"], "step_limit": int(os.environ.get("AGENTRL_MSWEA_STEP_LIMIT", "50")), "cost_limit": 0}
    result = DefaultAgent(model, env, **agent_config).run(task["instruction"])
    print(json.dumps({"exit_status": result.get("exit_status")}), file=sys.stderr)


if __name__ == "__main__":
    main()
