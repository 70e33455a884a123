"""The episode log: every generation of a run written down, so a resumed run replays, not redoes.

What it is: ``EpisodeLog``, an append-only JSON-lines file (``RUN_DIR/rollout/episodes.jsonl``)
with one line per event of an episode, keyed ``"<row>:<sample>"``: a generation call that
finished, the tokens so far of one that was interrupted (a weight update aborts running
requests; RemoteEngine reports what came back), and the episode's finished trajectories. And
``ReplayClient``, the ``InferenceClient`` each episode of the executor talks to: for call i of
an episode it returns the logged completion when the prompt and sampling settings are the
same as logged, continues a logged partial one from its last token, and otherwise generates
(and logs) afresh. Workflows and environments are deterministic given the model's outputs
(envs reset from the row; tools are replayed by running them again), so replaying the logged
outputs walks an episode back to where it was. Tokens keep the versions that sampled them, so
the trainer's staleness filter still sees their true age.

Why: a run that crashes keeps every generation it finished — in the queue, in a half-done
group, or in the middle of a multi-turn episode — and ``agentrl train --resume`` picks them up
(AReaL and verl lose in-flight rollouts on a restart). What it is not: a cache across runs or
across different data; ``compact`` (at each checkpoint) drops what was trained on.

External agents (the gateway) are not replayed: their episodes in flight at a crash are lost,
and counted.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agentrl.api import Completion, InferenceClient, SamplingParams, Trajectory
from agentrl.client.sglang_backend import sampling_params
from agentrl.rollout.record import current_record


def call_digest(input_ids: Sequence[int], sampling: SamplingParams) -> str:
    """What a logged call is matched on: the exact prompt and the sampling settings (spelt as
    SGLang's, whatever the engine: the digests of episode logs written so far stay valid)."""
    payload = json.dumps([list(input_ids), sampling_params(sampling)], separators=(",", ":"))
    return hashlib.sha1(payload.encode()).hexdigest()


@dataclass
class CallRecord:
    digest: str
    completion: Completion
    partial: bool


class EpisodeLog:
    """Append-only log of a run's generations, indexed by episode key (see the module doc)."""

    def __init__(self, path: str | Path, *, keep: Callable[[str], bool] | None = None) -> None:
        """Open (and load) ``path``; with ``keep``, only the keys it accepts are loaded."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._calls: dict[str, list[CallRecord]] = {}
        self._finished: dict[str, list[Trajectory]] = {}
        if self.path.exists():
            self._load(keep)
        self._file = self.path.open("a", buffering=1)  # a line survives the process being killed

    def _load(self, keep: Callable[[str], bool] | None) -> None:
        with self.path.open() as f:
            for line in f:
                try:
                    ev = json.loads(line)
                except json.JSONDecodeError:  # a line cut short by a crash
                    continue
                key = ev["key"]
                if keep is not None and not keep(key):
                    continue
                if ev["kind"] == "episode":
                    self._finished[key] = [Trajectory.from_dict(d) for d in ev["trajectories"]]
                elif ev["kind"] == "call":
                    self._apply_call(key, ev["index"], CallRecord(ev["digest"], Completion(**ev["completion"]),
                                                                  ev["partial"]))
                elif ev["kind"] == "forget":
                    self._calls.pop(key, None)
                    self._finished.pop(key, None)

    def _apply_call(self, key: str, index: int, record: CallRecord) -> None:
        calls = self._calls.setdefault(key, [])
        del calls[index:]  # a new record for call i replaces it and anything logged after it
        calls.append(record)

    def _write(self, event: dict[str, Any]) -> None:
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")

    # ------------------------------------------------------------------ reading

    def call(self, key: str, index: int) -> CallRecord | None:
        calls = self._calls.get(key, [])
        return calls[index] if index < len(calls) else None

    def finished(self, key: str) -> list[Trajectory] | None:
        """The logged trajectories of a finished episode (fresh copies), or None."""
        done = self._finished.get(key)
        return None if done is None else [Trajectory.from_dict(t.to_dict()) for t in done]

    def keys(self) -> set[str]:
        return set(self._calls) | set(self._finished)

    # ------------------------------------------------------------------ writing

    def record_call(self, key: str, index: int, digest: str, completion: Completion, *, partial: bool) -> None:
        self._apply_call(key, index, CallRecord(digest, completion, partial))
        self._write({"kind": "call", "key": key, "index": index, "digest": digest, "partial": partial,
                     "completion": {"tokens": completion.tokens, "logprobs": completion.logprobs,
                                    "versions": completion.versions, "finish_reason": completion.finish_reason,
                                    "matched_stop": completion.matched_stop}})

    def record_episode(self, key: str, trajectories: Sequence[Trajectory]) -> None:
        self._finished[key] = list(trajectories)
        self._calls.pop(key, None)  # the trajectories hold everything the calls did
        self._write({"kind": "episode", "key": key, "trajectories": [t.to_dict() for t in trajectories]})

    def forget(self, keys: Sequence[str]) -> None:
        """Drop episodes that will never be needed again (trained on, or filtered out)."""
        for key in keys:
            if key in self._calls or key in self._finished:
                self._calls.pop(key, None)
                self._finished.pop(key, None)
                self._write({"kind": "forget", "key": key})

    def compact(self) -> None:
        """Rewrite the file with only what is still held (atomically: a crash keeps the old one)."""
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w") as f:
            old, self._file = self._file, f
            for key, calls in self._calls.items():
                for i, rec in enumerate(calls):
                    self.record_call(key, i, rec.digest, rec.completion, partial=rec.partial)
            for key, done in list(self._finished.items()):
                self.record_episode(key, done)
            f.flush()
            os.fsync(f.fileno())
        old.close()
        os.replace(tmp, self.path)
        self._file = self.path.open("a", buffering=1)

    def close(self) -> None:
        self._file.close()


class ReplayClient:
    """One episode's ``InferenceClient``: logged generations first, the engine for the rest."""

    def __init__(self, engine: InferenceClient, log: EpisodeLog, key: str) -> None:
        self.engine, self.log, self.key = engine, log, key
        self.calls = 0
        self.replayed_tokens = 0

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *,
                       on_progress: Callable[[Completion], None] | None = None) -> Completion:
        index = self.calls
        self.calls += 1
        digest = call_digest(input_ids, sampling)
        rec = self.log.call(self.key, index)
        prefix = None
        if rec is not None and rec.digest == digest and not rec.partial:
            self.replayed_tokens += len(rec.completion.tokens)
            completion = rec.completion
        else:
            if rec is not None and rec.digest == digest:
                prefix = rec.completion
            completion = await self._generate(list(input_ids), sampling, prefix, index, digest, on_progress)
            self.log.record_call(self.key, index, digest, completion, partial=False)
        record = current_record()  # the episode's record notes the call's seed and sizes
        if record is not None:
            record.generate(len(input_ids), sampling, completion)
        return completion

    async def _generate(self, prompt: list[int], sampling: SamplingParams, prefix: Completion | None,
                        index: int, digest: str, on_progress: Callable[[Completion], None] | None) -> Completion:
        done = prefix or Completion([], [], [], "abort")

        def progress(partial: Completion) -> None:
            so_far = _join(done, partial)
            self.log.record_call(self.key, index, digest, so_far, partial=True)
            if on_progress is not None:
                on_progress(so_far)

        remaining = sampling.max_new_tokens - len(done.tokens)
        if prefix is not None:
            self.replayed_tokens += len(prefix.tokens)
            if remaining <= 0:
                return replace(prefix, finish_reason="length")
        rest_sampling = replace(sampling, max_new_tokens=remaining)
        rest = await self.engine.generate(prompt + done.tokens, rest_sampling, on_progress=progress)
        return _join(done, rest)


def _join(head: Completion, tail: Completion) -> Completion:
    return Completion(head.tokens + tail.tokens, head.logprobs + tail.logprobs, head.versions + tail.versions,
                      tail.finish_reason, tail.matched_stop)
