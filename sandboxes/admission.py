"""What the sandbox service admits: valid requests under the operator's ceilings, a bounded
number at once.

What it is: the service's edge (``sandboxes/service.py`` calls it before any backend sees a
request). ``parse_request`` turns an HTTP body into an ``ExecRequest`` or refuses it with an
``agentrl.errors.Refused`` (a 4xx status and a message saying what was expected): not a JSON
object (400, ``agentrl.http_edge.parse_json``: not JSON, nested too deeply, a lone surrogate
escape that no UTF-8 text can hold, empty, an array), and 422 or 413 for an unknown
field, a field of the wrong type, a limit above a ``Ceilings`` value (named in the message;
``sandboxes.ceilings``), code or files larger than allowed, a file name outside the work dir.
``Admission`` bounds what runs at once — single runs and open sessions alike, a session
holding its place from open to close — and how many wait.

What it is not: isolation (the backend's) or authentication (the service's API key).
Main hooks: ``parse_request(body, ceilings)``, ``async with admission.slot(): ...``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib

from agentrl.api import ExecRequest
from agentrl.errors import Refused
from agentrl.http_edge import parse_body, parse_json
from sandboxes.ceilings import Ceilings
from sandboxes.wire import check_names

QUEUE_WAIT_S = 600.0
"""Longest a request waits for a free place before it is refused (503)."""


def maxima(ceilings: Ceilings) -> dict[str, tuple[str, float]]:
    """The ExecRequest fields the operator's ``ceilings`` bound (``agentrl.http_edge.Maxima``)."""
    return {"time_limit_s": ("max_time_s", ceilings.max_time_s),
            "memory_limit_mb": ("max_memory_mb", ceilings.max_memory_mb),
            "output_limit_bytes": ("max_output_bytes", ceilings.max_output_bytes),
            "fetch": ("max_fetch", ceilings.max_fetch)}


def parse_request(body: bytes, ceilings: Ceilings) -> ExecRequest:
    """The ExecRequest in an HTTP body, checked against its declaration (``agentrl.api``) and
    ``ceilings``; raises Refused. Sizes in bytes, base64 and file names are checked here."""
    data = parse_json(body, expected='an ExecRequest as a JSON object, e.g. {"code": "print(1)"}')
    request = parse_body(ExecRequest, data, maxima(ceilings))
    code_bytes = len(request.code.encode())
    if code_bytes > ceilings.max_code_bytes:
        raise Refused(f"code is {code_bytes} bytes, above this service's ceiling "
                      f"max_code_bytes={ceilings.max_code_bytes}", 413)
    file_bytes = sum(len(v.encode()) for v in request.files.values())
    for name, text in request.files_b64.items():
        try:
            file_bytes += len(base64.b64decode(text, validate=True))
        except (binascii.Error, ValueError) as e:
            raise Refused(f"files_b64[{name!r}] is not valid base64 ({e})", 422) from e
    if file_bytes > ceilings.max_file_bytes:
        raise Refused(f"files add up to {file_bytes} bytes, above this service's ceiling "
                      f"max_file_bytes={ceilings.max_file_bytes}", 413)
    try:
        check_names(request)
    except ValueError as e:
        raise Refused(f"not a valid ExecRequest: {e}", 422) from e
    return request


class Admission:
    """At most ``max_concurrency`` runs and open sessions at once and ``max_queue`` waiting;
    beyond, 503 (``Refused``)."""

    def __init__(self, max_concurrency: int, max_queue: int) -> None:
        self.sem = asyncio.Semaphore(max_concurrency)
        self.max_queue = max_queue
        self.running = 0
        self.queued = 0

    @contextlib.asynccontextmanager
    async def slot(self):
        if not self.sem.locked():
            await self.sem.acquire()  # a place is free: taken without waiting
        else:
            if self.queued >= self.max_queue:
                raise Refused(f"sandbox queue is full ({self.max_queue} waiting); retry later", 503)
            self.queued += 1
            try:
                await asyncio.wait_for(self.sem.acquire(), QUEUE_WAIT_S)
            except TimeoutError as e:
                raise Refused(f"waited {QUEUE_WAIT_S:.0f} s in the sandbox queue; retry later", 503) from e
            finally:
                self.queued -= 1
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self.sem.release()
