"""Unique ids for requests and calls, cheap enough to draw for every token stream.

``unique_hex()`` is 32 hex digits like ``uuid.uuid4().hex``: 16 random ones drawn once per
process, then a counter. Unique across processes (the random half) and within one (the
counter), without reading the OS's random source per id (the rollout side draws one per
request and per call). Not for secrets (use ``secrets``), nor unguessable.
"""

from __future__ import annotations

import itertools
import os
import threading

_counter = itertools.count()
_lock = threading.Lock()
_prefix = ""
_pid = -1


def unique_hex() -> str:
    global _prefix, _pid, _counter
    if _pid != os.getpid():  # a forked child draws its own prefix
        with _lock:
            if _pid != os.getpid():
                _prefix, _pid, _counter = os.urandom(8).hex(), os.getpid(), itertools.count()
    return f"{_prefix}{next(_counter):016x}"
