"""RepoContainer: one container of a task's image, held for one episode (blocking; used from threads).

What it is: the container side of repository tasks (SWE-bench instances, Harbor task
directories). A container is created from the task's image, unchanged, with every limit set:
memory and swap, pids, CPU quota, no network (``network_mode=none``) unless the task asks for
it, all capabilities dropped but the few a root user of a normal image needs to install
packages and own files (no ``NET_RAW``, ``SYS_ADMIN``, ``MKNOD``...), ``no-new-privileges``,
Docker's init as pid 1 (it reaps orphans) over a keeper process, and the labels
``agentrl.repo`` + ``agentrl.repo.owner=host:pid`` so that ``remove_leftovers`` removes what a
killed run left. It offers programs run through ``docker exec`` (stdin fed, output drained
with a cap, a deadline), files written and read without any tool the image may lack (only
``sh``, ``cat``, ``tar``), and ``kill_processes`` (everything but the keeper and what is named).

Disk: the writable layer is bounded by ``storage_opt size`` where the engine supports it
(overlay2 on xfs with pquota, btrfs, zfs); elsewhere ``disk_used_mb`` reads its size (the
engine's ``SizeRw``, milliseconds) so the pool's watchdog can destroy a container that went past
``disk_mb`` (``RepoPool``).

What it is not: the persistent shell (``sandboxes/repo_shell.py``) or the pool
(``sandboxes/repo_pool.py``). Trust boundary: the container is the isolation boundary, as
for ``DockerSandbox``, with a weaker inside (root in the container, a writable root filesystem:
task images expect both); kernel exploits and the engine's own security are not covered.
"""

from __future__ import annotations

import contextlib
import io
import socket
import struct
import tarfile
import time
from dataclasses import dataclass, field
from typing import Any

from agentrl.config import option
from agentrl.errors import SandboxError

LABEL = "agentrl.repo"
KEEPER = ["sleep", "2147483647"]
CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID"]
MAX_EXEC_OUTPUT = 8 << 20
"""Bytes of one ``exec``'s output kept (files read, grading logs); the rest is cut from the middle."""
_KILL_SCRIPT = (  # dash/bash builtins only (no fork): stop everything (a stopped process cannot fork), then kill
    'k() { for d in /proc/[0-9]*; do p=${d#/proc/}; case " $KEEP $$ " in *" $p "*) ;; *) kill -$1 "$p" 2>/dev/null;; esac; done; }; '
    'KEEP=$1; k STOP; k STOP; k STOP; k KILL; n=0; '
    'for d in /proc/[0-9]*; do p=${d#/proc/}; case " $KEEP $$ " in *" $p "*) ;; *) n=$((n+1));; esac; done; echo $n')


@dataclass(frozen=True)
class ContainerSpec:
    """What an episode's container is: the task's image and its limits (the pool's key)."""

    image: str = option(help="the task's image (pulled or built beforehand)")
    workdir: str = option("", help="working directory of commands; empty: the image's own")
    cpus: float = option(1.0, help="CPU quota, in CPUs", gt=0)
    memory_mb: int = option(2048, help="memory (and memory+swap) limit", ge=64)
    pids: int = option(256, help="pids limit (a fork bomb stops here)", ge=16)
    disk_mb: int = option(4096, help="writable-layer limit: a quota where the engine has one, else the watchdog's", ge=16)
    network: bool = option(False, help="a bridge network (the task allows the internet); default none: loopback only")
    prepare: str = option("", help="shell script run once when the container starts, before the episode gets it")
    env: tuple[tuple[str, str], ...] = field(default=(), metadata={"help": "environment variables of every command"})


@dataclass
class ExecOutput:
    """What one program run through ``docker exec`` did."""

    exit_code: int | None  # None: killed at its deadline
    output: bytes
    timed_out: bool = False


