"""BashSession: a persistent bash in an episode's container, one command per call (blocking).

What it is: one long-lived ``bash --noprofile --norc`` started with ``docker exec`` (stdin
attached, no TTY), so a command's ``cd`` and ``export`` are there for the next one. Each command
is sent base64-encoded and run by ``eval`` in that shell, its stdin from ``/dev/null`` (it
cannot read the next command) and stderr merged into stdout, followed by a line with a
per-session random marker and the exit status; the reader drains the stream until that line.

  * Timeout: at ``timeout_s`` every process of the container but its init, keeper and this
    shell is killed (the command's children, and anything it left in the background); if the
    shell answers within a grace second it is still the same shell (cwd and env kept). If it
    does not (the command was a loop of shell builtins), the shell is killed and a new one
    started in the same container: ``restarted`` says its working directory and environment
    were reset. A command that ends the shell (``exit``) gets a new one the same way.
  * Output: at most ``max_output`` bytes; a longer output keeps its head and tail, the middle
    replaced by ``[... N bytes cut ...]`` (the whole output is never held in memory).

What it is not: isolation (the container is: ``sandboxes/repo_container.py``), or a terminal
(no TTY: full-screen programs do not work; ``PAGER`` and ``GIT_PAGER`` are ``cat``).
"""

from __future__ import annotations

import base64
import os
import re
import time
from dataclasses import dataclass

from agentrl.errors import SandboxError
from sandboxes.repo_container import ExecStream, RepoContainer, cut_middle

GRACE_S = 3.0
"""Seconds the shell has to answer after the kill (bash backs off for seconds when a fork failed)."""
SHELL_ENV = {"PAGER": "cat", "GIT_PAGER": "cat", "TERM": "dumb", "LC_ALL": "C.UTF-8", "PIP_PROGRESS_BAR": "off"}


@dataclass
class CommandResult:
    """One command's output (stdout and stderr merged, cut in the middle when too long)."""

    output: str
    exit_code: int | None  # None when it timed out or the shell went away
    timed_out: bool = False
    restarted: bool = False  # the shell was replaced: cwd and environment are the image's again

    def text(self) -> str:
        """The observation a model reads: the output, and what happened when it was not a plain end."""
        notes = []
        if self.timed_out:
            notes.append("the command timed out and was killed")
        if self.restarted:
            notes.append("the shell was restarted: working directory and environment variables were reset")
        if self.exit_code not in (0, None):
            notes.append(f"exit code {self.exit_code}")
        return self.output + "".join(f"\n[{n}]" for n in notes)


class BashSession:
    """The persistent shell of one container; see the module docstring."""

    def __init__(self, box: RepoContainer, *, max_output: int = 10_000) -> None:
        self.box, self.max_output = box, max_output
        self.marker = f"__AGENTRL_{os.urandom(8).hex()}__"
        self._done = re.compile(rb"\n?" + self.marker.encode() + rb" (-?\d+)\n")
        self.stream: ExecStream | None = None
        self.pid = 0
        self.commands = 0
        self._start()

    def _start(self) -> None:
        self.stream = self.box.open_exec(["bash", "--noprofile", "--norc"], env=SHELL_ENV)
        self.stream.send(f"printf '%s %s\\n' {self.marker} $$\n".encode())
        result = self._read(time.monotonic() + 30)
        if result is None or result[1] is None:
            raise SandboxError("the container's bash did not start (does the image have bash?)")
        self.pid = result[1]

    def run(self, command: str, timeout_s: float) -> CommandResult:
        """Run ``command`` in the shell (see the module docstring)."""
        if self.stream is None:
            self._start()
        assert self.stream is not None
        self.commands += 1
        encoded = base64.b64encode(command.encode()).decode()
        self.stream.send(f'eval "$(printf %s {encoded} | base64 -d)" </dev/null 2>&1; '
                         f"printf '\\n%s %s\\n' {self.marker} $?\n".encode())
        result = self._read(time.monotonic() + timeout_s)
        if result is not None and result[1] is not None:
            return CommandResult(result[0], result[1])
        if result is None:  # the shell ended (exit): a new one
            self._restart(kill=False)
            return CommandResult("", None, restarted=True)
        self.box.kill_processes(keep=(self.pid,))
        late = self._read(time.monotonic() + GRACE_S, self._partial)
        if late is not None and late[1] is not None:
            return CommandResult(late[0], None, timed_out=True)
        self._restart(kill=True)
        return CommandResult(self._partial_text(), None, timed_out=True, restarted=True)

    def _restart(self, kill: bool) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None
        if kill:
            self.box.kill_processes()
        self._start()

    def _read(self, deadline: float, carry: tuple[bytearray, int] | None = None) -> tuple[str, int | None] | None:
        """Drain until the marker line: (output, status); status None at the deadline; None at EOF."""
        assert self.stream is not None
        buf, dropped = carry if carry is not None else (bytearray(), 0)
        half, room = self.max_output // 2, len(self.marker) + 32
        while True:
            payload = self.stream.frame(deadline)
            if payload is None:
                return None
            if payload == b"" and time.monotonic() >= deadline:
                self._partial = (buf, dropped)
                return self._partial_text(), None
            buf += payload
            match = self._done.search(buf, max(0, len(buf) - len(payload) - room))
            if match:
                out = bytes(buf[: match.start()])
                if dropped:
                    out = out[:half] + f"\n[... {dropped} bytes cut ...]\n".encode() + out[half:]
                return cut_middle(out, self.max_output).decode(errors="replace"), int(match.group(1))
            if len(buf) > 2 * self.max_output + room:  # keep the head and a rolling tail
                keep_tail = half + room
                dropped += len(buf) - half - keep_tail
                buf = buf[:half] + buf[-keep_tail:]

    _partial: tuple[bytearray, int] = (bytearray(), 0)

    def _partial_text(self) -> str:
        buf, dropped = self._partial
        out = bytes(buf)
        if dropped:
            half = self.max_output // 2
            out = out[:half] + f"\n[... {dropped} bytes cut ...]\n".encode() + out[half:]
        return cut_middle(out, self.max_output).decode(errors="replace")

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None
