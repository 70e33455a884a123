"""Text environments on ``gymnasium.Env``: chat messages out, the assistant's reply in (DESIGN.md §3).

What it is: ``TextEnv``, the base of every environment in ``envs/``; the two spaces it
declares (``Text``: any Unicode string, the action; ``Messages``: a list of chat messages,
the observation); and ``EpisodeLimits`` (turns, tokens, wall time). What it is not: a
workflow — tokenizing, sampling and building trajectories happen on the rollout side.

The protocol::

    obs, info = env.reset(seed=0, options={"task": row})   # obs: messages to show the model
    obs, reward, terminated, truncated, info = env.step(reply_text)

``obs`` holds only the *new* messages to append to the conversation; reset's ``info``
carries ``tools`` (OpenAI schemas) when the env offers tools — pass them to the chat
template or the API — and what ``_start`` put in ``self.start_facts`` (a game's first seat). ``terminated``: the task ended (answer graded); ``truncated``: cut off
from outside — ``max_turns`` behaves as Gymnasium's ``TimeLimit`` (``truncated=True`` on
the step that reaches it), ``max_tokens`` likewise, and a turn that overruns ``max_wall_s``
is cancelled; ``info["truncated_by"]`` names the limit. The limits are enforced inside the
env, not by a wrapper, because wrappers do not forward ``areset``/``astep``. The reward is
the env's ``Rubric`` (agentrl/env/rewards.py) scored once, on the step that ends the episode
(0.0 before); ``info["rewards"]`` holds every named term. A failure of the infrastructure
(``SandboxError``...) propagates from ``step``: the rollout side records the episode as
failed; the model's own mistakes are never exceptions.

Async: every env is written as coroutines (``_start``, ``_turn``), so ``areset``/``astep``
never block an event loop when the env waits on I/O. The sync ``reset``/``step`` run the
same coroutines on one private event-loop thread per env, so loop-bound resources (a
sandbox session) stay valid across sync steps. Use one style per episode, and end with
``close()`` (sync) or ``await aclose()`` (async).

Main hook — subclass and implement::

    def sample_task(self) -> dict                      # a task from self.np_random (no options)
    async def _start(self, task) -> list[Message]      # the opening messages
    async def _turn(self, action) -> Turn              # react to one reply
    async def _end(self) -> None                       # optional: release episode resources

Tools: an env sets ``self.toolbox`` (``agentrl.env.tools.ToolBox``); its tool sources (MCP
servers) are opened at every reset and released at the episode's end and at close. An agent
that runs the env's tools itself (``ToolAgentWorkflow``, the gateway's MCP endpoint) calls
``call_tool``, which subclasses override to count such calls in their facts.
"""

from __future__ import annotations

import abc
import asyncio
import copy
import random
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import gymnasium

from agentrl.api import Message
from agentrl.config import option
from agentrl.env.rewards import RewardInput, Rubric
from agentrl.env.tools import ToolBox
from agentrl.errors import EnvError
from agentrl.toolcalls import ToolCall

T = TypeVar("T")

ROLES = ("system", "user", "assistant", "tool")
MESSAGE_KEYS = ("role", "content", "name", "tool_call_id", "tool_calls")

# --------------------------------------------------------------------------- spaces

# Characters `Text.sample` draws from: ASCII, whitespace, accents, Greek, CJK, an emoji and the
# tool-call markers, so random actions exercise parsers. `contains` accepts *any* Unicode.
_SAMPLE_CHARS = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \n\t.,;:!?()[]{}<>=+-*/\\$#%'\"_"
    "éüßçñλπΣ中文数学🙂"
)


class Text(gymnasium.spaces.Space[str]):
    """Any Unicode string up to ``max_length`` characters (Gymnasium's ``Text`` space limits
    the character set, which an LLM's reply does not respect)."""

    def __init__(self, max_length: int = 1 << 20, *, sample_max_length: int = 64, seed: int | None = None):
        if max_length < 0 or sample_max_length < 0:
            raise ValueError(f"lengths must be >= 0, got {max_length=}, {sample_max_length=}")
        self.max_length = max_length
        self.sample_max_length = min(sample_max_length, max_length)
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        if mask is not None or probability is not None:
            raise NotImplementedError("Text.sample takes no mask or probability")
        n = int(self.np_random.integers(0, self.sample_max_length + 1))
        idx = self.np_random.integers(0, len(_SAMPLE_CHARS), size=n)
        return "".join(_SAMPLE_CHARS[i] for i in idx)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"Text(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Text) and other.max_length == self.max_length


