"""``Ceilings``: the most one request to the sandbox service may ask for, declared once.

What it is: the operator's limits, one field each — ``agentrl sandbox serve --max-...``
generates its flags from them (``agentrl.config.add_arguments``), ``sandboxes.admission``
refuses a request above one (4xx, naming the ceiling) and ``GET /health`` shows them. It
imports nothing heavy, so the command line can read it to build its parser. What it is not:
the checks themselves (``sandboxes.admission``) or the backends' own settings (the number of
processes a program may have is ``--max-processes``, the backend's).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.config import option


@dataclass
class Ceilings:
    """The most one request may ask for, set by the service's operator (``agentrl sandbox
    serve --max-...``). A request above one is refused (4xx) with the ceiling's name."""

    max_time_s: float = option(60.0, help="largest time_limit_s a request may set", gt=0)
    max_memory_mb: int = option(2048, help="largest memory_limit_mb a request may set", ge=16)
    max_output_bytes: int = option(8 << 20, help="largest output_limit_bytes (per stream) a request may set", ge=1)
    max_code_bytes: int = option(1 << 20, help="largest program, in UTF-8 bytes", ge=1)
    max_file_bytes: int = option(32 << 20, help="largest total size of files and files_b64 (decoded)", ge=0)
    max_fetch: int = option(64, help="most file names a request may fetch", ge=0)
    max_request_bytes: int = option(64 << 20, help="largest HTTP request body (stdin included)", ge=1024)
