"""Fixtures for the sandbox tests: real backends, each held inside a test cgroup.

Every backend under test runs inside one cgroup made for this test session, with its own
memory and pids limits (``TEST_CGROUP_MEMORY_MB``, ``TEST_CGROUP_PIDS``): LocalSandbox's
fork server and jails join it (``cgroup_parent``), the sandbox service is started with it,
and the Docker containers are created under it (``cgroup_parent``). A broken jail then
fails a test instead of taking the machine down.

The backends: ``local`` (root mode), ``local-rootless`` (LocalSandbox in rootless mode: its
bubblewrap fork server and every jail run as the unprivileged uid ``ROOTLESS_HOST_UID``, with
``/usr/bin/python3``, which that uid can read), ``docker`` and ``service`` (a real
``agentrl sandbox serve`` with the local backend).

Docker and rootless tests skip only when their prerequisite (an engine; bubblewrap and an
interpreter under /usr) is missing and ``CI`` is not set; under CI they fail instead
(``make test`` installs and starts them first).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

TEST_CGROUP_MEMORY_MB = 2048
TEST_CGROUP_PIDS = 1024
LOCAL_UID_BASE = 62000  # the test backends' own uid ranges, so leftover checks see only ours
SERVICE_UID_BASE = 63000
DOCKER_UID_BASE = 12000
ROOTLESS_HOST_UID = 64000  # the host uid of the rootless fork server and its jails
ROOTLESS_PYTHON = "/usr/bin/python3"
API_KEY = "test-key-" + os.urandom(4).hex()
REPO = Path(__file__).resolve().parents[2]


def _cgroup_v2() -> bool:
    return os.path.exists("/sys/fs/cgroup/cgroup.controllers")


def _cgroup_dirs(name: str) -> list[Path]:
    if _cgroup_v2():
        return [Path("/sys/fs/cgroup") / name]
    return [Path("/sys/fs/cgroup") / c / name for c in ("memory", "pids")]


@pytest.fixture(scope="session")
def test_cgroup():
    """Name (relative to the hierarchy root) of this session's cgroup, with its limits set."""
    if os.geteuid() != 0:
        pytest.skip("the sandbox tests need root (jails, cgroups); CI runs them as root")
    name = f"agentrl-tests-{os.getpid()}"
    dirs = _cgroup_dirs(name)
    try:
        for d in dirs:
            d.mkdir()
        mb = TEST_CGROUP_MEMORY_MB << 20
        if _cgroup_v2():
            (dirs[0] / "memory.max").write_text(str(mb))
            (dirs[0] / "pids.max").write_text(str(TEST_CGROUP_PIDS))
        else:
            (dirs[0] / "memory.limit_in_bytes").write_text(str(mb))
            (dirs[1] / "pids.max").write_text(str(TEST_CGROUP_PIDS))
    except OSError as e:
        pytest.fail(f"cannot make the test cgroup {name} ({e}); the hostile tests must not run unbounded")
    yield name
    tops = [*Path("/sys/fs/cgroup").glob(name), *Path("/sys/fs/cgroup").glob(f"*/{name}"),
            *Path("/sys/fs/cgroup").glob(f"*/*/*/{name}")]  # docker may nest it under its own cgroup
    for top in tops:
        for d in sorted(top.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if d.is_dir():
                _rmdir(d)
        _rmdir(top)


def _rmdir(d: Path) -> None:
    for _ in range(100):
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)


@pytest.fixture(scope="session")
def helpers():
    """Helpers for tests (with --import-mode=importlib a conftest is not importable)."""
    import types

    return types.SimpleNamespace(api_key=API_KEY, repo=REPO, start_service=start_service, cgroup_pids=cgroup_pids,
                                 cgroup_pressure=cgroup_pressure, rootless_python=ROOTLESS_PYTHON)


def cgroup_pids(name: str) -> int:
    """Processes now in the test cgroup (v1: the pids hierarchy)."""
    d = _cgroup_dirs(name)[-1]
    return int((d / "pids.current").read_text())


def cgroup_pressure(name: str) -> dict[str, int]:
    """How often the test cgroup itself hit its memory or pids limit (0 while every jail and
    container held within its own, smaller limits)."""
    if _cgroup_v2():
        d = Path("/sys/fs/cgroup") / name
        mem = dict(line.split() for line in (d / "memory.events").read_text().splitlines())
        pids = dict(line.split() for line in (d / "pids.events").read_text().splitlines())
        return {"memory": int(mem.get("max", 0)), "pids": int(pids.get("max", 0))}
    mem, pid = _cgroup_dirs(name)
    pids = dict(line.split() for line in (pid / "pids.events").read_text().splitlines())
    return {"memory": int((mem / "memory.failcnt").read_text()), "pids": int(pids.get("max", 0))}