class Messages(gymnasium.spaces.Space[list]):
    """A list of chat messages: dicts with ``role`` in (system, user, assistant, tool) and a
    string ``content``; optional ``name``, ``tool_call_id``, ``tool_calls`` (OpenAI's keys).
    An empty list is valid (a step that adds nothing)."""

    def __init__(self, max_messages: int = 1024, *, seed: int | None = None):
        self.max_messages = max_messages
        self._text = Text(sample_max_length=32)
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def seed(self, seed: int | None = None) -> int:
        out = super().seed(seed)
        self._text.seed(int(self.np_random.integers(2**31)))
        return out

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        if mask is not None or probability is not None:
            raise NotImplementedError("Messages.sample takes no mask or probability")
        n = int(self.np_random.integers(1, 4))
        return [{"role": ROLES[int(self.np_random.integers(len(ROLES)))], "content": self._text.sample()}
                for _ in range(n)]

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and len(x) <= self.max_messages and all(map(is_message, x))

    def __repr__(self) -> str:
        return f"Messages(max_messages={self.max_messages})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Messages) and other.max_messages == self.max_messages


def is_message(m: Any) -> bool:
    """Whether ``m`` is a chat message as the Messages space defines it."""
    return (
        isinstance(m, dict)
        and m.get("role") in ROLES
        and isinstance(m.get("content"), str)
        and all(k in MESSAGE_KEYS for k in m)
        and isinstance(m.get("tool_calls", []), list)
    )


# --------------------------------------------------------------------------- limits and turns


@dataclass
class EpisodeLimits:
    """When an episode is cut off (``truncated=True``). None disables a limit."""

    max_turns: int = option(1, help="assistant replies per episode (Gymnasium's TimeLimit on steps)", ge=1)
    max_tokens: int | None = option(
        None, help="tokens of the whole conversation (prompt, replies, env messages); counted "
        "with count_tokens, by default UTF-8 bytes (exact for the byte-level tiny model)", ge=1)
    max_wall_s: float | None = option(None, help="seconds from reset to the end of a step", gt=0)


def count_utf8_bytes(text: str) -> int:
    """Token count of the byte-level tokenizer (agentrl/model/tokenizer.py): one token per byte."""
    return len(text.encode("utf-8"))


@dataclass
class Turn:
    """What the env answers to one reply: the new messages, whether the task ended, and the
    facts it measured (``correct``, ``tests_passed``...). Facts go into ``info`` and into the
    rubric's ``RewardInput``; keep them JSON-like and deterministic."""

    messages: list[Message] = field(default_factory=list)
    done: bool = False
    facts: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- the base env


