"""What every workflow's episode shares: failures as data, sampling settings, env-step metrics.

What it is: ``guarded(episode, timeout_s=...)`` runs one episode coroutine under a wall-time
budget and turns every exception into a failed ``Trajectory`` whose status names the
boundary that failed (``status_for``) — an episode never raises, except when it is
cancelled. ``sampling_params(value)`` reads the ``sampling`` a workflow is configured with
(a ``SamplingParams``, a mapping of its fields, or None for the defaults). ``step_metrics``
turns what an env's last step said into the float metrics a trajectory carries.

``EnvEpisodes`` is what the env-backed workflows share: the chat renderer, the sampling
settings, a pool of envs leased per episode, and one guarded episode per ``arun_episode``
(the subclass writes ``_play``).

What it is not: an episode loop (``workflows/``) or the executor that runs many.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import Awaitable, Mapping
from typing import Any

from agentrl.api import InferenceClient, SamplingParams, Trajectory, TrajectoryStatus
from agentrl.errors import AgentRLError, ConfigError, InferenceError, SandboxError
from agentrl.rollout.env_pool import EnvPool
from agentrl.rollout.renderer import ChatRenderer
from agentrl.toolcalls import DEFAULT_TOOL_PARSER, check_parser_names

log = logging.getLogger(__name__)


def status_for(error: BaseException) -> TrajectoryStatus:
    """The failure status of an episode that raised ``error``."""
    if isinstance(error, TimeoutError):
        return TrajectoryStatus.TIMEOUT
    if isinstance(error, SandboxError):
        return TrajectoryStatus.SANDBOX_ERROR
    if isinstance(error, InferenceError):
        return TrajectoryStatus.INFERENCE_ERROR
    return TrajectoryStatus.ENV_ERROR


async def guarded(episode: Awaitable[list[Trajectory] | None], *, timeout_s: float | None,
                  what: str = "episode") -> list[Trajectory] | None:
    """``await episode`` within ``timeout_s``; a failure becomes ``[Trajectory.failed(...)]``."""
    try:
        async with asyncio.timeout(timeout_s):
            return await episode
    except TimeoutError as e:
        message = f"the {what} ran past its budget of {timeout_s} s" if not str(e) else f"{what}: {e!r}"
        return [Trajectory.failed(TrajectoryStatus.TIMEOUT, error=message)]
    except Exception as e:
        if not isinstance(e, AgentRLError):  # not one of ours: probably a bug, so keep the traceback
            log.warning("%s failed with an unexpected %s", what, type(e).__name__, exc_info=True)
        return [Trajectory.failed(status_for(e), error=f"{type(e).__name__}: {e}"[:2000])]


def sampling_params(value: SamplingParams | Mapping[str, Any] | None) -> SamplingParams:
    """``SamplingParams`` from a config value: the object, a mapping of its fields, or None."""
    if value is None:
        return SamplingParams()
    if isinstance(value, SamplingParams):
        return value
    if isinstance(value, Mapping):
        try:
            return SamplingParams(**value)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"sampling: {e} (fields: max_new_tokens, temperature, top_p, top_k, stop, "
                              "stop_token_ids, ignore_eos, seed)") from e
    raise ConfigError(f"sampling must be a SamplingParams or a mapping of its fields, got {type(value).__name__}")


def step_metrics(info: Mapping[str, Any], *, terminated: bool, truncated: bool) -> dict[str, float]:
    """The metrics of an episode's last env step: how it ended and each named reward term."""
    out = {"terminated": float(terminated), "truncated": float(truncated)}
    by = info.get("truncated_by")
    if by:
        out[f"truncated_by/{by}"] = 1.0
    for name, value in (info.get("rewards") or {}).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"reward/{name}"] = float(value)
    return out


class EnvEpisodes(abc.ABC):
    """Base of the workflows that play a registered env: ``arun_episode`` runs the subclass's
    ``_play(client, row)`` under ``timeout_s`` with failures as data; ``aclose`` closes the envs.

    ``env_id``: a registered env id; ``tokenizer``: a model directory, tokenizer or renderer;
    ``sampling``: ``SamplingParams`` or a mapping of its fields, per reply; ``env_kwargs``: for
    ``gymnasium.make``; ``chat_template_kwargs``: extra template variables; ``max_idle_envs``:
    envs kept for reuse; ``tool_call_parser``/``reasoning_parser``: the formats the env's tools
    read replies in (``agentrl.toolcalls`` names, the run's ``rollout.tool_call_parser`` and
    ``rollout.reasoning_parser``), set on each leased env's ``toolbox`` by ``read_replies``.
    """

    def __init__(self, env_id: str, tokenizer: Any, sampling: SamplingParams | Mapping[str, Any] | None = None,
                 env_kwargs: Mapping[str, Any] | None = None, *, timeout_s: float = 900.0,
                 chat_template_kwargs: Mapping[str, Any] | None = None, max_idle_envs: int = 256,
                 tool_call_parser: str = DEFAULT_TOOL_PARSER, reasoning_parser: str | None = None) -> None:
        check_parser_names(tool_call_parser, reasoning_parser)
        self.tool_call_parser, self.reasoning_parser = tool_call_parser, reasoning_parser
        self.renderer = ChatRenderer(tokenizer, chat_template_kwargs=chat_template_kwargs)
        self.sampling = sampling_params(sampling)
        self.envs = EnvPool(env_id, env_kwargs, max_idle=max_idle_envs)
        self.timeout_s = timeout_s

    def read_replies(self, env: Any) -> bool:
        """Set this workflow's reply formats on ``env``'s toolbox, if it has one. Returns whether
        replies should be decoded with their special tokens (another family's markers are)."""
        toolbox = getattr(getattr(env, "unwrapped", env), "toolbox", None)
        if toolbox is not None:
            toolbox.read_as(self.tool_call_parser, self.reasoning_parser)
        return self.tool_call_parser != DEFAULT_TOOL_PARSER or self.reasoning_parser is not None

    async def arun_episode(self, client: InferenceClient, row: Mapping[str, Any]) -> list[Trajectory] | None:
        return await guarded(self._play(client, row), timeout_s=self.timeout_s, what=f"{self.envs.env_id} episode")

    async def aclose(self) -> None:
        """Close the pooled envs (call once the run is over)."""
        await self.envs.aclose()

    @abc.abstractmethod
    async def _play(self, client: InferenceClient, row: Mapping[str, Any]) -> list[Trajectory]:
        """One episode of ``row`` (failures may raise: ``arun_episode`` turns them into data)."""
