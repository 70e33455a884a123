"""The contracts every part of agentrl meets (DESIGN.md §3).

What is here: the data that crosses boundaries (Trajectory, Completion, SamplingParams,
ExecRequest, ExecResult) and the small protocols that environments, workflows, inference
clients and sandboxes implement. What is not: any implementation. This module imports
neither torch nor httpx (an import-linter contract enforces it), so an environment author's
install stays light.

The main hook for a new task is `Workflow.arun_episode`; for new execution backends,
`Sandbox.run` and `Sandbox.session`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from agentrl.errors import TrajectoryError

NOT_SAMPLED = -1
"""Version stamped on tokens the policy did not sample (prompt, environment, tool output)."""


# --------------------------------------------------------------------------- trajectories


class TrajectoryStatus(enum.StrEnum):
    """Why a trajectory is (or is not) usable for the loss. Only OK enters the loss."""

    OK = "ok"
    ENV_ERROR = "env_error"  # the environment raised
    SANDBOX_ERROR = "sandbox_error"  # the execution backend failed
    INFERENCE_ERROR = "inference_error"  # the inference server failed for good
    TIMEOUT = "timeout"  # the episode ran past its wall-time budget
    STALE = "stale"  # dropped by the trainer: older than the staleness bound allows


@dataclass
class Trajectory:
    """One training sequence: the whole token stream of one episode (or one segment of it).

    Invariants, checked on construction:
      * ``input_ids``, ``loss_mask``, ``logprobs`` and ``versions`` have equal length;
      * ``loss_mask`` holds only 0/1 and ``versions`` is ``NOT_SAMPLED`` exactly where
        ``loss_mask`` is 0 (and a version >= 0 where it is 1);
      * ``logprobs`` are finite and <= 0 on sampled tokens and 0.0 elsewhere.

    A trajectory with a failure ``status`` keeps whatever tokens it has (possibly none)
    and is counted, never trained on.
    """

    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]
    reward: float = 0.0
    group_id: str = ""
    episode_id: str = ""
    num_turns: int = 1
    status: TrajectoryStatus = TrajectoryStatus.OK
    metrics: dict[str, float] = field(default_factory=dict)
    error: str = ""  # what went wrong, when status is not OK

    def __post_init__(self) -> None:
        self.status = TrajectoryStatus(self.status)
        n = len(self.input_ids)
        lengths = {
            "loss_mask": len(self.loss_mask),
            "logprobs": len(self.logprobs),
            "versions": len(self.versions),
        }
        bad = {k: v for k, v in lengths.items() if v != n}
        if bad:
            raise TrajectoryError(
                f"Trajectory fields must all have len(input_ids)={n}, got {bad}"
            )
        for i, (m, v, lp) in enumerate(zip(self.loss_mask, self.versions, self.logprobs, strict=True)):
            if m not in (0, 1):
                raise TrajectoryError(f"loss_mask[{i}] must be 0 or 1, got {m!r}")
            if m == 0 and v != NOT_SAMPLED:
                raise TrajectoryError(
                    f"versions[{i}]={v} but loss_mask[{i}]=0: tokens the policy did not "
                    f"sample carry version {NOT_SAMPLED}"
                )
            if m == 1 and v < 0:
                raise TrajectoryError(
                    f"versions[{i}]={v} but loss_mask[{i}]=1: sampled tokens carry the "
                    "policy version (>= 0) that produced them"
                )
            if m == 1 and not (math.isfinite(lp) and lp <= 1e-6):
                raise TrajectoryError(f"logprobs[{i}]={lp!r}: a log-probability is finite and <= 0")
            if m == 0 and lp != 0.0:
                raise TrajectoryError(
                    f"logprobs[{i}]={lp!r} on a token with loss_mask 0; use 0.0 there"
                )
        if not math.isfinite(self.reward):
            raise TrajectoryError(f"reward must be finite, got {self.reward!r}")

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_sampled(self) -> int:
        """Number of tokens the policy sampled (the loss tokens)."""
        return sum(self.loss_mask)

    @property
    def oldest_version(self) -> int:
        """Oldest policy version among sampled tokens; NOT_SAMPLED when there are none."""
        sampled = [v for v in self.versions if v != NOT_SAMPLED]
        return min(sampled) if sampled else NOT_SAMPLED

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Trajectory:
        return cls(**dict(d))

    @classmethod
    def failed(
        cls, status: TrajectoryStatus, *, group_id: str = "", episode_id: str = "", error: str = ""
    ) -> Trajectory:
        """An empty trajectory that records a failed episode (counted, never trained on)."""
        if status is TrajectoryStatus.OK:
            raise TrajectoryError("Trajectory.failed needs a failure status, got OK")
        return cls([], [], [], [], 0.0, group_id, episode_id, 0, status, {}, error)


# --------------------------------------------------------------------------- generation


FinishReason = Literal["stop", "length", "abort"]


@dataclass
class SamplingParams:
    """Sampling settings of one generation request, in SGLang's vocabulary.

    ``temperature == 0`` means greedy. ``top_k == -1`` means no top-k cut. ``seed`` is
    sent as SGLang's ``sampling_seed``.
    """

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (no cut) or >= 1, got {self.top_k}")

    def to_sglang(self) -> dict[str, Any]:
        """The ``sampling_params`` object of SGLang's ``POST /generate``."""
        out: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "ignore_eos": self.ignore_eos,
        }
        if self.stop:
            out["stop"] = list(self.stop)
        if self.stop_token_ids:
            out["stop_token_ids"] = list(self.stop_token_ids)
        if self.seed is not None:
            out["sampling_seed"] = self.seed
        return out


