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
import zlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field, fields, replace
from itertools import compress
from typing import Any, Literal, Protocol, get_args, runtime_checkable

from agentrl.config import check_options, option
from agentrl.errors import TrajectoryError

NOT_SAMPLED = -1
"""Version stamped on tokens the policy did not sample (prompt, environment, tool output)."""
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
"""A LoRA adapter directory's two files, in peft's format: what a LoRA run publishes and checkpoints
(``agentrl.trainer.lora``) and what ``agentrl serve`` merges (``agentrl.inference.lora_adapter``)."""


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

    Invariants, checked on construction (a ``TrajectoryError`` names the field and index):
      * ``input_ids``, ``loss_mask``, ``logprobs`` and ``versions`` are plain lists of equal
        length, of Python ints (floats for ``logprobs``) — a bool, a float version or a
        string token id is refused, not coerced;
      * token ids are >= 0; ``loss_mask`` holds only 0/1 and ``versions`` is ``NOT_SAMPLED``
        exactly where ``loss_mask`` is 0 (and a version >= 0 where it is 1);
      * ``logprobs`` are finite and <= 0 on sampled tokens and 0.0 elsewhere;
      * ``teacher_logprobs``, when set, has one float per token: a log-probability on sampled
        tokens, 0.0 elsewhere;
      * ``reward`` is a finite number, ``num_turns`` an int >= 0, ids and ``error`` strings,
        ``metrics`` a dict of str to numbers, ``record`` a dict (JSON-like) or None.

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
    record: dict[str, Any] | None = None  # the episode's environment inputs and outputs (agentrl.rollout.record),
    # on its first trajectory; None where nothing was recorded
    teacher_logprobs: list[float] | None = None  # on-policy distillation (trainer.distill): the teacher's
    # log-probability of each token, aligned with input_ids, 0.0 where loss_mask is 0; None: not scored
    turn_rewards: list[float] | None = None  # one reward per turn (a run of sampled tokens, ``sampled_spans``),
    # summing to at most ``reward``'s share of them; None: the reward comes at the end (``agentrl.trainer.turns``);
    # the built-in workflows' trajectories carry their calls' own rewards (``TokenConversation.export``)
    turn_states: list[str] | None = None  # one key per turn naming the state the turn acted in: turns of one
    # group with equal keys are compared with each other (GiGPO's step groups); None: no state is shared

    def __post_init__(self) -> None:
        try:
            self.status = TrajectoryStatus(self.status)
        except ValueError:
            raise TrajectoryError(
                f"Trajectory.status must be one of {[s.value for s in TrajectoryStatus]}, got {self.status!r}"
            ) from None
        _check_scalars(self)
        _check_lists("Trajectory", ("input_ids", "loss_mask", "logprobs", "versions"),
                     (self.input_ids, self.loss_mask, self.logprobs, self.versions))
        if not _trajectory_tokens_ok(self.input_ids, self.loss_mask, self.logprobs, self.versions):
            _explain_trajectory(self.input_ids, self.loss_mask, self.logprobs, self.versions)
        if self.teacher_logprobs is not None:
            _check_teacher(self.teacher_logprobs, self.loss_mask)
        if self.turn_rewards is not None or self.turn_states is not None:
            _check_turns(self)

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
        """Plain JSON-ready values, copied (``dataclasses.asdict``'s result, at a fraction of its
        cost on token lists: the journal writes every finished episode this way)."""
        d = {f.name: list(getattr(self, f.name)) if f.name in _TOKEN_FIELDS else _plain(getattr(self, f.name))
             for f in fields(self)}  # the token fields: lists of numbers, checked when it was made
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



_TOKEN_FIELDS = ("input_ids", "loss_mask", "logprobs", "versions")


def _check_teacher(lps: Any, mask: list[int]) -> None:
    """``Trajectory.teacher_logprobs``: one float per token, a log-probability on sampled tokens, 0.0 elsewhere."""
    if not isinstance(lps, list) or len(lps) != len(mask):
        raise TrajectoryError(f"Trajectory.teacher_logprobs must be a list of len(input_ids)={len(mask)} floats, "
                              f"got {_shown(lps)}")
    for i, (m, lp) in enumerate(zip(mask, lps, strict=True)):
        if m == 1 and not _is_logprob(lp) or m == 0 and lp != 0.0:
            raise TrajectoryError(f"Trajectory.teacher_logprobs[{i}]={lp!r}: expected a finite log-probability "
                                  "<= 0 on a sampled token and 0.0 where loss_mask is 0")