@pytest.fixture(scope="session")
def local_sandbox(test_cgroup):
    from sandboxes.local import LocalSandbox

    sandbox = LocalSandbox(cgroup_parent=test_cgroup, max_concurrency=4, uid_base=LOCAL_UID_BASE)
    yield sandbox
    asyncio.run(sandbox.aclose())


_ROOTLESS_BASELINE: set[int] = set()  # the rootless fork server's own long-lived processes


def _prerequisite(why: str, what: str) -> None:
    """Skip for ``why`` (or fail under CI, where ``make test`` provides ``what``)."""
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {why}; `make test` should have provided {what}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def rootless_sandbox(test_cgroup):
    """LocalSandbox in rootless mode, its fork server (in bubblewrap) and jails running as
    ROOTLESS_HOST_UID, the whole of it inside the test cgroup (the root test process joins
    it for them before dropping to that uid)."""
    import shutil

    from sandboxes.local import LocalSandbox

    if shutil.which("bwrap") is None:
        _prerequisite("bubblewrap is not installed", "bubblewrap (docker/ensure-sandbox-tools.sh)")
    if not os.access(ROOTLESS_PYTHON, os.X_OK):
        _prerequisite(f"no {ROOTLESS_PYTHON} for the unprivileged user", "python3 (Debian's)")
    sandbox = LocalSandbox(mode="rootless", rootless_uid=ROOTLESS_HOST_UID, python=ROOTLESS_PYTHON,
                           cgroup_parent=test_cgroup, max_concurrency=4)
    asyncio.run(sandbox.start())
    _ROOTLESS_BASELINE.update(host_uid_processes(ROOTLESS_HOST_UID, ROOTLESS_HOST_UID + 1))
    yield sandbox
    asyncio.run(sandbox.aclose())
    _ROOTLESS_BASELINE.clear()


@pytest.fixture(scope="session")
def docker_sandbox(docker_ready, test_cgroup):
    from sandboxes.docker import DockerSandbox

    sandbox = DockerSandbox(pool_size=2, memory_mb=384, cgroup_parent="/" + test_cgroup, uid=DOCKER_UID_BASE)
    asyncio.run(sandbox.start())
    yield sandbox
    asyncio.run(sandbox.aclose())


def start_service(backend: str, cgroup: str, api_key: str = API_KEY, extra: tuple[str, ...] = ()):
    """Start ``agentrl sandbox serve`` as a real process; returns (process, url)."""
    from agentrl.process.services import ServiceProcess

    uid = SERVICE_UID_BASE if backend == "local" else DOCKER_UID_BASE + 50
    argv = [sys.executable, "-m", "agentrl.cli", "sandbox", "serve", "--backend", backend, "--port", "0",
            "--api-key", api_key, "--cgroup-parent", cgroup, "--max-concurrency", "4", "--uid-base", str(uid), *extra]
    service = ServiceProcess(argv, ready="agentrl sandbox serve: ready on ", startup_timeout=120, cwd=REPO)
    return service.proc, service.url


@pytest.fixture(scope="session")
def service(test_cgroup):
    proc, url = start_service("local", test_cgroup)
    yield url
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture
def remote_sandbox(service):
    from sandboxes.remote import RemoteSandbox

    return RemoteSandbox(service, api_key=API_KEY)


@pytest.fixture(params=["local", "local-rootless", "docker", "service"])
def sandbox(request):
    """Each backend in turn: the same tests run on all four."""
    return request.getfixturevalue({"local": "local_sandbox", "local-rootless": "rootless_sandbox",
                                    "docker": "docker_sandbox", "service": "remote_sandbox"}[request.param])


@pytest.fixture(scope="session")
def canary():
    """A host process the hostile programs try to signal; it must survive them all."""
    proc = subprocess.Popen(["sleep", "3600"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture(scope="session")
def loopback_listener():
    """A TCP listener on the host's 127.0.0.1 that no sandboxed program may reach."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.settimeout(0.05)
    yield sock
    sock.close()


@pytest.fixture(scope="session")
def sandbox_uid_processes():
    """Host pids of processes owned by a sandbox uid (local jails or containers; rootless:
    those of its uid but the fork server's own)."""
    return lambda: (host_uid_processes(LOCAL_UID_BASE, LOCAL_UID_BASE + 256)
                    + host_uid_processes(SERVICE_UID_BASE, SERVICE_UID_BASE + 256)
                    + host_uid_processes(DOCKER_UID_BASE, DOCKER_UID_BASE + 100)
                    + [p for p in host_uid_processes(ROOTLESS_HOST_UID, ROOTLESS_HOST_UID + 1)
                       if p not in _ROOTLESS_BASELINE])


def host_uid_processes(lo: int, hi: int) -> list[int]:
    """Host pids owned by a uid in [lo, hi) — sandboxed programs that outlived their run."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if lo <= os.stat(f"/proc/{name}").st_uid < hi:
                    out.append(int(name))
            except OSError:
                pass
    return out
