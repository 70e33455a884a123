"""``EngineBackend``: what ``RemoteEngine`` needs from one inference engine, and ``Servers``, what it lends one.

What it is: the protocol one class per engine meets (``sglang_backend.SGLangBackend`` for SGLang
and ``agentrl serve``, ``vllm_backend.VLLMBackend`` for vLLM; the registry is ``engines``). A
backend owns its engine's wire vocabulary — the sampling keys, the routes, the request bodies and
how answers read — and the order of the calls where an engine needs several (vLLM checks a
checkpoint, loads it, labels it, empties its prefix cache). It makes every call through
``Servers``: the client's own calls, with its timeouts, retries, key and routing, so a backend
holds no connection, no retry and no server state of its own. ``RemoteEngine`` builds one backend
per client once it knows the engine (``engine: auto`` asks ``GET /v1/models``: ``owned_by``).

What it is not: the client (``remote_engine``: routing, retries, probing, versions, pausing);
nor the server side of a wire format (``agentrl.inference``).

Adding an engine: a module with a class that meets ``EngineBackend`` and one line in
``engines.ENGINES`` (docs/DESIGN.md §4 "Adding an engine").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from agentrl.api import SamplingParams

Sample = tuple[list[int], list[float], list[int], dict[str, Any]]
"""One sample as a backend reads it from an answer: tokens, their logprobs, the version of each,
and the finish reason in SGLang's shape (``{"type": "stop" | "length" | "abort", "matched": ...}``)."""

Call = tuple[str, dict[str, Any]]
"""A control call as (route, JSON body)."""


@dataclass(frozen=True)
class Servers:
    """A client's servers as its backend reaches them: ``RemoteEngine``'s own calls (with its
    timeouts, retries and key), and what of the client's state a request needs."""

    members: Sequence[Any]
    """Every server, in order: ``post``'s first argument (``.address`` is its URL)."""
    post: Callable[..., Awaitable[Any]]
    """``(server, route, body, seconds, *, plain=False)``: one server's decoded JSON answer (``plain``:
    a success may be text); a 4xx raises ``RequestRejected``, a 5xx ``ServerError``."""
    control: Callable[..., Awaitable[list[Any]]]
    """``(route, body, *, plain=False)``: the same call to every live server at once, their answers."""
    every_server: Callable[[str, list[dict[str, Any]]], Awaitable[list[Any]]]
    """``(route, bodies)``: body ``i`` to server ``i``, every one (a weight group needs all)."""
    get: Callable[[Any, str, float], Awaitable[Any]]
    """``(server, route, seconds)``: the decoded JSON of a 200 answer, else None."""
    as_version: Callable[[Any], int]
    """A server's version label as the client's int (a non-numeric one: the client's version)."""
    lora: Callable[[], tuple[str, int] | None]
    """(name, version) of the adapter every request names now, if any."""
    stats: dict[str, int]
    """The client's counters; a backend counts its generation requests in ``posts``."""
    timeout: float
    """Seconds one generation request may take."""
    control_timeout: float
    """Seconds one control call may take."""
    batch_max_new_tokens: int
    """Requests with at most this many new tokens may share a request (-1: none, behind a router)."""

    @property
    def addresses(self) -> list[str]:
        return [s.address for s in self.members]


