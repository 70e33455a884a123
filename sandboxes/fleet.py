"""SandboxFleet: programs spread over several sandbox services (``agentrl sandbox serve``).

What it is: the Sandbox interface over a list of service URLs, one ``RemoteSandbox`` each.
Every ``run`` and every ``session`` goes to the service with the fewest calls of this
process in flight (ties: the next in turn). A service that cannot be reached when a call
starts (``SandboxUnavailable``: refused, or saturated after its retries — nothing ran) is
skipped for that call and the next one is tried; a call that may have run is never resent.
``make_sandbox("http://a:8100,http://b:8100")`` builds one (``sandbox.services`` in a run's
config). What it is not: a sandbox — isolation is each service's backend's — nor a health
checker: a service that stays down is tried again by the next call.
Main hooks: ``await SandboxFleet(urls).run(req)``, ``async with fleet.session() as s``.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Sequence
from typing import Any

from agentrl.api import ExecRequest, ExecResult
from agentrl.errors import SandboxUnavailable
from sandboxes.remote import RemoteSandbox, RemoteSession


class SandboxFleet:
    """Runs programs on the least busy of several sandbox services."""

    def __init__(self, urls: Sequence[str], api_key: str | None = None, **options: Any) -> None:
        if not urls:
            raise ValueError("SandboxFleet needs at least one sandbox service URL")
        self.members = [RemoteSandbox(u, api_key, **options) for u in urls]
        self._inflight = [0] * len(self.members)
        self._turn = itertools.count()

    @property
    def urls(self) -> list[str]:
        return [m.url for m in self.members]

    def _order(self) -> list[int]:
        """Member indices, least busy first, from the one whose turn it is."""
        start = next(self._turn) % len(self.members)
        rotated = [(start + i) % len(self.members) for i in range(len(self.members))]
        return sorted(rotated, key=lambda i: self._inflight[i])

    async def run(self, request: ExecRequest) -> ExecResult:
        error: SandboxUnavailable | None = None
        for i in self._order():
            self._inflight[i] += 1
            try:
                return await self.members[i].run(request)
            except SandboxUnavailable as e:
                error = e
            finally:
                self._inflight[i] -= 1
        raise SandboxUnavailable(f"no sandbox service of {self.urls} took the program; last: {error}")

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[RemoteSession]:
        error: SandboxUnavailable | None = None
        for i in self._order():
            self._inflight[i] += 1
            try:
                cm = self.members[i].session()
                try:
                    session = await cm.__aenter__()
                except SandboxUnavailable as e:
                    error = e
                    continue
                async with contextlib.AsyncExitStack() as stack:
                    stack.push_async_exit(cm)
                    yield session
                return
            finally:
                self._inflight[i] -= 1
        raise SandboxUnavailable(f"no sandbox service of {self.urls} opened a session; last: {error}")

    async def aclose(self) -> None:
        for m in self.members:
            await m.aclose()
