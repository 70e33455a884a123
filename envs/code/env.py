"""Code generation graded by tests run in a sandbox: the model writes a program, tests decide.

What it is: ``CodeEnv`` (``agentrl/Code-v0``), single turn, over HumanEval-style rows
(``prompt``, ``entry_point``, ``test``) or stdin/stdout rows (``question``, ``inputs``,
``outputs``), its sandbox shared by every env of the process (``agentrl.plugins.shared_sandbox``).
What it is not: the grader (envs/code/grading.py) or a sandbox (``agentrl.api.Sandbox``,
backends in ``sandboxes/``, chosen by name through ``agentrl.plugins.make_sandbox``).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from agentrl.api import Message, Sandbox
from agentrl.env.datasets import data_path, load_rows
from agentrl.env.rewards import Reward, Rubric, fact
from agentrl.env.text_env import EpisodeLimits, TextEnv, Turn
from agentrl.errors import EnvError
from agentrl.plugins import shared_sandbox
from envs.code.grading import extract_code, grade, task_kind

DEFAULT_DATASET = "HumanEval.jsonl.gz"
REWARD_MODES = ("all", "fraction")


@functools.lru_cache(maxsize=8)
def _rows(path: str) -> tuple[dict[str, Any], ...]:
    return tuple(load_rows(path))


def code_prompt(task: dict[str, Any]) -> str:
    """The user message for a code task (either row format)."""
    if task_kind(task) == "function":
        return ("Complete the following Python function. Reply with the whole function in a "
                f"```python code block.\n\n```python\n{task['prompt']}```")
    if not isinstance(task.get("question"), str):
        raise EnvError(f"a stdin/stdout code task needs a 'question' (the problem statement); got keys {sorted(task)}")
    return (f"{task['question']}\n\nWrite a Python program that reads standard input and prints the "
            "answer. Reply with the program in a ```python code block.")


def tests_rubric(reward_mode: str, format_weight: float = 0.0) -> Rubric:
    """``tests``: 1.0 only when every test passes ("all") or the pass fraction ("fraction");
    ``format``: 1.0 when the reply has a fenced code block."""
    if reward_mode not in REWARD_MODES:
        raise EnvError(f"reward_mode must be one of {REWARD_MODES}, got {reward_mode!r}")
    tests = fact("all_passed") if reward_mode == "all" else fact("pass_fraction")
    return Rubric([Reward("tests", tests), Reward("format", fact("has_code"), format_weight)])


class CodeEnv(TextEnv):
    """Write a program; the task's tests run in a sandbox and are graded on the host.

    ## Description
    The reply's last fenced code block is the program. HumanEval rows: the harness calls
    the function through a pipe from a separate process and prints a nonce-tagged line per
    passing test (envs/code/harness.py); stdin/stdout rows: one sandbox run per input, its
    stdout compared on the host. Early exits, patched builtins and printed fake results
    earn nothing.

    ## Action Space
    ``Text``: the assistant's reply, any Unicode string.

    ## Observation Space
    ``Messages``. Reset: one user message with the task. The step returns ``[]``.

    ## Starting State
    ``options["task"]`` (either row format), else a row of ``dataset`` drawn with the seeded
    ``np_random``.

    ## Rewards
    ``tests`` (weight 1): 1.0 when all tests pass (``reward_mode="all"``, the default) or
    the fraction passed (``"fraction"``). ``format`` (weight ``format_weight``, default 0):
    1.0 when the reply has a fenced code block.

    ## Episode End
    Terminated after the first reply. Truncated only by ``max_tokens`` or ``max_wall_s``.

    ## Information
    Step: ``turn``, ``has_code``, ``tests_passed``, ``tests_total``, ``pass_fraction``,
    ``all_passed``, ``run_status`` (``ok``, ``timeout``, ``runtime_error``, ``no_code``,
    ``load_error``...), ``feedback`` and ``rewards``. A failure of the sandbox backend
    itself raises ``SandboxError`` (the episode failed; it is not a grade).

    ## Arguments
    ``dataset`` (default data/HumanEval.jsonl.gz), ``sandbox`` ("local", "docker", a URL,
    an import path or a Sandbox object), ``reward_mode``, ``time_limit_s`` (10),
    ``memory_limit_mb`` (512), ``format_weight``, ``max_tokens``, ``max_wall_s``,
    ``render_mode``: "ansi" or None.

    ## Version History
    * v0: initial version.
    """

    def __init__(
        self,
        dataset: str | Path | None = None,
        sandbox: str | Sandbox = "local",
        reward_mode: str = "all",
        time_limit_s: float = 10.0,
        memory_limit_mb: int = 512,
        format_weight: float = 0.0,
        max_tokens: int | None = None,
        max_wall_s: float | None = None,
        render_mode: str | None = None,
        *,
        max_turns: int = 1,
    ) -> None:
        super().__init__(
            rubric=tests_rubric(reward_mode, format_weight),
            limits=EpisodeLimits(max_turns=max_turns, max_tokens=max_tokens, max_wall_s=max_wall_s),
            render_mode=render_mode,
        )
        self.dataset = str(dataset) if dataset is not None else None
        self.sandbox_spec = sandbox
        self.time_limit_s = time_limit_s
        self.memory_limit_mb = memory_limit_mb

    @property
    def sandbox(self) -> Sandbox:
        return shared_sandbox(self.sandbox_spec)

    def sample_task(self) -> dict[str, Any]:
        return self.pick(_rows(self.dataset or str(data_path(DEFAULT_DATASET))))

    async def _start(self, task: dict[str, Any]) -> list[Message]:
        return [{"role": "user", "content": code_prompt(task)}]

    async def submit(self, action: str) -> dict[str, Any]:
        """Grade the program in ``action``: the facts of the final answer."""
        assert self.task is not None
        code = extract_code(action)
        result = await grade(self.sandbox, self.task, code, time_limit_s=self.time_limit_s, memory_limit_mb=self.memory_limit_mb)
        return {"has_code": code is not None, **result.facts(), "feedback": result.feedback}

    async def _turn(self, action: str) -> Turn:
        return Turn([], done=True, facts=await self.submit(action))
