"""Our long-running services as processes: how one says it is ready, and how a parent waits for it.

What it is: both sides of one small convention. A service (``agentrl serve``, ``agentrl
sandbox serve``, and any later one) binds its socket first — so ``--port 0`` picks a free
port it can report — runs its app, and prints one line ``<name>: ready on http://HOST:PORT``
once it listens (``bind`` + ``run_app``); ``background_server`` serves an app from inside
another program's event loop instead (the gateway of ``ExternalAgentWorkflow``). A parent starts it with ``ServiceProcess(cmd,
ready=<name>)``, which returns once that line is printed, with the URL in ``url`` and every
line the child printed in ``lines`` (for error messages); ``stop()`` or the end of a ``with``
block ends it. ``ServerProcess(model_dir)`` is the one for ``agentrl serve``, used by the
demo, the benchmarks and the tests. ``free_port()`` is for the few programs (torchrun's
rendezvous) that must be told a port instead of reporting one; ``stop_process(proc)`` ends
any child (SIGTERM, then SIGKILL); ``die_with_parent()`` makes a child die with its parent
even when the parent is SIGKILLed (Linux's parent-death signal). Every service runs on uvloop's event loop
(``run_async``, also used by the trainer's rank-0 loop) with uvicorn parsing HTTP in C
(httptools); ``benchmarks/gateway.py`` measures what that is worth. ``exit_on_signals`` makes SIGTERM and SIGHUP
run a program's ``finally`` blocks, so the children it started are stopped. ``keyed_module``
starts a program that takes its key only as ``--api-key`` (SGLang, its router) with the key from
the environment, out of the process listing.

What it is not: the apps themselves, nor a launcher for SGLang (``python -m
sglang.launch_server`` on GPU machines; pass their URLs to ``RemoteEngine``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from agentrl.errors import ServerUnavailable

# --------------------------------------------------------------------------- the service side

HTTP_PARSER = "httptools"
"""uvicorn's HTTP/1.1 implementation for every service of ours: httptools (C, a base
dependency), never the pure-Python h11 uvicorn falls back to when httptools is missing."""


def new_event_loop() -> asyncio.AbstractEventLoop:
    """The event loop our services run on: uvloop's (libuv; a base dependency on Linux and
    macOS), asyncio's own where uvloop does not exist (Windows). On 2 cores every CPU
    millisecond a service spends on its sockets is taken from the model; see
    ``benchmarks/gateway.py`` for what the two choices above are worth."""
    try:
        import uvloop
    except ImportError:
        if sys.platform != "win32":
            raise
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_async(main: Awaitable[Any]) -> Any:
    """``asyncio.run(main)`` on ``new_event_loop()``'s loop."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on (host, port); port 0 picks a free one. Made with
    ``IPPROTO_TCP`` spelled out: asyncio sets ``TCP_NODELAY`` only on sockets whose ``proto``
    says TCP, and accepted sockets inherit it — with 0, a response written as head + body waited
    for the client's delayed ACK (~40 ms per keep-alive request)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for programs that must be told one, like torchrun).

    Chosen below the kernel's ephemeral range (``net.ipv4.ip_local_port_range``) where there is
    room: ports there are never handed out by ``bind(0)`` or an outgoing connection, so between
    this call and the program's own bind only another explicit binder can take it — a port from
    ``bind(0)`` was taken, now and then, by a server started in between with ``--port 0``."""
    low = _ephemeral_low()
    if low > 10_000:
        for port in random.sample(range(10_000, low), 64):
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def run_app(app: Any, sock: socket.socket, *, ready_line: str, log_level: str = "warning",
            before_ready: Callable[[], Awaitable[None]] | None = None, **uvicorn_options: Any) -> None:
    """Serve ``app`` on ``sock`` until stopped; print ``ready_line + URL`` once it listens.

    ``before_ready`` runs first (warming a pool, starting a fork server), so "ready" means
    the first request is served without a cold start.
    """
    import uvicorn

    host, port = sock.getsockname()[:2]
    url_host = f"[{host}]" if ":" in host else host
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5,
                                           **{"http": HTTP_PARSER, **uvicorn_options}))

    async def main() -> None:
        if before_ready is not None:
            await before_ready()
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():  # noqa: ASYNC110 (uvicorn offers no event)
            await asyncio.sleep(0.05)
        if server.started:
            print(f"{ready_line}http://{url_host}:{port}", flush=True)
        await task

    run_async(main())


@contextlib.asynccontextmanager
async def background_server(app: Any, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning",
                            **uvicorn_options: Any) -> AsyncIterator[str]:
    """Serve ``app`` from the running event loop (no process, no signal handlers taken) while
    the block runs; yields its URL. For a service that lives inside another program's loop."""
    import uvicorn

    class Quiet(uvicorn.Server):  # the host program keeps its own signal handling
        def capture_signals(self):  # uvicorn >= 0.29
            return contextlib.nullcontext()

        def install_signal_handlers(self) -> None:  # older uvicorn
            return None

    sock = bind(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    server = Quiet(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5,
                                  **{"http": HTTP_PARSER, **uvicorn_options}))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()  # raises what stopped it
                raise ServerUnavailable(f"the server on {host}:{bound_port} stopped before it started")
            await asyncio.sleep(0.02)
        yield f"http://{f'[{bound_host}]' if ':' in bound_host else bound_host}:{bound_port}"
    finally:
        server.should_exit = True
        try:
            async with asyncio.timeout(15):
                await task
        finally:
            sock.close()


