"""The one exception tree of agentrl.

Every class names the boundary that failed, so a caller can catch exactly the layer it
can recover from. A failed *episode* is not an exception that escapes a training step:
the rollout side catches these and records them as the trajectory's status.

    AgentRLError
    ├── ConfigError              a config file or override is wrong (names the key)
    ├── TrajectoryError          a Trajectory or Completion violates its invariants
    ├── ModelError               a model/tokenizer directory is missing or unreadable
    ├── InferenceError           talking to an inference server failed
    │   ├── ServerUnavailable    no healthy server could take the request (safe to retry)
    │   ├── RequestRejected      the server answered 4xx: the request itself is wrong
    │   ├── ServerError          the server answered 5xx or broke the protocol
    │   └── ResumeLimit          a request was interrupted more than max_resumes times
    ├── SandboxError             the sandbox backend failed (never the program inside it)
    │   └── SandboxUnavailable   the backend cannot be reached or started
    ├── EnvError                 an environment raised or returned something invalid
    │   └── ToolError            a tool could not be declared or run
    ├── VerifierError            a verifier crashed or timed out (not a wrong answer)
    ├── RolloutError             a conversation, chat client or gateway session cannot go on
    │                            (over its token budget, an unknown completion id)
    ├── Refused                  one of our HTTP services refuses a request (4xx, or 503 when
    │                            full): its status, message, OpenAI error type and code
    └── TrainerError             the trainer cannot continue
        └── CheckpointError      a checkpoint cannot be written or restored

Messages say what was expected, what came, and what to do next.
"""

from __future__ import annotations


class AgentRLError(Exception):
    """Base of every error agentrl raises on purpose."""


class ConfigError(AgentRLError, ValueError):
    """A config value is unknown, of the wrong type, or out of range."""


class TrajectoryError(AgentRLError, ValueError):
    """A Trajectory or Completion was built with inconsistent fields."""


class ModelError(AgentRLError):
    """A model or tokenizer directory is missing, incomplete or unreadable."""


class InferenceError(AgentRLError):
    """Talking to an inference server failed."""


class ServerUnavailable(InferenceError):
    """No healthy server could take the request; retrying later may succeed."""


class RequestRejected(InferenceError):
    """The server refused the request (HTTP 4xx); resending it unchanged will fail again."""

    def __init__(self, message: str, status_code: int = 400) -> None:
        super().__init__(message)
        self.status_code = status_code


class ServerError(InferenceError):
    """The server failed (HTTP 5xx) or answered something that breaks the protocol."""


class ResumeLimit(InferenceError):
    """The client gave up resuming one interrupted request; ``completion`` holds its tokens so far."""

    def __init__(self, message: str, completion: object = None) -> None:
        super().__init__(message)
        self.completion = completion


class SandboxError(AgentRLError):
    """The sandbox backend itself failed; the program under test is not to blame."""


class SandboxUnavailable(SandboxError):
    """The sandbox backend cannot be reached or started (no Docker engine, service down)."""


class EnvError(AgentRLError):
    """An environment raised, or returned an observation/reward of the wrong shape."""


class ToolError(EnvError):
    """A tool could not be declared (bad signature) or failed outside the model's control."""


class VerifierError(AgentRLError):
    """A verifier crashed or ran past its hard timeout (a wrong answer is not an error)."""


class RolloutError(AgentRLError):
    """A recorded conversation cannot take this call (token budget spent, unknown completion id)."""


_ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}
"""OpenAI's error type of a status; any other 4xx is an ``invalid_request_error``, a 5xx a ``server_error``."""


class Refused(AgentRLError):
    """A request that ``agentrl serve``, the gateway or the sandbox service will not serve.

    Every such service answers it with OpenAI's error body,
    ``{"error": {"message", "type", "param": null, "code"}}`` (``agentrl.http_edge``).

    Args:
        message: what was expected, what came, and what to do next.
        status: the HTTP status, 400 unless said.
        type: OpenAI's error type; by default the one of ``status`` (``authentication_error``,
            ``permission_error``, ``rate_limit_error``, ``server_error``, else ``invalid_request_error``).
        code: OpenAI's ``code``; by default the status.
        headers: extra response headers (``Retry-After``).
    """

    def __init__(self, message: str, status: int = 400, *, type: str | None = None,
                 code: int | str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.headers = message, status, headers
        self.type = type or _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.code = status if code is None else code


class TrainerError(AgentRLError):
    """The trainer cannot continue (bad batch, non-recoverable distributed failure)."""


class CheckpointError(TrainerError):
    """A checkpoint cannot be written, or restored into the current run."""
