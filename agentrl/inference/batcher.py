"""``GroupBatcher``: the sample groups a rollout asks for in one event-loop tick, sent as one request.

What it is: the part of ``RemoteEngine.generate_group`` that talks HTTP. A rollout starts its
episodes together (``asyncio.gather`` of one coroutine per prompt), so their
``generate_group`` calls arrive in the same tick of the event loop; instead of one
``/generate`` each, the batcher queues them per server and sends them together at the end of
the tick as one SGLang batch: ``input_ids`` a list of prompts, ``sampling_params`` a list
(one per prompt) with ``n`` — SGLang answers prompt-major (prompt i's n samples, in order), so
the answer is cut back into groups in queue order. The server then admits every sample of the
rollout at once, and per-request HTTP costs are paid once per tick instead of once per group.

Rules: groups are batched only with groups of the same server and the same ``n`` (SGLang
needs one ``n`` per batch); a seeded group travels as ``n`` single samples with seeds ``seed,
seed + 1, ...`` (``n`` copies of one seed would be ``n`` equal samples), batched with other
such samples (``n = 1``). Nothing waits for more work: the batch leaves at the end of the
tick in which its first group was queued. If the server refuses a batch of several groups
(4xx), each group is re-sent alone, so the refusal reaches only the group it is about; a
transport error or 5xx answers ``None`` to every group of the batch (``RemoteEngine`` then
re-runs their samples one request each, with its own retry rules).

What it is not: a timer-based batcher (no added latency), nor a load balancer (the caller
picks the server).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from agentrl.api import SamplingParams
from agentrl.errors import RequestRejected, ServerError


@dataclass
class _Group:
    prompt: list[int]
    each: list[SamplingParams]  # one per sample
    done: asyncio.Future = field(repr=False)


class GroupBatcher:
    """Queues groups per (server, n) and sends each queue as one ``/generate`` batch."""

    def __init__(self, send: Callable[[Any, dict[str, Any]], Awaitable[Any]]) -> None:
        self._send = send  # (server, payload) -> the decoded JSON answer
        self._queues: dict[tuple[int, int], tuple[Any, list[_Group]]] = {}
        self._tasks: set[asyncio.Task] = set()
        self.batches = 0  # requests sent (for stats)

    async def submit(self, server: Any, prompt: list[int], each: list[SamplingParams]) -> list[dict] | None:
        """The ``len(each)`` result objects of this group; None if its batch failed in
        transport or with a 5xx; ``RequestRejected`` if the server refused this group."""
        loop = asyncio.get_running_loop()
        seeded = each[0].seed is not None
        key = (id(server), 1 if seeded else len(each))
        group = _Group(prompt, each, loop.create_future())
        if key not in self._queues:
            self._queues[key] = (server, [])
            loop.call_soon(self._flush, key)
        self._queues[key][1].append(group)
        return await group.done

    def _flush(self, key: tuple[int, int]) -> None:
        server, groups = self._queues.pop(key)
        task = asyncio.get_running_loop().create_task(self._post(server, groups, key[1]))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, server: Any, groups: list[_Group], n: int) -> None:
        if n > 1:
            payload = {"input_ids": [g.prompt for g in groups],
                       "sampling_params": [{**g.each[0].to_sglang(), "n": n} for g in groups]}
        else:
            payload = {"input_ids": [g.prompt for g in groups for _ in g.each],
                       "sampling_params": [sp.to_sglang() for g in groups for sp in g.each]}
        total = sum(len(g.each) for g in groups)
        self.batches += 1
        try:
            data = await self._send(server, {**payload, "return_logprob": True})
            if not isinstance(data, list) or len(data) != total:
                raise ServerError(f"/generate answered {type(data).__name__} for a batch of {total} samples; "
                                  f"expected a list of {total} results")
        except RequestRejected as e:
            if len(groups) > 1:  # find the group the refusal is about
                await asyncio.gather(*(self._post(server, [g], n) for g in groups))
            else:
                _settle(groups[0], exc=e)
            return
        except (httpx.TransportError, ServerError):
            for g in groups:
                _settle(g, None)
            return
        except BaseException as e:  # cancelled or a bug: nobody may wait forever
            for g in groups:
                _settle(g, exc=e if isinstance(e, Exception) else ServerError(f"batch interrupted ({e!r})"))
            raise
        at = 0
        for g in groups:
            _settle(g, data[at : at + len(g.each)])
            at += len(g.each)


def _settle(group: _Group, result: Any = None, exc: BaseException | None = None) -> None:
    if group.done.done():  # its caller was cancelled
        return
    if exc is not None:
        group.done.set_exception(exc)
    else:
        group.done.set_result(result)
