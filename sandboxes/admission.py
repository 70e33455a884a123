"""What the sandbox service admits: valid requests under the operator's ceilings, a bounded
number at once.

What it is: the service's edge (``sandboxes/service.py`` calls it before any backend sees a
request). ``parse_request`` turns an HTTP body into an ``ExecRequest`` or refuses it with a
``Refused`` (a 4xx status and a message saying what was expected): not JSON (or nested too
deeply, or a lone surrogate escape that no UTF-8 text can hold), not an object, an unknown
field, a field of the wrong type, a limit above a ``Ceilings`` value (named in the message),
code or files larger than allowed, a file name outside the work dir.
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
import dataclasses
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from agentrl.api import ExecRequest
from agentrl.config import option
from sandboxes.wire import check_names

QUEUE_WAIT_S = 600.0
"""Longest a request waits for a free place before it is refused (503)."""


@dataclass
class Ceilings:
    """The most one request may ask for, set by the service's operator (``agentrl sandbox
    serve --max-...``). A request above one is refused (4xx) with the ceiling's name. The
    number of processes a program may have is the backend's own setting (``--max-processes``)."""

    max_time_s: float = option(60.0, help="largest time_limit_s a request may set", gt=0)
    max_memory_mb: int = option(2048, help="largest memory_limit_mb a request may set", ge=16)
    max_output_bytes: int = option(8 << 20, help="largest output_limit_bytes (per stream) a request may set", ge=1)
    max_code_bytes: int = option(1 << 20, help="largest program, in UTF-8 bytes", ge=1)
    max_file_bytes: int = option(32 << 20, help="largest total size of files and files_b64 (decoded)", ge=0)
    max_fetch: int = option(64, help="most file names a request may fetch", ge=0)
    max_request_bytes: int = option(64 << 20, help="largest HTTP request body (stdin included)", ge=1024)


class Refused(Exception):
    """A request the service will not run: ``status`` (4xx) and what to change."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


_FIELDS = [f.name for f in dataclasses.fields(ExecRequest)]
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate: half of a pair (valid), or alone (not text: refused)."""


def _expect(body: dict[str, Any], name: str, kind: type, what: str) -> None:
    value = body.get(name)
    if name in body and (not isinstance(value, kind) or isinstance(value, bool)):
        raise Refused(422, f"{name} must be {what}, got {type(value).__name__} {str(value)[:40]!r}")


def _string_map(body: dict[str, Any], name: str) -> None:
    value = body.get(name, {})
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise Refused(422, f"{name} must be an object of file name -> string, got {str(value)[:60]!r}")


def _number(body: dict[str, Any], name: str, integer: bool, ceiling: str, most: float) -> None:
    if name not in body:
        return
    value = body[name]
    kinds = (int,) if integer else (int, float)
    if not isinstance(value, kinds) or isinstance(value, bool) or not (isinstance(value, int) or math.isfinite(value)):
        kind = "an integer" if integer else "a finite number"
        raise Refused(422, f"{name} must be {kind}, got {str(value)[:40]!r}")
    if value > most:
        raise Refused(422, f"{name}={value} is above this service's ceiling {ceiling}={most} "
                      "(set by its operator); ask for less")


def parse_request(body: bytes, ceilings: Ceilings) -> ExecRequest:
    """The ExecRequest in an HTTP body, checked against ``ceilings``; raises Refused."""
    if not body.strip():
        raise Refused(422, 'the body is empty: send an ExecRequest as a JSON object, e.g. {"code": "print(1)"}')
    try:
        data = json.loads(body)
    except ValueError as e:  # not UTF-8, not JSON, an integer of more than 4,300 digits
        raise Refused(400, f"the body is not JSON ({e}); send an ExecRequest as a JSON object") from e
    except RecursionError:
        raise Refused(400, "the body is not JSON (nested too deeply); send an ExecRequest as a JSON object") from None
    if not isinstance(data, dict):
        raise Refused(422, f"the body must be a JSON object (an ExecRequest), got {type(data).__name__}")
    if _SURROGATE_ESCAPE.search(body):  # rare: look whether a surrogate came without its pair
        try:
            json.dumps(data, ensure_ascii=False).encode()
        except (UnicodeEncodeError, RecursionError):
            raise Refused(422, "the body holds a lone surrogate escape (one of \\ud800-\\udfff without its pair), "
                          "which is not Unicode text; send valid Unicode (binary files go in files_b64)") from None
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise Refused(422, f"unknown field(s) {unknown} in the ExecRequest; its fields are {_FIELDS}")
    if "code" not in data:
        raise Refused(422, "the ExecRequest has no code: send at least {\"code\": \"...\"}")
    for name in ("code", "language", "stdin"):
        _expect(data, name, str, "a string")
    _string_map(data, "files")
    _string_map(data, "files_b64")
    fetch = data.get("fetch", [])
    if not isinstance(fetch, list) or not all(isinstance(n, str) for n in fetch):
        raise Refused(422, f"fetch must be a list of file names, got {str(fetch)[:60]!r}")
    _number(data, "time_limit_s", False, "max_time_s", ceilings.max_time_s)
    _number(data, "memory_limit_mb", True, "max_memory_mb", ceilings.max_memory_mb)
    _number(data, "output_limit_bytes", True, "max_output_bytes", ceilings.max_output_bytes)
    if len(fetch) > ceilings.max_fetch:
        raise Refused(422, f"fetch names {len(fetch)} files; this service's ceiling is max_fetch={ceilings.max_fetch}")
    code_bytes = len(data["code"].encode())
    if code_bytes > ceilings.max_code_bytes:
        raise Refused(413, f"code is {code_bytes} bytes, above this service's ceiling "
                      f"max_code_bytes={ceilings.max_code_bytes}")
    file_bytes = sum(len(v.encode()) for v in data.get("files", {}).values())
    for name, text in data.get("files_b64", {}).items():
        try:
            file_bytes += len(base64.b64decode(text, validate=True))
        except (binascii.Error, ValueError) as e:
            raise Refused(422, f"files_b64[{name!r}] is not valid base64 ({e})") from e
    if file_bytes > ceilings.max_file_bytes:
        raise Refused(413, f"files add up to {file_bytes} bytes, above this service's ceiling "
                      f"max_file_bytes={ceilings.max_file_bytes}")
    try:
        request = ExecRequest.from_dict(data)
        check_names(request)
    except (TypeError, ValueError) as e:
        raise Refused(422, f"not a valid ExecRequest: {e}") from e
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
                raise Refused(503, f"sandbox queue is full ({self.max_queue} waiting); retry later")
            self.queued += 1
            try:
                await asyncio.wait_for(self.sem.acquire(), QUEUE_WAIT_S)
            except TimeoutError as e:
                raise Refused(503, f"waited {QUEUE_WAIT_S:.0f} s in the sandbox queue; retry later") from e
            finally:
                self.queued -= 1
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self.sem.release()
