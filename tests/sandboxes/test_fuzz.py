"""Fuzzing every route of the sandbox service (``agentrl sandbox serve``, local backend) from its
OpenAPI document (issue 16): ExecRequests that follow the schema (which carries the service's
ceilings) and ones that break it, session routes with made-up ids; any 5xx, or an answer
slower than ``HANG_S``, fails (the ``openapi_fuzz`` fixture).

Bounded: ``EXAMPLES`` random cases per operation and mode and ``COVERAGE`` boundary cases per
operation, derandomized. The ceilings keep each program short (2 s, 64 MiB). Half of the
session runs go to a live session opened first (the others to made-up ids, a 404), so that
fuzzed programs reach a real session's interpreter too; sessions a case opens are closed
after it (an open session holds a place in admission, by design). The test checks that
programs did run, and that the service still runs one at the end."""

from __future__ import annotations

import subprocess
from collections import Counter

import httpx

EXAMPLES = 25
COVERAGE = 30
HANG_S = 30.0
UID_BASE = 63700  # its jails' uids, apart from the session's service (63000) and the fleet's (63500)


def test_no_route_answers_5xx_or_hangs(test_cgroup, helpers, openapi_fuzz):
    proc, url = helpers.start_service("local", test_cgroup, extra=(
        "--uid-base", str(UID_BASE), "--max-time-s", "2", "--max-memory-mb", "64", "--max-output-bytes", "65536",
        "--max-code-bytes", "65536", "--max-file-bytes", "65536", "--max-request-bytes", "262144", "--max-queue", "16"))
    headers = {"Authorization": f"Bearer {helpers.api_key}"}
    try:
        live = httpx.post(url + "/sessions", headers=headers, timeout=HANG_S).json()["session_id"]
        sent = Counter()
        ran: Counter[str] = Counter()

        def into_the_live_session(case) -> None:
            if case.operation.path == "/sessions/{sid}/run":
                sent[case.operation.path] += 1
                if sent[case.operation.path] % 2:
                    case.path_parameters["sid"] = live

        def close_sessions(response) -> None:
            if response is None or response.status_code != 200:
                return
            path = response.request.path_url
            if path == "/run" or path.endswith("/run"):
                ran["session" if path.startswith("/sessions/") else "run"] += 1
            sid = response.json().get("session_id") if path == "/sessions" else None
            if isinstance(sid, str):
                httpx.delete(f"{url}/sessions/{sid}", headers=headers, timeout=HANG_S)
        count, failures = openapi_fuzz(url, examples=EXAMPLES, hang_s=HANG_S, headers=headers,
                                       before=into_the_live_session, after=close_sessions, coverage=COVERAGE)
        assert not failures, "\n".join(failures)
        assert count >= 5 * EXAMPLES
        assert ran["run"] >= 5 and ran["session"] >= 3, ran
        r = httpx.post(url + "/run", headers=headers, json={"code": "print(6 * 7)"}, timeout=HANG_S)
        assert r.status_code == 200 and r.json()["stdout"] == "42\n", r.text
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(15)