class EngineBackend(Protocol):
    """One engine's side of every call a client makes (see the module docstring).

    Generation: ``sampling_params``, ``generate``; scoring: ``prompt_logprobs``, ``tokenize``. Control, as (route, body) for every server:
    ``pause``, ``resume``, ``release_memory``, ``occupy_memory``, ``leave_group``; the routes of
    the probe (``version_route``) and of adapters (``lora_routes``). Weights from disk:
    ``load_weights`` (every server), ``reload_server`` (one that came back), ``stage_weights``.
    Weights over torch.distributed: ``group_ranks``, ``join_group``, ``begin_update``,
    ``receive_weights``, ``end_update``; staging while generating where the engine can
    (``can_stage``, ``commit_staged``, ``receive_adapter``). What an engine cannot do raises
    ``RequestRejected`` saying so.
    """

    owned_by: ClassVar[tuple[str, ...]]
    """``GET /v1/models``' ``owned_by`` values that name this engine (``engine: auto``)."""
    batch_form: ClassVar[bool]
    """Whether one request may carry several prompts or seeds (else a seeded group goes as n)."""
    version_route: ClassVar[str]
    """GET: a JSON object whose ``weight_version`` is the served version."""
    lora_routes: ClassVar[tuple[str, str]]
    """The routes that load (``{"lora_name", "lora_path"}``) and unload (``{"lora_name"}``) an adapter."""

    def __init__(self, servers: Servers) -> None: ...

    def sampling_params(self, sp: SamplingParams, n: int = 1) -> dict[str, Any]:
        """Our sampling settings in the engine's vocabulary (``n`` samples)."""

    async def generate(self, server: Any, prompt: list[int], each: list[SamplingParams],
                       rid: str | None) -> list[Sample]:
        """``len(each)`` samples of ``prompt`` from ``server`` (``each`` alike unless seeded)."""

    async def prompt_logprobs(self, server: Any, input_ids: list[int]) -> list[float | None]:
        """Scoring, no generation (a teacher's, ``agentrl.rollout.teacher``): the log-probability
        of each of ``input_ids`` given the ones before it (None for the first)."""

    async def tokenize(self, server: Any, text: str) -> list[int]:
        """The token ids the server's tokenizer gives ``text`` (special tokens added as it adds them)."""

    def pause(self) -> Call: ...
    def resume(self) -> Call: ...
    def release_memory(self) -> Call: ...
    def occupy_memory(self, tags: list[str]) -> Call:
        """Take back the memory of ``tags`` (``["weights"]`` first, then the rest)."""
    def leave_group(self, group_name: str) -> Call: ...

    async def load_weights(self, path: str, version: int) -> None:
        """Every live server serves the checkpoint at ``path`` as ``version`` (refused: ``RequestRejected``)."""
    async def reload_server(self, server: Any, path: str, version: int) -> None:
        """One server, back from a restart, loads the checkpoint the others serve."""
    async def stage_weights(self, path: str) -> None: ...

    async def group_ranks(self) -> list[int]: ...
    async def can_stage(self) -> bool: ...
    async def join_group(self, master_address: str, master_port: int, *, group_name: str, group_backend: str,
                         offsets: list[int], world_size: int) -> None: ...
    async def begin_update(self) -> None: ...
    async def end_update(self) -> None: ...
    async def receive_weights(self, names: list[str], dtypes: list[str], shapes: list[list[int]], *, group_name: str,
                              version: int | None, load_format: str | None, stage_only: bool) -> None:
        """Every server receives one bucket by broadcast; with ``version`` (the last), serves it."""
    async def commit_staged(self, group_name: str, version: int) -> None: ...
    async def receive_adapter(self, names: list[str], dtypes: list[str], shapes: list[list[int]], *, group_name: str,
                              config: dict[str, Any], load_format: str | None, name: str | None) -> None:
        """A LoRA adapter by broadcast: merged in a staging copy (``name`` None) or loaded as ``name``."""


def token_versions(n: int, default: int, spans: Iterable[dict[str, Any]] | None,
                   as_version: Callable[[Any], int]) -> list[int]:
    """The version of each of ``n`` tokens: ``default``, but inside a span (``{"start", "end",
    "version"}``, end exclusive: SGLang's ``meta_info.weight_versions``, vLLM's
    ``weight_versions``) the span's own."""
    versions = [default] * n
    for s in spans or []:
        v = as_version(s.get("version"))
        for i in range(int(s.get("start", 0)), min(int(s.get("end", 0)), n)):
            versions[i] = v
    return versions
