"""The lock of a run directory: one ``agentrl train`` or ``agentrl eval`` writes it at a time.

What it is: ``RunLock(directory, command)``, a ``with`` block that holds
``DIRECTORY/run.lock`` — an exclusive ``fcntl.flock`` on that file, which names its holder
(``{"pid", "host", "command", "since"}``). A second run into the same directory is refused
with one line that names the holder (``LockHeld``, a ``ConfigError`` on ``run_dir``): two runs
into one directory interleave their metrics, summaries and checkpoints. On exit the file is
emptied (never unlinked: a second process may already have it open, and a lock on an
unlinked file guards nothing) and unlocked. ``make_dir`` makes the directory first, and turns
a path that is a file, or one without the permission to write, into one line naming the key.

Stale locks: the kernel drops a flock when its holder dies, even by SIGKILL or an OOM kill, so
a lock is never held by the dead. A file that still names a holder when the lock is free is
what such a death leaves behind; it is taken over, and ``taken_over`` says whose it was (the
caller prints it). The file is opened close-on-exec, so the servers and ranks a run starts do
not hold its lock.

What it is not: a lock across nodes. ``flock`` on a network filesystem holds only where the
filesystem supports it (NFSv4 does; where it does not, the lock is refused with that error);
on several nodes only node 0 takes it (``agentrl.cli.train_command``).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError

LOCK_FILE = "run.lock"


class LockHeld(ConfigError):
    """Another live process holds the run directory's lock."""


class RunLock:
    """``DIRECTORY/run.lock`` held for the ``with`` block; see the module docstring.

    Args:
        directory: the run directory (it must exist).
        command: what holds it, for the holder line (``"agentrl train"``).
        what: what names the directory in errors (``"config key 'run_dir'"``, ``"--out"``).
    """

    def __init__(self, directory: str | Path, command: str, what: str = "config key 'run_dir'") -> None:
        self.path = Path(directory) / LOCK_FILE
        self.command, self.what = command, what
        self.taken_over: dict[str, Any] | None = None
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        make_dir(self.path.parent, self.what)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise ConfigError(f"{self.what}: cannot write {str(self.path)!r}: {e.strerror or e}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = read_holder(fd)
            os.close(fd)
            raise LockHeld(f"{self.what}: {str(self.path.parent)!r} is in use by {describe(holder)} "
                           f"(lock {self.path}); wait for it to end, stop it, or pick another") from None
        except OSError as e:
            os.close(fd)
            raise ConfigError(f"{self.what}: cannot lock {self.path}: {e.strerror or e} "
                              "(a filesystem without flock?); pick a run_dir on a local or NFSv4 disk") from e
        self.taken_over = read_holder(fd) or None  # a holder that died without letting go
        me = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command,
              "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # empty: released cleanly (a file naming a holder means it died)
        finally:
            os.close(fd)  # closing drops the flock

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def make_dir(path: str | Path, what: str = "config key 'run_dir'") -> Path:
    """``path`` made (with its parents) and writable, or a ``ConfigError`` that starts with ``what``."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{what}: {str(path)!r} is a file, not a directory; pick another path")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{what}: cannot make the directory {str(path)!r}: {e.strerror or e}") from e
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{what}: the directory {str(path)!r} is not writable by this user")
    return path


def read_holder(fd: int) -> dict[str, Any]:
    """The holder a lock file names ({} when it is empty or unreadable)."""
    try:
        text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        holder = json.loads(text) if text else {}
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def describe(holder: dict[str, Any]) -> str:
    """``"agentrl train (pid 123 on host h, since ...)"``, or what is known of it."""
    if not holder:
        return "another process (its lock file names none)"
    pid, host = holder.get("pid", "?"), holder.get("host", "?")
    gone = ", not running: a process it started holds the lock" if host == socket.gethostname() and isinstance(
        pid, int) and not alive(pid) else ""
    return f"{holder.get('command', 'a process')} (pid {pid} on host {host}, since {holder.get('since', '?')}{gone})"


def alive(pid: int) -> bool:
    """Whether a process of this host has that pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