@dataclass
class Completion:
    """What one generation request produced, interruption already hidden.

    ``tokens`` include the stop token when the model stopped on one. ``versions[i]`` is
    the policy version that sampled ``tokens[i]``; it can change mid-completion when a
    weight update interrupted the request.
    """

    tokens: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason
    matched_stop: int | str | None = None

    def __post_init__(self) -> None:
        if not (len(self.tokens) == len(self.logprobs) == len(self.versions)):
            raise TrajectoryError(
                f"Completion fields must have equal length: tokens={len(self.tokens)}, "
                f"logprobs={len(self.logprobs)}, versions={len(self.versions)}"
            )


@runtime_checkable
class InferenceClient(Protocol):
    """Token-in, token-out generation against one or more inference servers.

    Implementations hide interruption: a request aborted by a weight update is resumed
    (prompt + tokens so far, remaining budget) until it really finishes.
    """

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams) -> Completion: ...


@runtime_checkable
class ChatClient(Protocol):
    """The inference engine behind the ``openai`` SDK's interface, recording one episode.

    ``chat.completions.create(messages=..., tools=..., ...)`` (and ``responses.create``)
    answer with the SDK's own types, while every call's exact token ids, logprobs and versions
    are recorded: each call renders only the messages new since an earlier call onto the
    tokens already sampled, and starts a new segment where the conversation does not extend.
    Rewards name calls by the answer's ``id``; ``apply_reward_discount(γ)`` sets
    R_i = r_i + γ·R_{i+1} backwards over the calls. ``export_trajectories("concat")`` gives one
    trajectory per segment (tokens between calls masked out), ``"individual"`` one per call.
    """

    @property
    def chat(self) -> Any: ...

    def set_reward(self, completion_id: str, reward: float) -> None: ...

    def set_last_reward(self, reward: float) -> None: ...

    def apply_reward_discount(self, gamma: float) -> None: ...

    def export_trajectories(self, style: Literal["concat", "individual"] = "concat") -> list[Trajectory]: ...


@runtime_checkable
class Workflow(Protocol):
    """How one episode is played. Grouping (n samples per prompt) is the executor's job.

    Returns the episode's trajectories, or None to reject the episode on purpose.
    """

    async def arun_episode(
        self, client: InferenceClient, row: Mapping[str, Any]
    ) -> list[Trajectory] | None: ...


# --------------------------------------------------------------------------- execution


class ExecStatus(enum.StrEnum):
    """Outcome of running one program in a sandbox."""

    OK = "ok"  # exited with code 0
    RUNTIME_ERROR = "runtime_error"  # non-zero exit or killed by a signal of its own doing
    TIMEOUT = "timeout"  # wall or CPU time limit hit
    MEMORY = "memory"  # memory limit hit
    OUTPUT_LIMIT = "output_limit"  # wrote more than the output cap
    SANDBOX_ERROR = "sandbox_error"  # the backend failed; the program is not to blame


@dataclass
class ExecRequest:
    """One program to run. ``files`` (text) and ``files_b64`` (binary, base64-encoded) are
    written into the work dir before it starts; ``fetch`` names work-dir files to return
    afterwards."""

    code: str
    language: Literal["python", "bash"] = "python"
    stdin: str = ""
    files: dict[str, str] = field(default_factory=dict)
    files_b64: dict[str, str] = field(default_factory=dict)
    fetch: list[str] = field(default_factory=list)
    time_limit_s: float = 10.0
    memory_limit_mb: int = 512
    output_limit_bytes: int = 1 << 16

    def __post_init__(self) -> None:
        if self.language not in ("python", "bash"):
            raise ValueError(f"language must be 'python' or 'bash', got {self.language!r}")
        if not self.time_limit_s > 0:
            raise ValueError(f"time_limit_s must be > 0, got {self.time_limit_s}")
        if self.memory_limit_mb < 16:
            raise ValueError(f"memory_limit_mb must be >= 16, got {self.memory_limit_mb}")
        if self.output_limit_bytes < 1:
            raise ValueError(f"output_limit_bytes must be >= 1, got {self.output_limit_bytes}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ExecRequest:
        return cls(**dict(d))


@dataclass
class ExecResult:
    """What running one program produced. stdout/stderr are capped while being read."""

    status: ExecStatus
    exit_code: int | None = None
    signal: int | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    wall_s: float = 0.0
    cpu_s: float = 0.0
    peak_memory_mb: float = 0.0
    files: dict[str, str] = field(default_factory=dict)
    error: str = ""  # the backend's explanation when status is SANDBOX_ERROR

    def __post_init__(self) -> None:
        self.status = ExecStatus(self.status)

    @property
    def ok(self) -> bool:
        return self.status is ExecStatus.OK

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ExecResult:
        return cls(**dict(d))


@runtime_checkable
class SandboxSession(Protocol):
    """State kept across the turns of one episode (a persistent interpreter)."""

    async def run(self, request: ExecRequest) -> ExecResult: ...


@runtime_checkable
class Sandbox(Protocol):
    """Runs untrusted programs. ``run`` is stateless; ``session`` keeps state for one episode
    and is destroyed when the ``async with`` block exits, also on failure."""

    async def run(self, request: ExecRequest) -> ExecResult: ...

    def session(self) -> AbstractAsyncContextManager[SandboxSession]: ...


Message = dict[str, Any]
"""A chat message: ``{"role": ..., "content": ..., ...}`` as in the OpenAI API."""

__all__ = [
    "NOT_SAMPLED",
    "ChatClient",
    "Completion",
    "ExecRequest",
    "ExecResult",
    "ExecStatus",
    "FinishReason",
    "InferenceClient",
    "Message",
    "SamplingParams",
    "Sandbox",
    "SandboxSession",
    "Trajectory",
    "TrajectoryStatus",
    "Workflow",
]
