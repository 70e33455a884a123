"""A coding agent: run code in a persistent sandbox session, see the output, then submit.

What it is: ``CodeAgentEnv`` (``agentrl/CodeAgent-v0``). The model has one tool,
``python(code)``, backed by a ``Sandbox.session()`` kept for the whole episode (variables
survive between calls) and destroyed on reset/close. A reply without a tool call is the
submission, graded exactly as in ``agentrl/Code-v0`` — in a fresh sandbox run, so nothing the
session did can influence the grade. What it is not: a place where tests are visible; the
model only sees what its own code prints.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

from agentrl.api import ExecRequest, ExecResult, ExecStatus, Message, SandboxSession
from agentrl.env.text_env import Turn
from agentrl.env.tools import ToolBox
from agentrl.errors import SandboxError
from envs.code.env import CodeEnv

JAIL_SETUP_S = 15.0  # on top of the program's time limit, for a tool call's own timeout
MAX_TOOL_OUTPUT = 2000


def program_output(result: ExecResult) -> str:
    """What a program run shows the model: its stdout, then its stderr and status if any, cut
    to ``MAX_TOOL_OUTPUT`` characters (``[no output]`` when it printed nothing)."""
    parts = [result.stdout]
    if result.stderr:
        parts.append(f"[stderr]\n{result.stderr}")
    if result.status is not ExecStatus.OK:
        parts.append(f"[status: {result.status.value}]")
    text = "\n".join(p for p in parts if p).strip() or "[no output]"
    return text if len(text) <= MAX_TOOL_OUTPUT else text[:MAX_TOOL_OUTPUT] + "\n[output cut]"


class CodeAgentEnv(CodeEnv):
    """Solve a code task with a Python tool, then submit the program.

    ## Description
    As ``agentrl/Code-v0``, but before answering the model may call
    ``python(code)``: the code runs in a persistent interpreter in the episode's sandbox
    session and the tool message returns its stdout, stderr and status. A reply with no
    tool call is the final answer; its last fenced code block is graded by the task's tests.

    ## Action Space
    ``Text``: the assistant's reply, any Unicode string.

    ## Observation Space
    ``Messages``. Reset: one user message with the task (and how to call the tool).
    After a reply with calls: one ``role: tool`` message per call. Final step: ``[]``.

    ## Starting State
    ``options["task"]`` (HumanEval or stdin/stdout row), else a seeded row of ``dataset``.

    ## Rewards
    ``tests`` (weight 1): all tests pass (``reward_mode="all"``) or the fraction passed.
    ``format`` (weight ``format_weight``, default 0): the submission has a code block.

    ## Episode End
    Terminated by a reply without tool calls (the submission). Truncated after ``max_turns``
    replies (default 6; Gymnasium's TimeLimit semantics, reward 0), or by ``max_tokens`` /
    ``max_wall_s``.

    ## Information
    Reset: ``tools`` (the OpenAI schema of ``python``). Step: ``turn``, ``tool_calls``,
    ``tool_errors``; on the submission the facts of ``agentrl/Code-v0`` (``tests_passed``,
    ``tests_total``, ``pass_fraction``, ``all_passed``, ``run_status``, ``feedback``); and
    ``rewards`` on the last step.

    ## Arguments
    As ``CodeEnv`` plus ``max_turns`` (6) and ``tool_time_limit_s`` (10, per ``python`` call).

    ## Version History
    * v0: initial version.
    """

    def __init__(self, *, max_turns: int = 6, tool_time_limit_s: float = 10.0, **code_env_kwargs: Any) -> None:
        """``max_turns`` and ``tool_time_limit_s`` are this env's own; every other argument is
        ``CodeEnv``'s (``dataset``, ``sandbox``, ``reward_mode``, ``time_limit_s``, ...)."""
        super().__init__(max_turns=max_turns, **code_env_kwargs)
        self.tool_time_limit_s = tool_time_limit_s
        self.toolbox = ToolBox([self.python], timeout_s=tool_time_limit_s + JAIL_SETUP_S)
        self._session_cm: AbstractAsyncContextManager[SandboxSession] | None = None
        self._session: SandboxSession | None = None
        self._calls = self._errors = 0

    async def python(self, code: str) -> str:
        """Run Python code in a persistent interpreter and return what it printed.

        Args:
            code: Python source; variables and imports persist between calls.
        """
        if self._session is None:
            cm = self.sandbox.session()
            self._session = await cm.__aenter__()
            self._session_cm = cm
        result = await self._session.run(ExecRequest(code=code, time_limit_s=self.tool_time_limit_s,
                                                     memory_limit_mb=self.memory_limit_mb))
        if result.status is ExecStatus.SANDBOX_ERROR:
            raise SandboxError(f"the sandbox session failed: {result.error}")
        return program_output(result)

    async def _start(self, task: dict[str, Any]) -> list[Message]:
        self._calls = self._errors = 0
        messages = await super()._start(task)
        messages[0]["content"] += (" You may first run code with the python tool; a reply without "
                                   "a tool call is your final answer.")
        return messages

    async def _turn(self, action: str) -> Turn:
        assert self.toolbox is not None
        handled = await self.toolbox.handle(action, turn=self._turns)
        self._calls += len(handled.calls)
        self._errors += handled.num_errors
        facts: dict[str, Any] = {"tool_calls": self._calls, "tool_errors": self._errors}
        if handled.attempted:
            return Turn(handled.messages, done=False, facts=facts)
        facts.update(await self.submit(action))
        return Turn([], done=True, facts=facts)

    async def _end(self) -> None:
        cm, self._session_cm, self._session = self._session_cm, None, None
        if cm is not None:
            await cm.__aexit__(None, None, None)
