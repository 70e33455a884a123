"""RolloutConfig: a run's ``rollout`` section — what is played, and how far generation runs ahead.

What it is: the typed, documented settings of the rollout side (``agentrl.rollout.executor``,
the workflow it plays, its sampling, deterministic mode's rounds, where the episodes run), each
field validated where it is declared, and ``check``, what a training run's groups must hold to.
The executor takes this object whole (``RolloutExecutor(workflow, engine, rows, config, ...)``).
What it is not: the run config that composes it (``agentrl.run.run_config.RunConfig``) or the
evaluation's settings (``agentrl.rollout.eval_config``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from agentrl.api import SamplingParams
from agentrl.config import option
from agentrl.errors import ConfigError
from agentrl.inference.serve_config import reasoning_parser_option, tool_call_parser_option
from agentrl.rollout.lockstep import LockstepConfig

SOURCES = ("workflow", "gateway")
"""``rollout.source`` values that are not a path to recorded steps (``agentrl.rollout.recorded``)."""


@dataclass
class RolloutConfig:
    """What is played, and how far generation may run ahead of training."""

    source: str = option("workflow",
                         help="workflow: the executor plays rows of the dataset with the workflow; gateway: "
                              "agents play on their own through the run's OpenAI-compatible gateway; a path "
                              "(RUN_DIR/record of a run, or agentrl replay's output): train off-policy on its "
                              "recorded steps, step k on recorded step k, nothing generated")
    workflow: str = option("workflows.env:EnvWorkflow", help="import path of the Workflow class")
    workflow_args: dict[str, Any] = option({}, help="keyword arguments of the workflow (env_id, env kwargs, ...)")
    dataset: str = option("", help="rows to play: a .jsonl file, or the import path of a function (seed) -> "
                                   "list of rows (required with source workflow; source gateway and recorded "
                                   "steps need none)")
    shuffle: bool = option(True, help="visit the rows in a seeded random order, reshuffled every epoch")
    group_size: int = option(8, ge=1, help="n: episodes per prompt, one GRPO group")
    batch_size: int = option(16, ge=1, help="B: groups per train step")
    max_concurrent: int = option(256, ge=1, help="episodes in flight at once (whole groups)")
    filter_equal_rewards: bool = option(False, help="drop groups whose rewards are all equal and admit "
                                                    "another prompt (DAPO's dynamic sampling); counted")
    episode_timeout_s: float | None = option(None, gt=0, help="deprecated: use rollout.workflow_args.timeout_s (the "
                                                               "workflow's own episode budget)")
    max_failed_fraction: float = option(0.9, gt=0, le=1, help="agentrl train (and agentrl eval) exits with code 1 "
                                                              "when this share of the episodes or more failed (saying "
                                                              "the first error)")
    tool_call_parser: str = tool_call_parser_option("for the env's tools and the workflow (when it takes "
                                                    "tool_call_parser)")
    reasoning_parser: str | None = reasoning_parser_option("a tool call written in it is never run")
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(max_new_tokens=256),
                                     metadata={"help": "sampling during rollouts (a seed here gives each call of each "
                                                       "episode its own seed: agentrl.rollout.seeds)"})
    lockstep: LockstepConfig = option(LockstepConfig, help="deterministic mode's generation rounds "
                                                           "(agentrl.rollout.lockstep)")
    worker: str = option("auto", choices=("auto", "process", "thread"),
                         help="where the episodes run: process: a child process of rank 0 with its own inference "
                              "client (the episodes' Python and the trainer's do not share an interpreter lock); "
                              "thread: rank 0's event loop, beside the trainer's thread. auto: process, except with "
                              "deterministic, rollout.source gateway or recorded steps (thread); the run's second "
                              "line says which and why")

    @property
    def recorded(self) -> str | None:
        """The path of the recorded steps this run trains on, or None (it plays or serves)."""
        return None if self.source in SOURCES else self.source

    def __post_init__(self) -> None:
        if self.episode_timeout_s is not None:  # one episode budget: the workflow's own timeout_s
            warnings.warn("config key 'rollout.episode_timeout_s' is deprecated and will be removed; use "
                          "rollout.workflow_args.timeout_s", FutureWarning, stacklevel=2)
            self.workflow_args = {"timeout_s": self.episode_timeout_s, **self.workflow_args}
            self.episode_timeout_s = None

    def check(self) -> None:
        """What a training run's groups must hold to: a learning signal, and room in the cap."""
        if self.group_size < 2:  # every advantage is group-relative (trainer.advantages: GRPO, then batch norm)
            raise ConfigError(f"config key 'rollout.group_size': {self.group_size} episode per prompt gives "
                              "every advantage 0 (reward minus its group's mean), so the run would learn nothing; "
                              "use 2 or more (8 to 16 is usual)")
        self.check_capacity()

    def check_capacity(self) -> None:
        """Sizes the executor can run (a config built in code is not bounds-checked as a loaded
        one is): groups and batches of one or more, and one group under ``max_concurrent``."""
        if self.group_size < 1 or self.batch_size < 1:
            raise ConfigError(f"config keys 'rollout.group_size'/'rollout.batch_size': expected >= 1, got "
                              f"{self.group_size} and {self.batch_size}")
        if self.max_concurrent < self.group_size:
            raise ConfigError(f"config key 'rollout.max_concurrent': {self.max_concurrent} cannot hold one "
                              f"group of rollout.group_size={self.group_size} episodes; raise it to at least "
                              f"{self.group_size}")
