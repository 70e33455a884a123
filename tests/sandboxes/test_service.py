"""The sandbox service over real HTTP (a real ``agentrl sandbox serve`` process), the CLI, and
the test cgroup that holds every backend under test."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from agentrl.api import ExecRequest, ExecStatus
from agentrl.errors import SandboxError
from agentrl.plugins import make_sandbox

pytestmark = pytest.mark.timeout(180)


async def test_health_needs_no_key_but_everything_else_does(service, helpers):
    async with httpx.AsyncClient(base_url=service, timeout=30) as client:
        health = (await client.get("/health")).json()
        assert health["ok"] and health["backend"] == "local"
        r = await client.post("/run", json={"code": "print(1)"})
        assert r.status_code == 401 and "API key" in r.json()["detail"]
        r = await client.post("/run", json={"code": "print(1)"}, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        r = await client.post("/run", json={"code": "print(1)"}, headers={"Authorization": f"Bearer {helpers.api_key}"})
        assert r.status_code == 200 and r.json()["stdout"] == "1\n"


async def test_bad_requests_are_422_with_the_reason(service, helpers):
    headers = {"Authorization": f"Bearer {helpers.api_key}"}
    async with httpx.AsyncClient(base_url=service, timeout=30, headers=headers) as client:
        r = await client.post("/run", json={"code": "x", "language": "ruby"})
        assert r.status_code == 422 and "language" in r.json()["detail"]
        r = await client.post("/run", json={"cod": "x"})
        assert r.status_code == 422 and "ExecRequest" in r.json()["detail"]
        r = await client.post("/sessions/nope/run", json={"code": "x"})
        assert r.status_code == 404


async def test_remote_sandbox_from_a_url_and_its_errors(service, helpers):
    sandbox = make_sandbox(service, api_key=helpers.api_key)
    r = await sandbox.run(ExecRequest(code="print('via url')"))
    assert r.status is ExecStatus.OK and r.stdout == "via url\n"
    bad = make_sandbox(service, api_key="wrong")
    with pytest.raises(SandboxError, match="401"):
        await bad.run(ExecRequest(code="print(1)"))
    await sandbox.aclose()
    await bad.aclose()


async def test_sessions_end_on_the_server_too(service, helpers):
    sandbox = make_sandbox(service, api_key=helpers.api_key)
    async with sandbox.session() as s:
        await s.run(ExecRequest(code="x = 1"))
        assert (await sandbox.health())["sessions"] >= 1
        sid = s.session_id
    async with httpx.AsyncClient(base_url=service, timeout=30,
                                 headers={"Authorization": f"Bearer {helpers.api_key}"}) as client:
        r = await client.post(f"/sessions/{sid}/run", json={"code": "x"})
        assert r.status_code == 404
    await sandbox.aclose()


async def test_service_with_the_docker_backend(docker_ready, test_cgroup, helpers):
    proc, url = helpers.start_service("docker", test_cgroup, extra=("--pool-size", "1"))
    try:
        sandbox = make_sandbox(url, api_key=helpers.api_key)
        r = await sandbox.run(ExecRequest(code="import socket\nprint(socket.gethostname())"))
        assert (r.status, r.stdout) == (ExecStatus.OK, "sandbox\n")
        async with sandbox.session() as s:
            await s.run(ExecRequest(code="y = 2"))
            assert (await s.run(ExecRequest(code="y * 21"))).stdout == "42\n"
        await sandbox.aclose()
    finally:
        proc.terminate()
        proc.wait(30)


def test_cli_run_prints_one_json_result(tmp_path, local_sandbox, helpers):
    prog = tmp_path / "prog.py"
    prog.write_text("import sys\nprint(sys.stdin.read().upper())\nraise SystemExit(2)\n")
    stdin = tmp_path / "in.txt"
    stdin.write_text("abc")
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "sandbox", "run", "--timeout", "5", "--memory", "128",
                          "--stdin", str(stdin), str(prog)], capture_output=True, text=True, cwd=helpers.repo, timeout=60)
    assert out.returncode == 1, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert (result["status"], result["exit_code"], result["stdout"]) == ("runtime_error", 2, "ABC\n")


def test_cli_run_against_the_service(tmp_path, service, helpers):
    prog = tmp_path / "prog.sh"
    prog.write_text("echo from-bash\n")
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "sandbox", "run", "--backend", service,
                          "--api-key", helpers.api_key, str(prog)], capture_output=True, text=True, cwd=helpers.repo, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["stdout"] == "from-bash\n"


def test_cli_run_missing_file_is_one_line_error(tmp_path, helpers):
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "sandbox", "run", str(tmp_path / "nope.py")],
                         capture_output=True, text=True, cwd=helpers.repo, timeout=60)
    assert out.returncode == 2 and "cannot read" in out.stderr and len(out.stderr.strip().splitlines()) == 1


async def test_backends_under_test_live_in_the_test_cgroup(local_sandbox, test_cgroup, helpers):
    # the jails' fork server joined the test cgroup, so every jail counts against its pids limit
    await local_sandbox.run(ExecRequest(code="pass"))
    assert helpers.cgroup_pids(test_cgroup) >= 1
    r = await local_sandbox.run(ExecRequest(code="import time\ntime.sleep(0.5)"))
    assert r.status is ExecStatus.OK


def test_cli_run_on_docker_leaves_no_container(tmp_path, docker_ready, helpers):
    import docker

    prog = tmp_path / "prog.py"
    prog.write_text("import socket\nprint(socket.gethostname())\n")
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "sandbox", "run", "--backend", "docker", str(prog)],
                         capture_output=True, text=True, cwd=helpers.repo, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["stdout"] == "sandbox\n"
    # the CLI process is gone: no container may be left that names a dead owner
    labelled = docker.from_env().containers.list(all=True, filters={"label": "agentrl.sandbox"})
    owners = [c.labels.get("agentrl.sandbox.owner", "") for c in labelled]
    assert all(os.path.exists(f"/proc/{o.rpartition(':')[2]}") for o in owners), owners
