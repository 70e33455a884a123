"""Futures: the Tinker API's asynchronous requests, queued, run, and kept until the SDK retrieves them.

What it is: every training call (``create_model``, ``forward_backward``, ``optim_step``,
``save_*``, ``load_weights``) and every ``asample`` answers at once with a ``request_id``; the
SDK then polls ``/api/v1/retrieve_future`` until it gets the result. ``Futures.submit`` queues
a training job — they run one at a time, first come first served, on one worker thread (the
learner's adapters are switched per call, so calls never interleave; clients' calls are served
in the order they arrive, so none waits behind another's whole run) — and ``Futures.spawn`` runs
a coroutine (sampling goes to ``agentrl serve`` concurrently). ``Futures.wait`` is the long
poll: it returns the result, or None after ``poll_s`` (the route then answers ``try_again``, as
the SDK expects of a request still running).

A job's result is a JSON object, or protobuf bytes (``Proto``) for the two types the SDK reads
as protobuf; a job that raises ``Refused`` fails with the SDK's ``RequestFailedResponse``
(category ``user``), any other exception with category ``server`` — the worker goes on with the
next job either way. A result is dropped once retrieved, or after ``keep_s`` unretrieved.

What it is not: the routes (``agentrl.service.routes``) or the work itself (``learner``, ``sampler``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agentrl.errors import Refused
from agentrl.ids import unique_hex

log = logging.getLogger(__name__)


@dataclass
class Proto:
    """A result the SDK reads as ``application/x-protobuf``."""

    body: bytes


def failure(e: BaseException) -> dict[str, Any]:
    """The SDK's ``RequestFailedResponse`` for an exception a job raised."""
    if isinstance(e, Refused):
        return {"error": e.message, "category": "user"}
    return {"error": f"{type(e).__name__}: {e}", "category": "server"}


class Futures:
    """Request ids -> results; the training queue and its worker."""

    def __init__(self, *, keep_s: float = 3600.0) -> None:
        self.keep_s = keep_s
        self.results: dict[str, asyncio.Future] = {}
        self.created: dict[str, float] = {}
        self.queue: asyncio.Queue[tuple[asyncio.Future, Callable[[], Any]]] = asyncio.Queue()
        self.worker: asyncio.Task | None = None
        self.tasks: set[asyncio.Task] = set()

    def _new(self) -> tuple[str, asyncio.Future]:
        self._expire()
        rid = unique_hex()
        fut = asyncio.get_running_loop().create_future()
        self.results[rid], self.created[rid] = fut, time.monotonic()
        return rid, fut

    def submit(self, job: Callable[[], Any]) -> str:
        """Queue a blocking training job; its request id."""
        if self.worker is None or self.worker.done():
            self.worker = asyncio.create_task(self._work())
        rid, fut = self._new()
        self.queue.put_nowait((fut, job))
        return rid

    def spawn(self, job: Awaitable[Any]) -> str:
        """Run a coroutine beside the queue (sampling); its request id."""
        rid, fut = self._new()

        async def run() -> None:
            try:
                fut.set_result(await job)
            except Exception as e:  # the failure is the future's result
                fut.set_result(failure(e))

        task = asyncio.create_task(run())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return rid

    async def _work(self) -> None:
        while True:
            fut, job = await self.queue.get()
            try:
                fut.set_result(await asyncio.to_thread(job))
            except Exception as e:  # one client's failure never stops the others' jobs
                if not isinstance(e, Refused):
                    log.exception("a training job failed")
                fut.set_result(failure(e))

    async def wait(self, rid: str, poll_s: float) -> Any | None:
        """The result of ``rid`` (then forgotten), or None if it is still running after ``poll_s``."""
        fut = self.results.get(rid)
        if fut is None:
            raise Refused(f"no request {rid!r} on this service (its result was already retrieved, or it "
                          "expired); send the request again", 404)
        try:
            result = await asyncio.wait_for(asyncio.shield(fut), poll_s)
        except TimeoutError:
            return None
        self.results.pop(rid, None)
        self.created.pop(rid, None)
        return result

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.keep_s
        for rid in [r for r, t in self.created.items() if t < cutoff and self.results[r].done()]:
            self.results.pop(rid, None)
            self.created.pop(rid, None)

    async def close(self) -> None:
        for task in [self.worker, *self.tasks]:
            if task is not None:
                task.cancel()
