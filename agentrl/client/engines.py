"""The inference engines by name: the one registry (a run's ``inference.engine``, a client's ``engine``).

What it is: ``ENGINES``, each engine's name and its backend class (``backend.EngineBackend``),
and ``detect``, which finds the backend of the engine behind ``GET /v1/models``' ``owned_by`` for a client
with ``engine: auto``. A run starts the engine it names (``agentrl.run.local_launcher``); a
client speaks to it through its backend. Adding an engine: its backend module, one line here.
What it is not: how an engine is started (the launchers), nor its wire format (the backends).
"""

from __future__ import annotations

from collections.abc import Iterable

from agentrl.client.backend import EngineBackend
from agentrl.client.sglang_backend import SGLangBackend
from agentrl.client.vllm_backend import VLLMBackend

ENGINES: dict[str, type[EngineBackend]] = {
    "agentrl": SGLangBackend,  # agentrl serve speaks SGLang's native API
    "sglang": SGLangBackend,
    "vllm": VLLMBackend,
}

AUTO = "auto"
"""A client's engine when it asks the servers (``detect``)."""
FALLBACK = "sglang"
"""What ``auto`` takes when ``owned_by`` names no engine here: SGLang-compatible servers vary it."""


def detect(owners: Iterable[str | None]) -> type[EngineBackend]:
    """The backend whose ``owned_by`` is among ``owners``, else ``FALLBACK``'s."""
    owners = set(owners)
    return next((backend for backend in ENGINES.values() if owners & set(backend.owned_by)), ENGINES[FALLBACK])
