"""SandboxFleet: programs spread over several sandbox services (``agentrl sandbox serve``).

What it is: the Sandbox interface over a list of service URLs, one ``RemoteSandbox`` each.
Every ``run`` and every ``session`` goes to the service with the fewest calls of this
process in flight (ties: the next in turn). A service that cannot be reached when a call
starts (``SandboxUnavailable``: refused, or saturated after its retries — nothing ran) is
skipped for that call and the next one is tried; a call that may have run is never resent.
``make_sandbox("http://a:8100,http://b:8100")`` builds one (``sandbox.services`` in a run's
config). What it is not: a sandbox — isolation is each service's backend's — nor a health
checker: a service that stays down is tried again by the next call.
Repository episodes are spread the same way (``fleet.held``, ``sandboxes/repo_remote.py``).
Main hooks: ``await SandboxFleet(urls).run(req)``, ``async with fleet.session() as s``.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

from agentrl.api import ExecRequest, ExecResult
from agentrl.errors import SandboxUnavailable
from sandboxes.remote import RemoteSandbox, RemoteSession

T = TypeVar("T")


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

    def session(self) -> contextlib.AbstractAsyncContextManager[RemoteSession]:
        return self.held(lambda member: member.session(), "opened a session")

    @contextlib.asynccontextmanager
    async def held(self, open_on: Callable[[RemoteSandbox], contextlib.AbstractAsyncContextManager[T]],
                   what: str) -> AsyncIterator[T]:
        """``open_on(member)`` entered on the least busy service that takes it, counted as in
        flight there until the block exits (sessions, repository episodes)."""
        error: SandboxUnavailable | None = None
        for i in self._order():
            self._inflight[i] += 1
            try:
                cm = open_on(self.members[i])
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
        raise SandboxUnavailable(f"no sandbox service of {self.urls} {what}; last: {error}")

    async def aclose(self) -> None:
        for m in self.members:
            await m.aclose()
