"""Teacher: the student's sampled trajectories scored token by token by a teacher server.

What it is: the rollout side's client of the teacher of on-policy distillation
(``trainer.distill``, ``agentrl.trainer.distill``). ``Teacher.check_tokenizer()`` refuses a
teacher whose tokenizer differs from the student's; ``Teacher.score(trajectories)`` asks the
teacher for the log-probability of every token of each finished trajectory (prompt and
response, scored as one prompt: nothing is generated) and records it on the trajectory
(``Trajectory.teacher_logprobs``, 0.0 off the sampled tokens). The request is the engine's own
(``RemoteEngine.prompt_logprobs``): SGLang's and ``agentrl serve``'s ``POST /generate`` with
``max_new_tokens: 0``, ``return_logprob`` and ``logprob_start_len: 0``; vLLM's
``POST /v1/completions`` with ``prompt_logprobs: 0``.

Where it runs: ``agentrl.run.rollout_side.LocalRollout.next_batch``, when a batch of finished
groups is handed to the trainer (docs/DESIGN.md, "On-policy distillation": why there).
Async discipline: at most ``teacher.max_concurrent`` requests in flight, each with
``teacher.timeout_s`` and ``teacher.max_retries`` retries of transport errors and 5xx answers.
A trajectory the teacher still cannot score is data, not a crash: its status becomes
``inference_error`` (counted by the trainer, never trained on) with the reason in ``error``.

Tokenizers must match: the teacher scores the student's token ids. The check tokenizes one
probe text (a chat-templated message with digits, punctuation and non-ASCII text) on both
sides and compares the ids. What it is not: a cross-tokenizer distillation (no byte or
text alignment between different vocabularies).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from typing import Any

from agentrl.api import Trajectory, TrajectoryStatus
from agentrl.errors import AgentRLError, ConfigError
from agentrl.trainer.distill import TeacherConfig

PROBE = "Teacher check: 12 + 34 = 46, x*y - 7/3; naïve café ≠ 東京 🙂\n\tend."
"""The text both tokenizers must turn into the same ids (inside the student's chat template)."""


class Teacher:
    """The teacher server's client (see the module docstring). ``Teacher(config, student_model)``;
    ``await check_tokenizer()`` once, then ``await score(trajectories)`` per batch; ``aclose()``."""

    def __init__(self, config: TeacherConfig, student_model: str, *, transport: Any = None) -> None:
        from agentrl.client import RemoteEngine

        self.config, self.student_model = config, student_model
        self.engine = RemoteEngine(config.url, engine=config.engine, timeout=config.timeout_s,
                                   max_retries=config.max_retries, batch_max_new_tokens=0,
                                   api_key=os.environ.get(config.api_key_env, ""), transport=transport)
        self._gate = asyncio.Semaphore(config.max_concurrent)
        self.counters = {"scored": 0, "failed": 0, "tokens": 0, "busy_s": 0.0}

    async def check_tokenizer(self) -> None:
        """Raise ``ConfigError`` unless the teacher tokenizes the probe exactly as the student does."""
        from agentrl.rollout.renderer import load_tokenizer

        tok = load_tokenizer(self.student_model)
        text = PROBE
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template([{"role": "user", "content": PROBE}], tokenize=False,
                                           add_generation_prompt=True)
        ours = list(tok.encode(text))
        try:
            theirs = await self.engine.tokenize(text)
        except AgentRLError as e:
            raise ConfigError(f"config key 'trainer.distill.teacher.url': the teacher at {self.config.url} did not "
                              f"answer the tokenizer check ({e}); is it up, and is teacher.engine right?") from e
        if theirs != ours:
            at = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))
            raise ConfigError(
                f"config key 'trainer.distill.teacher.url': the teacher at {self.config.url} tokenizes differently "
                f"from the student {self.student_model!r} (first difference at token {at}: "
                f"student {ours[at:at + 5]}, teacher {theirs[at:at + 5]}). On-policy distillation scores the "
                "student's token ids with the teacher, so both must use the same tokenizer: serve a teacher of "
                "the student's model family")

    async def score(self, trajectories: Sequence[Trajectory]) -> None:
        """Record the teacher's log-probabilities on every OK trajectory with a sampled token (in
        place); one the teacher cannot score becomes an ``inference_error``."""
        todo = [t for t in trajectories if t.status is TrajectoryStatus.OK and t.num_sampled > 0
                and t.teacher_logprobs is None]
        t0 = time.perf_counter()
        await asyncio.gather(*(self._score_one(t) for t in todo))
        self.counters["busy_s"] += time.perf_counter() - t0

    async def _score_one(self, t: Trajectory) -> None:
        async with self._gate:
            try:
                lps = await self.engine.prompt_logprobs(t.input_ids)
            except AgentRLError as e:
                self.counters["failed"] += 1
                t.status, t.error = TrajectoryStatus.INFERENCE_ERROR, f"the teacher could not score it: {e}"
                return
        t.teacher_logprobs = teacher_row(lps, t.loss_mask)
        self.counters["scored"] += 1
        self.counters["tokens"] += t.num_sampled

    def metrics(self) -> dict[str, float]:
        """``teacher/scored``, ``teacher/failed``, ``teacher/tokens``, ``teacher/busy_s`` so far."""
        return {f"teacher/{k}": float(v) for k, v in self.counters.items()}

    async def aclose(self) -> None:
        await self.engine.aclose()


def teacher_row(logprobs: Sequence[float | None], loss_mask: Sequence[int]) -> list[float]:
    """A ``Trajectory.teacher_logprobs`` row: the teacher's log-probability on sampled tokens,
    0.0 elsewhere (and on the first token, which nothing predicts)."""
    if len(logprobs) != len(loss_mask):
        raise ValueError(f"the teacher scored {len(logprobs)} tokens of a trajectory of {len(loss_mask)}")
    return [min(0.0, float(lp)) if m and lp is not None else 0.0 for lp, m in zip(logprobs, loss_mask, strict=True)]
