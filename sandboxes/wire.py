"""The supervisor protocol, host side: what a backend sends for one ExecRequest and how the
supervisor's JSON reply becomes an ExecResult. Shared by LocalSandbox and DockerSandbox.

What it is not: the supervisor (``sandboxes/supervisor.py``, which runs inside the jail or the
container and may import nothing of ours). Main hook: ``request_payload(request, ...)``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from agentrl.api import ExecRequest, ExecResult, ExecStatus
from sandboxes.program_limits import BackendLimits


def check_names(request: ExecRequest) -> None:
    """Reject file names that are not relative paths inside the work dir (caller's bug)."""
    for name in [*request.files, *request.files_b64, *request.fetch]:
        norm = os.path.normpath(name)
        if not name or os.path.isabs(norm) or norm == "." or norm.split(os.sep)[0] == "..":
            raise ValueError(
                f"file name {name!r} must be a relative path inside the work dir, like 'data/input.txt'"
            )


def check_sizes(request: ExecRequest, work_mb: int) -> None:
    """Reject code and files that cannot fit where the supervisor writes them (the program
    in ``/tmp``, a quarter of the work dir's size; the files in ``/work``): the caller's
    request is too big, which is not the backend's failure."""
    code = len(request.code.encode())
    tmp_bytes = max(work_mb // 4, 1) << 20
    if code > tmp_bytes // 2:
        raise ValueError(f"code is {code} bytes; this sandbox takes at most {tmp_bytes // 2} "
                         f"(half of its {tmp_bytes >> 20} MiB /tmp)")
    files = sum(len(c.encode()) for c in request.files.values())
    files += sum(len(c) * 3 // 4 for c in request.files_b64.values())
    if files > work_mb << 20:
        raise ValueError(f"files add up to {files} bytes; the work dir holds {work_mb} MiB")


def request_payload(request: ExecRequest, limits: BackendLimits) -> dict[str, Any]:
    """The supervisor's ``run`` request: the ExecRequest plus the program's rlimits
    (``limits.for_request``). Raises ValueError for file names outside the work dir and for
    code or files too big for the work dirs."""
    check_names(request)
    check_sizes(request, limits.work_mb)
    return {**request.to_dict(), "limits": limits.for_request(request).to_wire()}


def result_from_reply(reply: dict[str, Any]) -> ExecResult:
    known = {f.name for f in dataclasses.fields(ExecResult)}
    return ExecResult.from_dict({k: v for k, v in reply.items() if k in known})


def sandbox_error(message: str) -> ExecResult:
    return ExecResult(status=ExecStatus.SANDBOX_ERROR, error=message)