class ExecStream:
    """One ``docker exec`` with stdin attached: raw socket, multiplexed frames (no TTY)."""

    def __init__(self, sock: Any) -> None:
        self.keep = sock
        self.raw: socket.socket = getattr(sock, "_sock", sock)

    def send(self, data: bytes) -> None:
        self.raw.settimeout(30)
        self.raw.sendall(data)

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError):
            self.raw.shutdown(socket.SHUT_WR)

    def frame(self, deadline: float) -> bytes | None:
        """The next frame's payload (stdout and stderr alike), b"" at the deadline, None at EOF."""
        header = self._exactly(8, deadline)
        if not header:
            return header
        return self._exactly(struct.unpack(">I", header[4:])[0], None) if len(header) == 8 else None

    def _exactly(self, n: int, deadline: float | None) -> bytes | None:
        out = bytearray()
        while len(out) < n:
            left = 30.0 if deadline is None or out else deadline - time.monotonic()
            if left <= 0:
                return b""
            self.raw.settimeout(left)
            try:
                chunk = self.raw.recv(n - len(out))
            except TimeoutError:
                if out or deadline is None:
                    raise SandboxError("the container's exec stream stalled mid-frame") from None
                return b""
            if not chunk:
                return None
            out += chunk
        return bytes(out)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.raw.close()
        with contextlib.suppress(Exception):
            getattr(self.keep, "_response", self.keep).close()


def cut_middle(data: bytes, limit: int) -> bytes:
    """``data`` with its middle replaced by a marker when it is longer than ``limit`` bytes."""
    if len(data) <= limit:
        return data
    half = limit // 2
    return data[:half] + f"\n[... {len(data) - 2 * half} bytes cut ...]\n".encode() + data[-half:]