def _plain(value: Any) -> Any:
    """A copy of ``value`` made of lists and dicts (what ``dataclasses.asdict`` gives a field)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value

# --------------------------------------------------------------------------- generation


FinishReason = Literal["stop", "length", "abort"]


MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")
"""SGLang's names for what ``/release_memory_occupation`` frees and ``/resume_memory_occupation``
takes back (vLLM's ``/wake_up`` takes the first two). On ``agentrl serve``: ``kv_cache`` the slot
cache and the prefix pool, ``weights`` the spare copies kept for staging (the served weights
stay), ``cuda_graph`` nothing (it has none)."""


def continuation_seed(seed: int, offset: int) -> int:
    """The sampling seed of a seeded generation's continuation after ``offset`` tokens: the
    seed itself at 0, another stream for each later offset (a stable hash of both)."""
    return seed if offset == 0 else zlib.crc32(f"{seed}@{offset}".encode()) & 0x7FFFFFFF


@dataclass
class SamplingParams:
    """Sampling settings of one generation request, in SGLang's vocabulary (its names, defaults
    and ranges: ``python/sglang/srt/sampling/sampling_params.py``).

    ``temperature == 0`` means greedy. ``top_k == -1`` means no top-k cut. ``seed`` seeds
    this request's sampling. ``min_p`` drops tokens less likely than ``min_p``
    times the most likely one; ``frequency_penalty``/``presence_penalty`` (in [-2, 2]) lower a
    token's logit by that much per occurrence / once if it occurred in the output so far,
    ``repetition_penalty`` (in (0, 2], 1 = none) divides a positive logit (multiplies a
    negative one) of a token that occurred; ``min_new_tokens`` forbids EOS and
    ``stop_token_ids`` before that many tokens; ``stop_regex`` ends the output where a pattern
    matches; ``logit_bias`` adds to the logits of token ids. Only the settings that differ
    from their defaults are sent: each engine's backend maps them onto its wire
    (``agentrl.client.sglang_backend``, ``vllm_backend``).
    """

    max_new_tokens: int = option(128, help="token budget of one generation call")
    temperature: float = option(1.0, help="sampling temperature; 0 is greedy")
    top_p: float = option(1.0, help="nucleus sampling mass, in (0, 1]")
    top_k: int = option(-1, help="keep the k most likely tokens; -1 keeps all")
    stop: list[str] = option([], help="strings that end the output")
    stop_token_ids: list[int] = option([], help="token ids that end the output (besides EOS)")
    ignore_eos: bool = option(False, help="go on past EOS until max_new_tokens")
    seed: int | None = option(None, help="seed of this request's sampling (SGLang's sampling_seed)")
    min_p: float = option(0.0, help="drop tokens less likely than min_p times the most likely one")
    frequency_penalty: float = option(0.0, help="lower a token's logit this much per occurrence, in [-2, 2]")
    presence_penalty: float = option(0.0, help="lower a token's logit this much once it occurred, in [-2, 2]")
    repetition_penalty: float = option(1.0, help="divide the positive logits of tokens that occurred, in (0, 2]")
    min_new_tokens: int = option(0, help="no EOS or stop token before this many tokens")
    stop_regex: list[str] = option([], help="patterns that end the output where they match (not on vLLM)")
    logit_bias: dict[int, float] = option({}, help="added to the logits of these token ids")

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (no cut) or >= 1, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0 < self.repetition_penalty <= 2:
            raise ValueError(f"repetition_penalty must be in (0, 2] (1 = none), got {self.repetition_penalty}")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(f"min_new_tokens must be in [0, max_new_tokens={self.max_new_tokens}], "
                             f"got {self.min_new_tokens}")
        if not all(math.isfinite(v) for v in self.logit_bias.values()):
            raise ValueError("logit_bias values must be finite numbers")

    def continued(self, done: int, budget: int | None = None) -> SamplingParams:
        """The settings of the rest of a generation that has ``done`` tokens already (a request
        resumed after an interruption, or deterministic mode's next chunk), at most ``budget``
        more: what is left of the token budget and of ``min_new_tokens``, and, if seeded, a seed
        of its own (``continuation_seed``; the same seed again would repeat the first part's
        random numbers). Nothing done and no smaller budget: these settings themselves."""
        left = self.max_new_tokens - done
        n = left if budget is None else min(budget, left)
        if done == 0 and n == self.max_new_tokens:  # every first request: no copy to validate again
            return self
        return replace(self, max_new_tokens=n, min_new_tokens=min(n, max(0, self.min_new_tokens - done)),
                       seed=None if self.seed is None else continuation_seed(self.seed, done))


@dataclass
class Completion:
    """What one generation request produced, interruption already hidden.

    ``tokens`` include the stop token when the model stopped on one. ``versions[i]`` is
    the policy version that sampled ``tokens[i]``; it can change mid-completion when a
    weight update interrupted the request. Checked on construction like a Trajectory: plain
    lists of equal length, token ids and versions ints >= 0, log-probabilities finite and
    <= 0, ``finish_reason`` one of ``FinishReason``.
    """

    tokens: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason
    matched_stop: int | str | None = None

    def __post_init__(self) -> None:
        if self.finish_reason not in _FINISH_REASONS:
            raise TrajectoryError(
                f"Completion.finish_reason must be one of {list(_FINISH_REASONS)}, got {self.finish_reason!r}"
            )
        if not (self.matched_stop is None or type(self.matched_stop) in (int, str)):
            raise TrajectoryError(
                f"Completion.matched_stop must be a token id (int), a stop string or None, "
                f"got {_shown(self.matched_stop)}"
            )
        _check_lists("Completion", ("tokens", "logprobs", "versions"), (self.tokens, self.logprobs, self.versions))
        if not _completion_tokens_ok(self.tokens, self.logprobs, self.versions):
            _explain_completion(self.tokens, self.logprobs, self.versions)


@runtime_checkable
class InferenceClient(Protocol):
    """Token-in, token-out generation against one or more inference servers.

    Implementations hide interruption: a request aborted by a weight update is resumed
    (prompt + tokens so far, remaining budget) until it really finishes; ``on_progress``, if
    given, hears the tokens so far at each interruption. An implementation that gives up
    resuming raises ``agentrl.errors.ResumeLimit``; the finish reason it returns is never
    ``"abort"``.
    """

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *,
                       on_progress: Callable[[Completion], None] | None = None) -> Completion: ...


@runtime_checkable
class ChatAPI(Protocol):
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

    ``arun_episode`` returns the episode's trajectories, or None to reject the episode on
    purpose. ``aclose`` releases what the workflow holds (pooled envs, servers, processes); the
    run calls it once, after the last episode. A workflow that holds nothing may leave it out
    (``agentrl.rollout.workflow_inputs.close_workflow`` closes either kind). A workflow built
    from a run's config declares what it takes from the run in a class attribute
    ``run_inputs`` (``agentrl.rollout.workflow_inputs``).
    """

    async def arun_episode(
        self, client: InferenceClient, row: Mapping[str, Any]
    ) -> list[Trajectory] | None: ...

    async def aclose(self) -> None:
        """Release what the workflow holds (nothing, by default)."""
        return None


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
    afterwards. The fields are the one declaration of the request: the checks here, the
    sandbox service's body parser and its JSON Schema (``agentrl.http_edge.parse_body``,
    ``body_schema``) all read them."""

    code: str = option(help="the program's source")
    language: Literal["python", "bash"] = option("python", help="the interpreter")
    stdin: str = option("", help="the program's standard input")
    files: dict[str, str] = option({}, help="text files written into the work dir first (relative path -> text)")
    files_b64: dict[str, str] = option({}, help="binary files, base64-encoded (relative path -> base64)")
    fetch: list[str] = option([], help="work-dir files returned afterwards (relative paths)")
    time_limit_s: float = option(10.0, help="wall-clock limit in seconds", gt=0)
    memory_limit_mb: int = option(512, help="memory limit in MiB", ge=16)
    output_limit_bytes: int = option(1 << 16, help="most bytes kept of stdout and of stderr, each", ge=1)

    def __post_init__(self) -> None:
        check_options(self)

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


# --------------------------------------------------------------------------- checks
# Trajectories are built by the thousand per training step, so the common case is decided by
# whole-list operations that run in C (type sets, counts, min/max/sum, compress); only when one
# of them fails does a per-token scan run, to name the first offending field and index.

_LOGPROB_SLACK = 1e-6
"""How far above 0 a sampled log-probability may be (rounding in a float32 log-softmax)."""
_FINISH_REASONS = get_args(FinishReason)


def _shown(x: Any) -> str:
    """``x`` and its type, with a hint for numpy and torch scalars (``.tolist()`` gives Python ones)."""
    hint = "" if type(x).__module__ == "builtins" else "; convert with .tolist() or int()/float()"
    return f"{x!r} ({type(x).__name__}){hint}"


def _check_lists(owner: str, names: tuple[str, ...], values: tuple[Any, ...]) -> None:
    for name, v in zip(names, values, strict=True):
        if type(v) is not list:
            raise TrajectoryError(f"{owner}.{name} must be a list, got {type(v).__name__}; pass a plain list "
                                  "of Python numbers (a tensor or an array: call .tolist())")
    n = len(values[0])
    bad = {name: len(v) for name, v in zip(names[1:], values[1:], strict=True) if len(v) != n}
    if bad:
        raise TrajectoryError(f"{owner} fields must all have len({names[0]})={n}, got {bad}")


def sampled_spans(loss_mask: Sequence[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of loss-mask-1 tokens: a trajectory's turns (in a concat
    trajectory, one per call)."""
    spans, start = [], None
    for i, m in enumerate([*loss_mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def _check_turns(t: Trajectory) -> None:
    turns = len(sampled_spans(t.loss_mask))
    if t.turn_rewards is not None and (not isinstance(t.turn_rewards, list) or len(t.turn_rewards) != turns
                                       or not all(_is_number(r) and math.isfinite(r) for r in t.turn_rewards)):
        raise TrajectoryError(f"Trajectory.turn_rewards must be {turns} finite floats, one per turn (run of "
                              f"loss-mask 1 tokens), got {_shown(t.turn_rewards)}")
    if t.turn_states is not None and (not isinstance(t.turn_states, list) or len(t.turn_states) != turns
                                      or not all(isinstance(k, str) for k in t.turn_states)):
        raise TrajectoryError(f"Trajectory.turn_states must be {turns} str keys, one per turn (run of "
                              f"loss-mask 1 tokens), got {_shown(t.turn_states)}")


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _check_scalars(t: Trajectory) -> None:
    if not (isinstance(t.reward, int | float) and not isinstance(t.reward, bool) and math.isfinite(t.reward)):
        raise TrajectoryError(f"Trajectory.reward must be a finite float, got {_shown(t.reward)}")
    for name in ("group_id", "episode_id", "error"):
        if not isinstance(getattr(t, name), str):
            raise TrajectoryError(f"Trajectory.{name} must be a str, got {_shown(getattr(t, name))}")
    if type(t.num_turns) is not int or t.num_turns < 0:
        raise TrajectoryError(f"Trajectory.num_turns must be an int >= 0, got {_shown(t.num_turns)}")
    if not isinstance(t.metrics, dict):
        raise TrajectoryError(f"Trajectory.metrics must be a dict of str to float, got {_shown(t.metrics)}")
    if t.record is not None and not isinstance(t.record, dict):
        raise TrajectoryError(f"Trajectory.record must be a dict or None, got {_shown(t.record)}")
    for k, v in t.metrics.items():
        if not (isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)):
            raise TrajectoryError(f"Trajectory.metrics[{k!r}] must be a float under a str key, got {_shown(v)}")


def _all_of(values: list[Any], *kinds: type) -> bool:
    """Whether every value's type is exactly one of ``kinds`` (so no bool passes for an int)."""
    types = list(map(type, values))  # counted in C, faster than a set of types
    return sum(types.count(k) for k in kinds) == len(values)


def _logprobs_ok(values: list[Any]) -> bool:
    """Finite (else the sum is NaN or infinite) and <= 0 give or take the slack; types checked apart."""
    return not values or (math.isfinite(sum(values)) and max(values) <= _LOGPROB_SLACK)


def _first_bad(field: str, values: list[Any], ok: Any, expected: str) -> None:
    for i, x in enumerate(values):
        if not ok(x):
            raise TrajectoryError(f"{field}[{i}] must be {expected}, got {_shown(x)}")


def _is_logprob(x: Any) -> bool:
    return type(x) in (float, int) and math.isfinite(x) and x <= _LOGPROB_SLACK


def _trajectory_tokens_ok(ids: list[Any], mask: list[Any], lps: list[Any], vers: list[Any]) -> bool:
    n = len(ids)
    sampled = mask.count(1)
    if not (sampled + mask.count(0) == n and vers.count(NOT_SAMPLED) == n - sampled
            and _all_of(mask, int) and _all_of(vers, int) and _all_of(ids, int) and _all_of(lps, float, int)
            and min(ids, default=0) >= 0 and min(compress(vers, mask), default=0) >= 0):
        return False
    # No sampled token has version -1, so the n - sampled -1s are exactly the unsampled tokens;
    # likewise the 0.0 log-probabilities outside the sampled ones must cover every unsampled token.
    sampled_lps = list(compress(lps, mask))
    return _logprobs_ok(sampled_lps) and lps.count(0.0) - sampled_lps.count(0.0) == n - sampled


def _completion_tokens_ok(toks: list[Any], lps: list[Any], vers: list[Any]) -> bool:
    return (_all_of(toks, int) and _all_of(vers, int) and _all_of(lps, float, int)
            and min(toks, default=0) >= 0 and min(vers, default=0) >= 0 and _logprobs_ok(lps))


def _explain_trajectory(ids: list[Any], mask: list[Any], lps: list[Any], vers: list[Any]) -> None:
    _first_bad("Trajectory.input_ids", ids, lambda x: type(x) is int and x >= 0, "a token id (an int >= 0)")
    _first_bad("Trajectory.loss_mask", mask, lambda x: type(x) is int and x in (0, 1), "0 or 1 (an int)")
    _first_bad("Trajectory.versions", vers, lambda x: type(x) is int, "a policy version (an int)")
    _first_bad("Trajectory.logprobs", lps, lambda x: type(x) in (float, int), "a log-probability (a float)")
    for i, (m, v, lp) in enumerate(zip(mask, vers, lps, strict=True)):
        if m == 0 and v != NOT_SAMPLED:
            raise TrajectoryError(f"Trajectory.versions[{i}]={v} but loss_mask[{i}]=0: tokens the policy "
                                  f"did not sample carry version {NOT_SAMPLED}")
        if m == 1 and v < 0:
            raise TrajectoryError(f"Trajectory.versions[{i}]={v} but loss_mask[{i}]=1: sampled tokens carry "
                                  "the policy version (>= 0) that produced them")
        if m == 1 and not _is_logprob(lp):
            raise TrajectoryError(f"Trajectory.logprobs[{i}]={lp!r}: a log-probability is finite and <= 0")
        if m == 0 and lp != 0.0:
            raise TrajectoryError(f"Trajectory.logprobs[{i}]={lp!r} on a token with loss_mask 0; use 0.0 there")


def _explain_completion(toks: list[Any], lps: list[Any], vers: list[Any]) -> None:
    _first_bad("Completion.tokens", toks, lambda x: type(x) is int and x >= 0, "a token id (an int >= 0)")
    _first_bad("Completion.versions", vers, lambda x: type(x) is int and x >= 0,
               "the policy version that sampled the token (an int >= 0)")
    _first_bad("Completion.logprobs", lps, _is_logprob, "a finite log-probability <= 0 (a float)")


Message = dict[str, Any]
"""A chat message: ``{"role": ..., "content": ..., ...}`` as in the OpenAI API."""

__all__ = [
    "NOT_SAMPLED",
    "ChatAPI",
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