class TextEnv(gymnasium.Env[list, str], abc.ABC):
    """Base of agentrl's text environments; see the module docstring for the protocol."""

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(
        self,
        *,
        rubric: Rubric,
        limits: EpisodeLimits | None = None,
        count_tokens: Callable[[str], int] = count_utf8_bytes,
        render_mode: str | None = None,
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise EnvError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}")
        self.render_mode = render_mode
        self.rubric = rubric
        self.limits = limits or EpisodeLimits()
        self.count_tokens = count_tokens
        self.observation_space = Messages()
        self.action_space = Text()
        self.toolbox: ToolBox | None = None  # set by envs with tools; schemas go to reset's info
        self.task: dict[str, Any] | None = None
        self.start_facts: dict[str, Any] = {}  # set by _start: facts for reset's info
        self.transcript: list[Message] = []
        self._turns = 0
        self._tokens = 0
        self._t0 = 0.0
        self._over = False
        self._facts: dict[str, Any] = {}
        self._runner: _LoopThread | None = None
        self._finalizer: weakref.finalize | None = None

    # ---------------------------------------------------------------- subclass hooks

    def sample_task(self) -> dict[str, Any]:
        """A task drawn with ``self.np_random``, used when reset gets no ``options["task"]``."""
        raise EnvError(f"{type(self).__name__} has no default tasks; pass reset(options={{'task': row}})")

    @abc.abstractmethod
    async def _start(self, task: dict[str, Any]) -> list[Message]:
        """Begin an episode on ``task``; return the opening messages."""

    @abc.abstractmethod
    async def _turn(self, action: str) -> Turn:
        """React to one reply of the model."""

    async def _end(self) -> None:
        """Release what the episode holds (a sandbox session); called on reset and close."""

    # ---------------------------------------------------------------- async API

    async def areset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        gymnasium.Env.reset(self, seed=seed)
        await self._release()
        options = dict(options or {})
        unknown = sorted(set(options) - {"task"})
        if unknown:
            raise EnvError(f"reset options accept only 'task' (a dataset row), got {unknown}")
        task = options.get("task")
        if task is None:
            task = self.sample_task()
        if not isinstance(task, Mapping):
            raise EnvError(f"options['task'] must be a dataset row (a dict), got {type(task).__name__}")
        self.task = dict(task)
        self.transcript, self._turns, self._over, self._facts, self.start_facts = [], 0, False, {}, {}
        self._t0 = time.monotonic()
        try:
            if self.toolbox is not None:
                await self.toolbox.begin_episode()  # MCP servers: started (or reached) and listed
            messages = await self._start(self.task)
            self._check_messages(messages, "_start")
        except BaseException:
            self.task = None  # no half-started episode to step into
            raise
        self.transcript.extend(copy.deepcopy(messages))
        self._tokens = sum(self.count_tokens(m["content"]) for m in messages)
        info: dict[str, Any] = {"turn": 0, **copy.deepcopy(self.start_facts)}
        if self.toolbox is not None:
            info["tools"] = self.toolbox.schemas()  # for the chat template's / API's `tools=`
        return copy.deepcopy(messages), info

    async def astep(self, action: str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        if self.task is None:
            raise EnvError("step() before reset(): call reset(options={'task': row}) first")
        if self._over:
            raise EnvError("the episode is over (terminated or truncated); call reset() to start another")
        if not isinstance(action, str):
            raise EnvError(f"the action is the assistant's reply as a str, got {type(action).__name__}")
        self._turns += 1
        self.transcript.append({"role": "assistant", "content": action})
        wall_hit = False
        if self.limits.max_wall_s is None:
            turn = await self._turn(action)
        else:  # a turn that overruns the episode's wall time is cancelled, and the episode truncated
            left = self.limits.max_wall_s - (time.monotonic() - self._t0)
            try:
                turn = await asyncio.wait_for(self._turn(action), max(left, 0.001))
            except TimeoutError:
                turn, wall_hit = Turn(), True
        self._check_messages(turn.messages, "_turn")
        self.transcript.extend(copy.deepcopy(turn.messages))
        self._facts.update(turn.facts)
        self._tokens += self.count_tokens(action) + sum(self.count_tokens(m["content"]) for m in turn.messages)
        info: dict[str, Any] = {"turn": self._turns, **copy.deepcopy(turn.facts)}
        truncated_by = "wall_time" if wall_hit else (None if turn.done else self._limit_reached())
        truncated = truncated_by is not None
        reward = 0.0
        if turn.done or truncated:
            self._over = True
            reward, terms = await self.rubric.ascore(
                RewardInput(action, dict(self.task), copy.deepcopy(self.transcript), dict(self._facts))
            )
            info["rewards"] = terms
            if truncated:
                info["truncated_by"] = truncated_by
            if self.toolbox is not None:
                await self.toolbox.end_episode()  # a per-episode MCP server ends with its episode
        return copy.deepcopy(turn.messages), float(reward), bool(turn.done), truncated, info

    async def aclose(self) -> None:
        try:
            await self._release()
        finally:
            if self.toolbox is not None:
                await self.toolbox.aclose()

    async def _release(self) -> None:
        """End the episode's hold on resources: the subclass's, then the tool sources'."""
        try:
            await self._end()
        finally:
            if self.toolbox is not None:
                await self.toolbox.end_episode()

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> tuple[str, bool]:
        """Run one of the env's tools for an agent outside the reply loop: (content, ok)."""
        if self.toolbox is None:
            return f"error: {type(self).__name__} offers no tools", False
        return await self.toolbox.run(ToolCall(name, dict(arguments)))

    def _limit_reached(self) -> str | None:
        lim = self.limits
        if self._turns >= lim.max_turns:
            return "max_turns"
        if lim.max_tokens is not None and self._tokens >= lim.max_tokens:
            return "max_tokens"
        if lim.max_wall_s is not None and time.monotonic() - self._t0 >= lim.max_wall_s:
            return "wall_time"
        return None

    def _check_messages(self, messages: Any, where: str) -> None:
        if not self.observation_space.contains(messages):
            raise EnvError(
                f"{type(self).__name__}.{where} returned {messages!r:.200}; expected a list of "
                f"messages with role in {ROLES} and string content"
            )

    # ---------------------------------------------------------------- sync API (gymnasium)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        return self._sync(self.areset(seed=seed, options=options))

    def step(self, action: str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        return self._sync(self.astep(action))

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return "".join(f"[{m['role']}] {m['content']}\n" for m in self.transcript)

    def close(self) -> None:
        if self._runner is not None:
            try:
                self._runner.run(self.aclose())
            finally:
                self._runner.stop()
                self._runner = None

    def _sync(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._runner is None:
            self._runner = _LoopThread(type(self).__name__)
            self._finalizer = weakref.finalize(self, self._runner.stop)
        return self._runner.run(coro)

    # ---------------------------------------------------------------- helpers for subclasses

    def rng(self) -> random.Random:
        """A ``random.Random`` drawn from ``self.np_random`` (for generators written with it)."""
        return random.Random(int(self.np_random.integers(2**63 - 1)))

    def pick(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """One row of ``rows`` chosen with ``self.np_random`` (a copy)."""
        if not rows:
            raise EnvError(f"{type(self).__name__} has an empty dataset; pass options={{'task': row}}")
        return dict(rows[int(self.np_random.integers(len(rows)))])


class _LoopThread:
    """One event loop on a daemon thread: the sync API's home for this env's coroutines."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=f"{name}-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self.thread:
            coro.close()
            raise EnvError("the sync env API was called from the env's own loop; await areset/astep there")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()