class RepoContainer:
    """One started container of ``spec`` (see the module docstring)."""

    def __init__(self, client: Any, container: Any, spec: ContainerSpec, quota: bool) -> None:
        self.client, self.container, self.spec, self.quota = client, container, spec, quota
        self.keeper_pid = 0
        self.destroyed = False
        self.workdir = spec.workdir or (container.attrs.get("Config", {}).get("WorkingDir") or "/")

    @classmethod
    def start(cls, client: Any, spec: ContainerSpec, owner: str, *, quota: bool) -> RepoContainer:
        """Create and start a container of ``spec``; ``quota``: try ``storage_opt size``."""
        kwargs: dict[str, Any] = dict(
            entrypoint=KEEPER[:1], command=KEEPER[1:], init=True, detach=True,
            network_mode="bridge" if spec.network else "none",
            mem_limit=f"{spec.memory_mb}m", memswap_limit=f"{spec.memory_mb}m",
            pids_limit=spec.pids, nano_cpus=int(spec.cpus * 1e9),
            cap_drop=["ALL"], cap_add=CAPABILITIES, security_opt=["no-new-privileges:true"],
            labels={LABEL: "1", f"{LABEL}.owner": owner}, hostname="repo",
            environment=dict(spec.env),
        )
        if spec.workdir:
            kwargs["working_dir"] = spec.workdir
        if quota:
            kwargs["storage_opt"] = {"size": f"{spec.disk_mb}M"}
        container = client.containers.create(spec.image, **kwargs)
        box = cls(client, container, spec, quota)
        try:
            container.start()
            container.reload()
            children: list[bytes] = []
            for _ in range(50):  # init forks the keeper after the start returns: under load, later
                children = box.exec(["cat", "/proc/1/task/1/children"], timeout_s=30).output.split()
                if children:
                    break
                time.sleep(0.1)
            if len(children) != 1:
                raise SandboxError(f"the container's init has {len(children)} children, expected the keeper alone")
            box.keeper_pid = int(children[0])
            if spec.prepare:
                done = box.exec(["sh", "-c", spec.prepare], timeout_s=300, workdir=box.workdir)
                if done.exit_code != 0:
                    raise SandboxError(f"the task's prepare script failed ({done.exit_code}): "
                                       f"{done.output[-500:].decode(errors='replace')}")
        except BaseException:
            box.destroy()
            raise
        return box

    # ---- programs

    def open_exec(self, cmd: list[str], *, workdir: str | None = None, env: dict[str, str] | None = None) -> ExecStream:
        """Start ``cmd`` in the container with stdin attached; the caller drives the stream."""
        api = self.client.api
        exec_id = api.exec_create(self.container.id, cmd, stdin=True, stdout=True, stderr=True,
                                  workdir=workdir or self.workdir, environment={**dict(self.spec.env), **(env or {})})["Id"]
        return ExecStream(api.exec_start(exec_id, socket=True))

    def exec(self, cmd: list[str], *, stdin: bytes | None = None, timeout_s: float = 60.0,
             workdir: str | None = None, env: dict[str, str] | None = None,
             max_output: int = MAX_EXEC_OUTPUT) -> ExecOutput:
        """Run ``cmd`` to its end (or kill everything the episode runs at ``timeout_s``)."""
        api = self.client.api
        exec_id = api.exec_create(self.container.id, cmd, stdin=stdin is not None, stdout=True, stderr=True,
                                  workdir=workdir or self.workdir,
                                  environment={**dict(self.spec.env), **(env or {})})["Id"]
        stream = ExecStream(api.exec_start(exec_id, socket=True))
        out, dropped = bytearray(), 0
        deadline = time.monotonic() + timeout_s
        try:
            if stdin is not None:
                stream.send(stdin)
                stream.close_stdin()
            while (payload := stream.frame(deadline)) is not None:
                if payload == b"" and time.monotonic() >= deadline:
                    self.kill_processes()
                    return ExecOutput(None, cut_middle(bytes(out), max_output), timed_out=True)
                out += payload
                if len(out) > 2 * max_output:  # keep the head and a rolling tail
                    dropped += len(out) - max_output
                    out = out[: max_output // 2] + out[-max_output // 2:]
        finally:
            stream.close()
        code = api.exec_inspect(exec_id).get("ExitCode")
        data = bytes(out)
        if dropped:
            data = data[: max_output // 2] + f"\n[... {dropped} bytes cut ...]\n".encode() + data[max_output // 2:]
        return ExecOutput(code, cut_middle(data, max_output + 64))

    def kill_processes(self, keep: tuple[int, ...] = ()) -> int:
        """SIGKILL every process of the container but init, the keeper and ``keep``; returns how
        many others were still there after the sweeps (0: all gone). ``SandboxError`` when no
        sweep could even start (the pids limit held by what runs)."""
        left, failure = -1, None
        for attempt in range(20):
            try:
                done = self.exec(["sh", "-c", _KILL_SCRIPT, "sh", " ".join(map(str, (1, self.keeper_pid, *keep)))],
                                 timeout_s=30, workdir="/")
            except Exception as e:  # exec could not start a process: pids exhausted for a moment
                failure = e
                time.sleep(0.05 * (attempt + 1))
                continue
            words = done.output.split()
            left = int(words[-1]) if words and words[-1].isdigit() else -1
            if left == 0:
                return 0
        if left < 0 and failure is not None:
            raise SandboxError(f"could not stop the container's processes: {failure!r}")
        return left

    # ---- files (no tool of the image needed but sh, cat and tar)

    def read_file(self, path: str, max_bytes: int = MAX_EXEC_OUTPUT) -> bytes:
        done = self.exec(["sh", "-c", 'test -f "$1" && cat -- "$1"', "sh", path], timeout_s=60, max_output=max_bytes)
        if done.exit_code != 0:
            raise FileNotFoundError(f"{path}: no such file in the container")
        return done.output

    def write_file(self, path: str, data: bytes) -> None:
        done = self.exec(["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", path], stdin=data, timeout_s=60)
        if done.exit_code != 0:
            raise OSError(f"{path}: could not write ({done.output[-300:].decode(errors='replace').strip()})")

    def put_tree(self, path: str, files: dict[str, bytes], mode: int = 0o755) -> None:
        """Write ``files`` (relative path -> bytes) under ``path`` in the container."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, data in sorted(files.items()):
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(data), mode, int(time.time())
                tar.addfile(info, io.BytesIO(data))
        done = self.exec(["sh", "-c", 'mkdir -p "$1" && tar -x -o -C "$1"', "sh", path], stdin=buf.getvalue(), timeout_s=120)
        if done.exit_code != 0:
            raise SandboxError(f"could not copy files to {path}: {done.output[-300:].decode(errors='replace')}")

    # ---- state

    def disk_used_mb(self) -> float:
        """Size of the writable layer, in MB (the engine walks only what changed)."""
        api = self.client.api
        info = api._result(api._get(api._url("/containers/{0}/json", self.container.id), params={"size": 1}), True)
        return float(info.get("SizeRw") or 0) / (1 << 20)

    def destroy(self) -> None:
        self.destroyed = True
        with contextlib.suppress(Exception):
            self.container.remove(force=True, v=True)
