"""The sandbox service over real HTTP (a real ``agentrl sandbox serve`` process), the CLI, and
the test cgroup that holds every backend under test."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time

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
        assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
        r = await client.post("/run", json={"code": "print(1)"}, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        r = await client.post("/run", json={"code": "print(1)"}, headers={"Authorization": f"Bearer {helpers.api_key}"})
        assert r.status_code == 200 and r.json()["stdout"] == "1\n"


async def test_bad_requests_are_422_with_the_reason(service, helpers):
    headers = {"Authorization": f"Bearer {helpers.api_key}"}
    async with httpx.AsyncClient(base_url=service, timeout=30, headers=headers) as client:
        r = await client.post("/run", json={"code": "x", "language": "ruby"})
        assert r.status_code == 422 and "language" in r.json()["error"]["message"]
        r = await client.post("/run", json={"cod": "x"})
        assert r.status_code == 422 and "ExecRequest" in r.json()["error"]["message"]
        r = await client.post("/sessions/nope/run", json={"code": "x"})
        assert r.status_code == 404


async def test_every_malformed_request_is_a_4xx_with_a_message(service, helpers):
    headers = {"Authorization": f"Bearer {helpers.api_key}"}
    async with httpx.AsyncClient(base_url=service, timeout=60, headers=headers) as client:
        cases = [
            (b"", 400, "empty"),
            (b"{not json", 400, "not valid JSON"),
            (b"[1, 2]", 400, "JSON object"),
            (json.dumps({"code": 5}).encode(), 422, "code must be a string"),
            (json.dumps({"code": "x", "time_limit_s": 1e12}).encode(), 422, "max_time_s"),
            (b'{"code": "x", "time_limit_s": NaN}', 422, "finite number"),
            (json.dumps({"code": "x", "memory_limit_mb": 100 << 20}).encode(), 422, "max_memory_mb"),
            (json.dumps({"code": "x", "files": {"a": 1}}).encode(), 422, "files must be"),
            (json.dumps({"code": "x", "fetch": "out.txt"}).encode(), 422, "fetch must be"),
            (json.dumps({"code": "x", "files": {"../up": "x"}}).encode(), 422, "inside the work dir"),
            (json.dumps({"code": "x" * (50 << 20)}).encode(), 413, "max_code_bytes"),
        ]
        for body, status, says in cases:
            r = await client.post("/run", content=body, headers={"content-type": "application/json"})
            assert (r.status_code, says in r.json()["error"]["message"]) == (status, True), (body[:60], r.status_code, r.text[:300])
        r = await client.post("/run", content=b"x" * (65 << 20))
        assert r.status_code == 413 and "max_request_bytes" in r.json()["error"]["message"]
        # and the service still serves
        r = await client.post("/run", json={"code": "print(7)"})
        assert r.status_code == 200 and r.json()["stdout"] == "7\n"


async def test_a_disconnected_client_frees_its_place_at_once(service, helpers, sandbox_uid_processes):
    """Four abandoned 60 s programs (the service runs four at once) are killed as their
    clients go; the next request runs at once and nothing is left running."""
    headers = {"Authorization": f"Bearer {helpers.api_key}"}
    slow = {"code": "import time\ntime.sleep(60)", "time_limit_s": 60}
    async with httpx.AsyncClient(base_url=service, timeout=1.5, headers=headers) as client:
        results = await asyncio.gather(*[client.post("/run", json=slow) for _ in range(4)], return_exceptions=True)
    assert all(isinstance(r, httpx.ReadTimeout) for r in results), results
    async with httpx.AsyncClient(base_url=service, timeout=30, headers=headers) as client:
        for _ in range(100):
            health = (await client.get("/health")).json()
            if health["running"] == 0 and not sandbox_uid_processes():
                break
            await asyncio.sleep(0.05)
        assert health["running"] == 0, health
        assert not sandbox_uid_processes()
        t = time.monotonic()
        r = await client.post("/run", json={"code": "print('next')"})
        assert r.json()["stdout"] == "next\n" and time.monotonic() - t < 10


async def test_sessions_hold_a_place_and_show_their_cpu(service, helpers):
    sandbox = make_sandbox(service, api_key=helpers.api_key)
    async with sandbox.session() as s:
        r = await s.run(ExecRequest(code="import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3:\n    pass"))
        assert r.status is ExecStatus.OK, r
        health = await sandbox.health()
        assert health["running"] >= 1 and health["sessions"] >= 1, health
        assert max(health["session_cpu_s"]) >= 0.3, health
    health = await sandbox.health()
    assert health["running"] == 0 and health["ceilings"]["max_time_s"] == 60.0, health
    await sandbox.aclose()


def test_serve_refuses_an_open_address_without_a_key(helpers):
    env = {k: v for k, v in os.environ.items() if k != "AGENTRL_SANDBOX_API_KEY"}
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "sandbox", "serve", "--backend", "local",
                          "--host", "0.0.0.0", "--port", "0"],
                         capture_output=True, text=True, cwd=helpers.repo, timeout=60, env=env)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "without an API key" in out.stderr and "--insecure" in out.stderr


@pytest.mark.parametrize("argv, says", [
    (["--timeout", "-1"], "time_limit_s must be > 0"),
    (["--memory", "0"], "memory_limit_mb must be >= 16"),
    (["BINARY"], "is not UTF-8 text"),
])
def test_cli_run_bad_input_is_one_line_error(tmp_path, helpers, argv, says):
    prog = tmp_path / "prog.py"
    prog.write_text("print(1)\n")
    binary = tmp_path / "prog.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    argv = [str(binary) if a == "BINARY" else a for a in argv]
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "sandbox", "run", *argv,
                          *([] if "BINARY" in argv or str(binary) in argv else [str(prog)])],
                         capture_output=True, text=True, cwd=helpers.repo, timeout=60)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert says in out.stderr, out.stderr


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
    with contextlib.closing(docker.from_env()) as client:
        labelled = client.containers.list(all=True, filters={"label": "agentrl.sandbox"})
    owners = [c.labels.get("agentrl.sandbox.owner", "") for c in labelled]
    assert all(os.path.exists(f"/proc/{o.rpartition(':')[2]}") for o in owners), owners
