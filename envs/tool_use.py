"""Multi-turn tool use: a calculator, a small price lookup and programs run in a sandbox.

What it is: ``ToolUseEnv`` (``agentrl/ToolUse-v0``). The calculator is exactly the tool the
tiny demo model was trained on (``agentrl.model.arith_data.CALCULATOR_TOOL``: same name, description
and argument), so its arithmetic tasks are the ones it can already solve with a call. The
``lookup`` tool reads a per-task price list. With ``sandbox`` set, a reply's fenced code block
(```python ... ```; the last one, ``envs.code.grading.extract_code``) is a Python program: it
runs in that sandbox (``agentrl.plugins.shared_sandbox``: one pool per process) and what it
printed comes back as a tool message. What it is not: a sandbox — the two tools are pure
Python running in this process, and programs go to the sandbox backend.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.api import ExecRequest, ExecStatus, Message, Sandbox
from agentrl.env.mcp_tools import MCPServerConfig, mcp_sources
from agentrl.env.rewards import Reward, Rubric, fact
from agentrl.env.text_env import EpisodeLimits, TextEnv, Turn
from agentrl.env.tools import ToolBox
from agentrl.errors import EnvError, SandboxError
from agentrl.model.arith_data import calculate, extract_answer, make_problem
from agentrl.plugins import shared_sandbox
from envs.code.agent import program_output
from envs.code.grading import extract_code

ITEMS = ("apple", "pear", "plum", "lemon", "mango", "melon", "onion", "bread", "cheese", "honey",
         "rice", "tea", "coffee", "salt", "sugar", "flour", "butter", "milk", "egg", "nut")
KINDS = ("calc", "lookup", "lookup_calc", "two_lookups_calc")
"""Task kinds and the calls they need: calculator (1), lookup (1), lookup + calculator (2),
two lookups + calculator (3)."""
TOOLS = ("calculator", "lookup")
"""The tools the env can offer by name (``tools``)."""


def calculator(expression: str) -> str:
    """Evaluate an integer arithmetic expression."""
    return calculate(expression)


def make_task(rng: random.Random, kind: str) -> dict[str, Any]:
    """One task row ``{"question", "answer", "store", "kind"}`` of the given kind."""
    names = rng.sample(ITEMS, 4)
    store = {name: rng.randint(2, 60) for name in names}
    a, b = names[0], names[1]
    n, m = rng.randint(2, 12), rng.randint(2, 12)
    if kind == "calc":
        expression = f"{rng.randint(0, 99)}+{rng.randint(0, 99)}+{rng.randint(0, 99)}"
        problem = make_problem(expression)
        question, answer = problem.question, problem.answer
    elif kind == "lookup":
        question, answer = f"What is the price of one {a}? Use the lookup tool.", store[a]
    elif kind == "lookup_calc":
        question, answer = f"What do {n} units of {a} cost? Use the tools.", n * store[a]
    elif kind == "two_lookups_calc":
        question = f"What do {n} units of {a} and {m} units of {b} cost together? Use the tools."
        answer = n * store[a] + m * store[b]
    else:
        raise EnvError(f"unknown tool-use task kind {kind!r}; choose from {KINDS}")
    return {"question": question, "answer": str(answer), "store": store, "kind": kind}


class ToolUseEnv(TextEnv):
    """Answer a question by calling tools, then give the final answer in ``\\boxed{N}``.

    ## Description
    The model may call ``calculator(expression)`` (integer ``+ - *``) and ``lookup(key)``
    (the price of an item in this task's store) by writing
    ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; each call is answered with
    a tool message. A reply without any tool call is the final answer.

    ## Action Space
    ``Text``: the assistant's reply, any Unicode string.

    ## Observation Space
    ``Messages``. Reset: the user's question (plus a system message when ``system_prompt``
    is set). After a reply with calls: one ``role: tool`` message per call, in order
    (malformed calls get an error message explaining the format). With ``sandbox``: after a
    reply with a fenced code block and no call, one ``role: tool`` message with what the program
    printed (stdout, then stderr and the status if it failed). Final step: ``[]``.

    ## Starting State
    ``options["task"]``: ``{"question", "answer", "store": {item: price}}``; else a task
    generated from the seeded ``np_random``, its kind drawn from ``kinds``.

    ## Rewards
    ``correct`` (weight 1): 1.0 when the final reply's last box holds the answer.
    ``tool_errors`` (weight ``tool_error_weight``, default 0): number of failed calls.
    ``used_tool_result`` (weight 0, reported only): 1.0 when the final answer is the result of
    a call that succeeded, or the whole output of a program that ran, in this episode
    (``tool_use_rate``: its share among right answers). ``programs`` (weight 0, reported only,
    with ``sandbox``): the programs run in the episode. Running a program earns nothing.

    ## Episode End
    Terminated by a reply without tool calls (and, with ``sandbox``, without a code block).
    Truncated after ``max_turns`` replies (default 4, Gymnasium's TimeLimit semantics), or by
    ``max_tokens`` / ``max_wall_s``.

    ## Information
    Reset: ``tools`` (the OpenAI schemas, for the chat template; only the calculator when
    ``kinds`` is ``("calc",)``, the prompt the tiny model was trained on). Step: ``turn``,
    ``tool_calls`` and ``tool_errors`` (totals so far), ``correct`` and ``answer`` on the
    final reply, ``used_tool_result`` on the final reply, ``programs`` (programs run so far,
    with ``sandbox``), ``rewards`` on the last step.

    ## Arguments
    ``kinds`` (default all of ``KINDS``), ``tools`` (names from ``TOOLS``; default None: the
    calculator, and the lookup when a kind needs it; ``[]``: none), ``mcp_servers`` (entries of
    ``agentrl.env.mcp_tools.MCPServerConfig``: their tools offered beside these; default none),
    ``sandbox`` (default None:
    code blocks are not run; "local", "docker", a URL, an import path or a Sandbox object),
    ``system_prompt`` (default None, as the tiny model was trained), ``max_turns``,
    ``tool_timeout_s`` (per call, and a program's time limit), ``tool_error_weight``,
    ``max_tokens``, ``max_wall_s``, ``render_mode``: "ansi" or None.

    ## Version History
    * v0: initial version; ``tools``, ``sandbox`` and ``mcp_servers`` added later (their
      defaults keep the observations and rewards).
    """

    def __init__(
        self,
        kinds: Sequence[str] = KINDS,
        tools: Sequence[str] | None = None,
        mcp_servers: Sequence[Mapping[str, Any] | MCPServerConfig] = (),
        sandbox: str | Sandbox | None = None,
        system_prompt: str | None = None,
        max_turns: int = 4,
        tool_timeout_s: float = 5.0,
        tool_error_weight: float = 0.0,
        max_tokens: int | None = None,
        max_wall_s: float | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(
            rubric=Rubric([Reward("correct", fact("correct")),
                           Reward("tool_errors", fact("tool_errors"), tool_error_weight),
                           Reward("used_tool_result", fact("used_tool_result"), 0.0)]
                          + ([Reward("programs", fact("programs"), 0.0)] if sandbox is not None else [])),
            limits=EpisodeLimits(max_turns=max_turns, max_tokens=max_tokens, max_wall_s=max_wall_s),
            render_mode=render_mode,
        )
        bad = [k for k in kinds if k not in KINDS]
        if bad or not kinds:
            raise EnvError(f"kinds must be a non-empty subset of {KINDS}, got {list(kinds)}")
        self.kinds = tuple(kinds)
        if tools is None:  # kinds=("calc",) offers the calculator alone: exactly the tiny model's training prompt
            tools = ("calculator",) + (("lookup",) if set(self.kinds) - {"calc"} else ())
        if set(tools) - set(TOOLS):
            raise EnvError(f"tools must name tools of {TOOLS}, got {list(tools)}")
        self.system_prompt = system_prompt
        offered = {"calculator": calculator, "lookup": self.lookup}
        self.toolbox = ToolBox([offered[name] for name in TOOLS if name in tools], timeout_s=tool_timeout_s,
                               sources=mcp_sources(mcp_servers))
        self.sandbox_spec = sandbox
        self.tool_timeout_s = tool_timeout_s
        self._store: dict[str, Any] = {}
        self._calls = self._errors = self._programs = 0
        self._results: list[str] = []

    def lookup(self, key: str) -> str:
        """Look up the price of an item."""
        if key not in self._store:
            raise KeyError(f"no item {key!r}; the items are {sorted(self._store)}")
        return str(self._store[key])

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> tuple[str, bool]:
        """A call the agent made outside its replies (ToolAgentWorkflow, the gateway's MCP
        endpoint), counted as the env's own: its result is one the answer may use."""
        content, ok = await super().call_tool(name, arguments)
        self._calls += 1
        self._errors += not ok
        if ok:
            self._results.append(content.strip())
        return content, ok

    def sample_task(self) -> dict[str, Any]:
        rng = self.rng()
        return make_task(rng, self.kinds[rng.randrange(len(self.kinds))])

    async def _start(self, task: dict[str, Any]) -> list[Message]:
        if not isinstance(task.get("question"), str) or "answer" not in task:
            raise EnvError(f"a tool-use task needs 'question' and 'answer'; got keys {sorted(task)}")
        store = task.get("store", {})
        if not isinstance(store, dict):
            raise EnvError(f"a tool-use task's 'store' must map item names to values, got {type(store).__name__}")
        self._store = dict(store)
        self._calls = self._errors = self._programs = 0
        self._results = []
        messages: list[Message] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": task["question"]})
        return messages

    async def _turn(self, action: str) -> Turn:
        assert self.task is not None and self.toolbox is not None
        handled = await self.toolbox.handle(action, turn=self._turns)
        self._calls += len(handled.calls)
        self._errors += handled.num_errors
        self._results += [r.strip() for r in handled.results]
        facts: dict[str, Any] = {"tool_calls": self._calls, "tool_errors": self._errors}
        if handled.attempted:
            return Turn(handled.messages, done=False, facts=facts)
        code = extract_code(action) if self.sandbox_spec is not None else None
        if code is not None:
            output = await self.run_program(code)
            facts["programs"] = self._programs
            return Turn([{"role": "tool", "content": output}], done=False, facts=facts)
        answer = extract_answer(action)
        facts.update(answer=answer, correct=answer is not None and str(answer) == str(self.task["answer"]).strip(),
                     used_tool_result=answer is not None and str(answer) in self._results)
        if self.sandbox_spec is not None:
            facts["programs"] = self._programs
        return Turn([], done=True, facts=facts)

    async def run_program(self, code: str) -> str:
        """Run ``code`` in the sandbox: what it printed (its whole stdout is a result the final
        answer may use). A failure of the backend itself raises ``SandboxError``."""
        result = await shared_sandbox(self.sandbox_spec).run(ExecRequest(code=code, time_limit_s=self.tool_timeout_s))
        if result.status is ExecStatus.SANDBOX_ERROR:
            raise SandboxError(f"the sandbox failed to run the program: {result.error}")
        self._programs += 1
        if result.ok:
            self._results.append(result.stdout.strip())
        return program_output(result)
