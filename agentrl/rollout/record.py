"""The episode record: what an environment was given and gave back in one episode, bounded.

What it is: ``EpisodeRecord`` — the environment side of an episode, event by event: ``reset``
(the task row, the opening messages, reset's info: the tools offered), every ``step`` (the
action as the env got it, tool calls in the model's own format included; the new messages:
tool results, sandbox output, feedback; the reward; terminated/truncated; the step's info:
facts such as ``correct`` or ``tests_passed``, the rubric's terms under ``rewards``,
``truncated_by``), and every ``generate`` call's sampling seed and token counts (the tokens
themselves are on the trajectory). The executor opens one per episode (``recording``) and
puts ``to_dict()`` on the episode's first trajectory (``Trajectory.record``), so it travels
wherever that trajectory goes: the episode log, ``RUN_DIR/record/`` and the viewer's samples.
``EnvPool.reset``/``step`` and ``ReplayClient.generate`` note into the record of the episode
that runs them (a context variable: each episode is its own task), so every env-backed
workflow records without a line of its own.

Bounded: ``max_bytes`` of JSON per episode. An event that does not fit has its longest
strings cut (head and tail kept, ``…[N chars cut]…`` in between); one that still does not fit
is kept as ``{"kind", "cut": true}``, and past the bound not at all (``dropped_events``);
every cut event is marked ``"cut": true``, ``truncated`` is true and ``cut_events`` counts
them — never a silent loss. Values that are not JSON (a numpy number, an object in an
info dict) are written as their ``repr``.

``reward_input(record)`` rebuilds what the env's rubric scored (response, task, transcript,
facts) from a record, which is what ``agentrl replay`` re-scores with another function.

What it is not: a log of the sandbox's own calls (a program an env runs to grade a reply is
seen through what the env reports: its facts and feedback), or a replay of the env (replay
reads the record; it never steps an env again).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterator, Mapping
from typing import Any

from agentrl.api import Completion, SamplingParams

RECORD_MAX_BYTES = 65536
"""The default bound of one episode's record (``logging.record_max_bytes``)."""
RECORD_DIR = "record"
"""``RUN_DIR/record/``: every trajectory of every step whole, each episode's record on its first
(``RunLog.record`` writes it; ``agentrl replay``, ``rollout.source`` and the viewer read it)."""
RECORD_STEP = "step_*.jsonl"
"""The step files in it (``step_file``)."""


def step_file(step: int) -> str:
    """The name of step ``step``'s file in a run's ``record/`` (and ``trajectories/``)."""
    return f"step_{step:06d}.jsonl"

_current: contextvars.ContextVar[EpisodeRecord | None] = contextvars.ContextVar("agentrl_episode_record",
                                                                                 default=None)
NOT_FACTS = ("turn", "rewards", "truncated_by", "tools")
"""Keys of a step's info that TextEnv adds beside the env's facts."""


class EpisodeRecord:
    """One episode's environment inputs and outputs, within ``max_bytes``; see the module doc."""

    def __init__(self, max_bytes: int = RECORD_MAX_BYTES, *, seed: int | None = None) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.seed = seed
        self.events: list[dict[str, Any]] = []
        self.bytes = 0
        self.cut_events = 0
        self.dropped_events = 0

    # ------------------------------------------------------------------ noting

    def reset(self, task: Mapping[str, Any] | None, observation: Any, info: Mapping[str, Any]) -> None:
        self._add({"kind": "reset", "task": task, "observation": observation, "info": info})

    def step(self, action: str, observation: Any, reward: float, terminated: bool, truncated: bool,
             info: Mapping[str, Any]) -> None:
        self._add({"kind": "step", "action": action, "observation": observation, "reward": reward,
                   "terminated": terminated, "truncated": truncated, "info": info})

    def generate(self, prompt_tokens: int, sampling: SamplingParams, completion: Completion) -> None:
        self._add({"kind": "generate", "seed": sampling.seed, "prompt_tokens": prompt_tokens,
                   "tokens": len(completion.tokens), "finish_reason": completion.finish_reason})

    def _add(self, event: dict[str, Any]) -> None:
        text = _dumps(event)
        left = self.max_bytes - self.bytes
        if len(text.encode()) > left:
            self.cut_events += 1
            fitted = _fit(json.loads(text), left)
            if fitted is None:  # not even its kind fits: counted, not kept
                self.dropped_events += 1
                return
            text = fitted
        self.events.append(json.loads(text))
        self.bytes += len(text.encode())

    # ------------------------------------------------------------------ reading

    @property
    def truncated(self) -> bool:
        return self.cut_events > 0

    def to_dict(self) -> dict[str, Any]:
        return {"events": self.events, "seed": self.seed, "bytes": self.bytes, "max_bytes": self.max_bytes,
                "truncated": self.truncated, "cut_events": self.cut_events,
                "dropped_events": self.dropped_events}


@contextlib.contextmanager
def recording(max_bytes: int = RECORD_MAX_BYTES, *, seed: int | None = None) -> Iterator[EpisodeRecord]:
    """Open the record of the episode that runs in this task (and the tasks it starts)."""
    record = EpisodeRecord(max_bytes, seed=seed)
    token = _current.set(record)
    try:
        yield record
    finally:
        _current.reset(token)


def current_record() -> EpisodeRecord | None:
    """The record of the episode running in this task, or None (nothing is recorded)."""
    return _current.get()


def reward_input(record: Mapping[str, Any]) -> Any:
    """The ``RewardInput`` the env's rubric scored at the end of the recorded episode: the last
    action, the task, the transcript (opening messages, then each action and the messages it
    got back) and the facts (the latest value of each); None when the record holds no step or
    a cut or dropped event (what was cut cannot be scored again)."""
    from agentrl.env.rewards import RewardInput

    task: dict[str, Any] = {}
    transcript: list[dict[str, Any]] = []
    facts: dict[str, Any] = {}
    response = None
    if record.get("dropped_events"):
        return None
    for event in record.get("events") or []:
        if event.get("cut"):
            return None
        if event["kind"] == "reset":
            task = dict(event.get("task") or {})
            transcript = list(event.get("observation") or [])
        elif event["kind"] == "step":
            response = event["action"]
            transcript.append({"role": "assistant", "content": response})
            transcript.extend(event.get("observation") or [])
            facts.update({k: v for k, v in (event.get("info") or {}).items() if k not in NOT_FACTS})
    if response is None:
        return None
    return RewardInput(response, task, transcript, facts)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=repr, allow_nan=True)


def _fit(event: dict[str, Any], budget: int) -> str | None:
    """``event``, marked ``"cut": true``, with its strings cut until its JSON fits ``budget``
    bytes; its kind alone when even short strings do not fit; None when not even that fits."""
    event = {**event, "cut": True}
    cap = max((len(s) for s in _strings(event)), default=0)
    while cap > 16:
        cap //= 2
        text = _dumps(_cut(event, cap))
        if len(text.encode()) <= budget:
            return text
    marker = _dumps({"kind": event.get("kind"), "cut": True})
    return marker if len(marker.encode()) <= budget else None


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _cut(value: Any, cap: int) -> Any:
    if isinstance(value, str) and len(value) > cap:
        head = cap // 2
        return f"{value[:head]}…[{len(value) - cap} chars cut]…{value[len(value) - (cap - head):]}"
    if isinstance(value, dict):
        return {k: _cut(v, cap) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut(v, cap) for v in value]
    return value