# --------------------------------------------------------------------------- the parent side


def pump_output(proc: subprocess.Popen, log_path: str | Path | None, on_line: Callable[[str], None],
                name: str, at_end: Callable[[], None] | None = None) -> threading.Thread:
    """Start a daemon thread that appends each line of ``proc``'s text output to ``log_path``
    (line-buffered, if given) and hands it to ``on_line``; at the end of the output it closes
    the pipe and the log (neither is left to the garbage collector) and calls ``at_end``."""
    assert proc.stdout is not None
    stdout = proc.stdout
    log = open(log_path, "a", buffering=1) if log_path is not None else None  # noqa: SIM115 (closed at the end)

    def pump() -> None:
        try:
            with stdout, log or contextlib.nullcontext():
                for line in stdout:
                    if log is not None:
                        log.write(line)
                    on_line(line)
        finally:  # whoever waits on the end hears of it, even if a line could not be taken
            if at_end is not None:
                at_end()

    thread = threading.Thread(target=pump, name=name, daemon=True)
    thread.start()
    return thread


def die_with_parent(sig: signal.Signals = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive ``sig`` when its parent dies — even by
    SIGKILL or an OOM kill, which run no ``finally`` and no signal handler, and would leave
    ``agentrl serve`` or torchrun's ranks running, re-parented to pid 1.

    How: Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``), set in the child between
    fork and exec (libc is loaded here, before the fork, so the child imports nothing). A
    parent that died before the call is checked for (``getppid`` changed) and the signal sent
    at once. The kernel sends it on the exit of the parent's *thread* that forked the child, not
    of its process: so only a child started from the main thread gets it (None otherwise: the
    child of a worker thread would die with that thread). SIGTERM, so a service shuts down
    cleanly and torchrun stops its ranks. None off Linux (no such signal; the ``finally`` blocks
    and ``exit_on_signals`` still stop children on everything but SIGKILL)."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent, signum = os.getpid(), int(sig)

    def set_parent_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above
            os.kill(os.getpid(), signum)

    return set_parent_death_signal


PR_SET_PDEATHSIG = 1
"""``<linux/prctl.h>``: the signal a process receives when the thread that forked it exits."""


