"""``GroupBatcher``: the generation requests a rollout makes in one event-loop tick, sent as one.

What it is: the part of ``SGLangBackend`` that sends ``/generate``. A rollout starts its
episodes together (``asyncio.gather`` of one coroutine per episode or per group), so their
``generate``/``generate_group`` calls arrive in the same tick of the event loop; instead of
one ``/generate`` each, the batcher queues them per server and sends them together at the
end of the tick as one SGLang batch (its body: ``sglang_backend.generate_body``) — SGLang
answers prompt-major (prompt i's n samples, in order), so the answer is cut back into groups in
queue order. The server then
admits the whole rollout at once (and computes each distinct prompt once), and per-request
HTTP costs are paid once per tick. A tick with a single request sends it in the plain form
(one prompt, a ``sampling_params`` object, a ``rid``), exactly as an unbatched client would.

Only short requests share (``max_new_tokens`` at most ``max_new_tokens``, default 32): an HTTP
answer comes back whole, so every request of a batch waits for its slowest one. For short
answers that wait is a few decode steps and the HTTP cost saved is of the order of the
generation itself; a long request goes alone, where head-of-line blocking would cost far more
than its HTTP overhead (``benchmarks/inference.py`` measures the server's occupancy).

Rules: groups are batched only with groups of the same server and the same ``n`` (SGLang
needs one ``n`` per batch); a seeded group travels as ``n`` single samples with seeds ``seed,
seed + 1, ...`` (``n`` copies of one seed would be ``n`` equal samples), batched with other
single samples. Nothing waits for more work: the batch leaves at the end of the tick in which
its first request was queued. If the server refuses a batch of several requests (4xx), each is
re-sent alone, so the refusal reaches only the request it is about; a transport error or a 5xx
is raised to every request of the batch (each caller applies its own retry rules).

What it is not: a timer-based batcher (no added latency), nor a load balancer (the caller
picks the server).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.api import SamplingParams
from agentrl.errors import RequestRejected, ServerError


@dataclass
class Group:
    """One queued request: ``len(each)`` samples of ``prompt`` (``rid`` names a single sample)."""

    prompt: list[int]
    each: list[SamplingParams]  # one per sample
    rid: str | None
    done: asyncio.Future = field(repr=False)


class GroupBatcher:
    """Queues requests per (server, n) and sends each queue as one ``/generate``."""

    def __init__(self, send: Callable[[Any, list[Group], int], Awaitable[Any]], max_new_tokens: int = 32) -> None:
        self._send = send  # (server, groups, n) -> the decoded JSON answer of one /generate
        self.max_new_tokens = max_new_tokens  # longer requests are sent alone
        self._queues: dict[tuple[int, ...], tuple[Any, list[Group]]] = {}
        self._alone = itertools.count()
        self._tasks: set[asyncio.Task] = set()

    async def submit(self, server: Any, prompt: list[int], each: list[SamplingParams],
                     rid: str | None = None) -> list[dict]:
        """The ``len(each)`` result objects of this group (``rid`` names a single sample).
        Raises ``RequestRejected`` if the server refused it, and the batch's transport error or
        ``ServerError`` if the batch failed."""
        loop = asyncio.get_running_loop()
        key: tuple[int, ...] = (id(server), 1 if each[0].seed is not None else len(each))
        if each[0].max_new_tokens > self.max_new_tokens:
            key = (*key, next(self._alone))
        group = Group(prompt, each, rid, loop.create_future())
        if key not in self._queues:
            self._queues[key] = (server, [])
            loop.call_soon(self._flush, key)
        self._queues[key][1].append(group)
        return await group.done

    def _flush(self, key: tuple[int, ...]) -> None:
        server, groups = self._queues.pop(key)
        task = asyncio.get_running_loop().create_task(self._post(server, groups, key[1]))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, server: Any, groups: list[Group], n: int) -> None:
        total = sum(len(g.each) for g in groups)
        try:
            data = await self._send(server, groups, n)
            if total == 1 and isinstance(data, dict):
                data = [data]
            if not isinstance(data, list) or len(data) != total:
                raise ServerError(f"/generate answered {type(data).__name__} for {total} samples; "
                                  f"expected a list of {total} results")
        except RequestRejected as e:
            if len(groups) > 1:  # find the request the refusal is about
                await asyncio.gather(*(self._post(server, [g], n) for g in groups))
            else:
                _settle(groups[0], exc=e)
            return
        except BaseException as e:  # transport, 5xx, or cancelled: nobody may wait forever
            for g in groups:
                _settle(g, exc=e if isinstance(e, Exception) else ServerError(f"request interrupted ({e!r})"))
            if not isinstance(e, Exception):
                raise
            return
        at = 0
        for g in groups:
            _settle(g, data[at : at + len(g.each)])
            at += len(g.each)


def _settle(group: Group, result: Any = None, exc: BaseException | None = None) -> None:
    if group.done.done():  # its caller was cancelled
        return
    if exc is not None:
        group.done.set_exception(exc)
    else:
        group.done.set_result(result)
