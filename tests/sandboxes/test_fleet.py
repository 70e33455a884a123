"""SandboxFleet over real sandbox services: sessions and runs spread over the live ones, a dead
service in the list is skipped (`sandbox.services` of a run's config builds one)."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from agentrl.api import ExecRequest, ExecStatus
from agentrl.plugins import make_sandbox
from agentrl.process.services import free_port

pytestmark = pytest.mark.timeout(180)


async def test_a_fleet_spreads_sessions_and_skips_a_dead_service(service, test_cgroup, helpers):
    from sandboxes.fleet import SandboxFleet
    from sandboxes.remote import RemoteSandbox

    proc, second = helpers.start_service("local", test_cgroup, extra=("--uid-base", "63500"))
    dead = f"http://127.0.0.1:{free_port()}"
    fleet = make_sandbox(f"{dead},{service},{second}", api_key=helpers.api_key, retries=0)
    probes = [RemoteSandbox(u, helpers.api_key) for u in (service, second)]
    try:
        assert isinstance(fleet, SandboxFleet) and fleet.urls == [dead, service, second]
        async with fleet.session() as a, fleet.session() as b:
            await a.run(ExecRequest(code="x = 'a'"))
            await b.run(ExecRequest(code="x = 'b'"))
            assert [(await p.health())["sessions"] for p in probes] == [1, 1]  # one each, none on the dead one
            ra, rb = await a.run(ExecRequest(code="print(x)")), await b.run(ExecRequest(code="print(x)"))
            assert (ra.stdout, rb.stdout) == ("a\n", "b\n")  # each session kept its own interpreter
        assert [(await p.health())["sessions"] for p in probes] == [0, 0]
        results = await asyncio.gather(*(fleet.run(ExecRequest(code=f"print({i})")) for i in range(6)))
        assert [r.status for r in results] == [ExecStatus.OK] * 6
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(6)]
    finally:
        await fleet.aclose()
        for p in probes:
            await p.aclose()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