class ServiceProcess:
    """A child process of ours, ready (its ``url`` known) when the constructor returns.

    ``ready`` is the prefix of the line the child prints once it serves (``"agentrl serve:
    ready on "``); the rest of that line is the URL. A child that exits first, or stays
    silent past ``startup_timeout``, raises ``ServerUnavailable`` with its last output.
    """

    def __init__(self, cmd: Sequence[str], *, ready: str, startup_timeout: float = 180.0,
                 env: dict[str, str] | None = None, cwd: str | Path | None = None,
                 log_path: str | Path | None = None) -> None:
        self.cmd = list(cmd)
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=env, cwd=cwd, preexec_fn=die_with_parent())
        self.lines: list[str] = []
        self.url = ""
        ready_event = threading.Event()

        def read(line: str) -> None:
            self.lines.append(line)
            if len(self.lines) > 2000:
                del self.lines[:1000]
            if line.startswith(ready) and not self.url:
                self.url = line[len(ready):].strip()
                ready_event.set()

        # at the end of the output (the process ended) the constructor wakes either way
        pump_output(self.proc, log_path, read, f"{Path(self.cmd[0]).name}-output", at_end=ready_event.set)
        if not ready_event.wait(startup_timeout) or not self.url:
            code = self._exit_code()
            self.stop()
            if code is not None:  # it ended (a bad model directory, a taken port): say that, not "timed out"
                raise ServerUnavailable(f"{' '.join(self.cmd[:6])} exited with code {code} before it was ready; "
                                        f"its last output:\n{self.tail()}")
            raise ServerUnavailable(
                f"{' '.join(self.cmd[:6])} did not become ready within {startup_timeout:.0f} s; "
                f"its last output:\n{self.tail()}"
            )

    def _exit_code(self) -> int | None:
        """The child's exit code if it ended (its output closing first: a moment to be reaped)."""
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def tail(self, n: int = 40) -> str:
        return "".join(self.lines[-n:]) or "(no output)"

    def __enter__(self) -> ServiceProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill(self) -> None:
        """SIGKILL: the service dies without answering anything (for failure tests)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s."""
        stop_process(self.proc)


def stop_process(proc: subprocess.Popen | None, grace_s: float = 15.0) -> None:
    """End a child: SIGTERM, then SIGKILL if it is still there after ``grace_s`` seconds."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)


@contextlib.contextmanager
def exit_on_signals(name: str, signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Within the block, SIGTERM or SIGHUP raises ``SystemExit(128 + signum)`` in the main thread,
    so the ``finally`` blocks that stop this program's children run — by default Python dies at
    once on them and the inference servers it started go on holding their cores or GPUs (after a
    ``kill``, Slurm's ``scancel``, a closed terminal). A second signal while stopping is ignored;
    the previous handlers come back at the end. ``name`` is the program, for the line it prints."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread
        return

    def on_signal(signum: int, _frame: Any) -> None:
        for s in signals:
            signal.signal(s, signal.SIG_IGN)
        print(f"{name}: {signal.Signals(signum).name} received; stopping its processes", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, on_signal) for s in signals}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


SERVE_READY = "agentrl serve: ready on "


class ServerProcess(ServiceProcess):
    """One ``agentrl serve`` subprocess on a free port of 127.0.0.1 (``threads`` torch threads)."""

    def __init__(self, model_dir: str | Path, *args: str, threads: int = 1, startup_timeout: float = 180.0,
                 extra_env: dict[str, str] | None = None, log_path: str | Path | None = None) -> None:
        cmd = [str(Path(sys.executable).parent / "agentrl"), "serve", "--model", str(model_dir),
               "--port", "0", "--threads", str(threads), *args]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false",
               **(extra_env or {})}
        super().__init__(cmd, ready=SERVE_READY, startup_timeout=startup_timeout, env=env, log_path=log_path)


def keyed_module(module: str, key_env: str) -> str:
    """``python -c`` code that runs ``module`` as ``python -m`` would, with ``--api-key`` and the
    key in ``$key_env`` added to its arguments inside the process: SGLang and its router take their key only
    as ``--api-key``, and ``/proc/PID/cmdline`` shows the original arguments, not these."""
    return (f"import os, runpy, sys; sys.argv[0] = {module!r}; "
            f"sys.argv += ['--api-key', os.environ[{key_env!r}]]; "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
