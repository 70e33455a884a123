"""The limits a program runs under, declared once: from a backend's config to the supervisor.

What it is: ``BackendLimits``, the settings every backend that runs our supervisor shares (the
work dir's size, which is also the file-size limit; processes per program; a session
interpreter's memory) — the base of ``LocalSandboxConfig`` and ``DockerSandboxConfig`` — and
``ProgramLimits``, the rlimits of one program or session (CPU seconds, address space, file
size, processes) that the host computes from a request and those settings and sends to the
supervisor as they are (``sandboxes/supervisor.py``'s ``set_limits`` applies them). What it is
not: what one request may ask for (``ExecRequest``'s time, memory and output fields) or the
service's ceilings on those (``sandboxes.ceilings``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from agentrl.api import ExecRequest
from agentrl.config import option

SESSION_CPU_S = 3600
"""CPU seconds of a session's interpreter (each call has its own wall-clock limit)."""


@dataclass(frozen=True)
class ProgramLimits:
    """The rlimits of one program (or a session's interpreter), as the supervisor sets them."""

    cpu_s: int  # RLIMIT_CPU
    memory_mb: int  # RLIMIT_AS
    file_mb: int  # RLIMIT_FSIZE
    nproc: int  # RLIMIT_NPROC

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class BackendLimits:
    """What every program of a backend runs under, whatever its request asks."""

    work_mb: int = option(64, help="size of the program's tmpfs work dir (/tmp gets a quarter), and its "
                                   "file-size limit", ge=1)
    max_processes: int = option(64, help="processes and threads one program may have at once", ge=1)
    session_memory_mb: int = option(512, help="address-space limit of a session's interpreter", ge=16)

    def for_request(self, request: ExecRequest) -> ProgramLimits:
        """One program's limits: its request's time (CPU seconds, rounded up with a second's
        slack: the wall clock is the supervisor's own deadline) and memory, and ours."""
        return ProgramLimits(cpu_s=int(request.time_limit_s) + 1, memory_mb=request.memory_limit_mb,
                             file_mb=self.work_mb, nproc=self.max_processes)

    def for_session(self) -> ProgramLimits:
        """A session interpreter's limits (it lives for many calls)."""
        return ProgramLimits(cpu_s=SESSION_CPU_S, memory_mb=self.session_memory_mb, file_mb=self.work_mb,
                             nproc=self.max_processes)
