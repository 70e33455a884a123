"""The supervisor: our own small program that runs untrusted code and reports what happened.

What it is: a standard-library-only script that serves a line protocol (one JSON object per
line in, one per line out) and, for each request, starts the program as an unprivileged uid
under rlimits, no-new-privileges and a seccomp filter, drains its output with caps while it
runs, enforces the wall-clock deadline, reports the real exit status or signal, and kills
every process the program left. It is pid 1 wherever it runs, so it reaps orphans and sees
the true status.

It runs in two places:
  * inside a LocalSandbox jail (``sandboxes/jail.py`` clones it as pid 1 of fresh
    namespaces); a Python program runs in a fork of this (fresh, one-request) interpreter;
    the jail is used once, so nothing is wiped;
  * inside a DockerSandbox container (``python3 -c <this file> container``), as the
    container's main process, reached through the container's stdin/stdout; a Python
    program runs in a fork of the ``Template`` interpreter made before any request, and the
    work dirs are wiped after each request.
Either way ``run_inline`` resets the fork to a fresh ``python -I -S`` state first; bash
programs (and sessions' interpreters) are exec'd.

What it lends the program, and what it does not:
  * file I/O on the program's behalf (writing ``files``, reading ``fetch``, wiping) runs
    with the program's filesystem uid and gid (``setfsuid``), so it can touch nothing the
    program could not; and it never crosses a link: every name is walked one component at
    a time from a descriptor of ``/work`` with ``O_NOFOLLOW`` (``O_DIRECTORY`` for the
    directories), and ``fetch`` returns only regular files of the work dir's own
    filesystem (no FIFO, device, socket, or file reached through a mount or link);
  * after setup the supervisor keeps only the capabilities it needs, effective and bounding
    (``Kernel``: SETUID, SETGID and KILL as root; none in a rootless jail, where it shares
    the program's uid), is not dumpable (its ``/proc`` entries and memory are closed to the
    program), and ignores SIGINT (pid 1 of a namespace receives only the signals it handles);
  * between the calls of a session every process but pid 1 is stopped (SIGSTOP) and
    continued at the next call, so background work burns no CPU while no call runs (a
    thread inside a system call stops when it returns from it; the uploads of the next call
    do not rely on the stop: the link-free walk above is what makes them safe).

What it is not: the isolation boundary by itself. The namespaces (LocalSandbox) or the
container (DockerSandbox) around it are the boundary.

It is one self-contained file (longer than our usual module) because it travels as one
script: DockerSandbox passes its source to ``python3 -c`` in each container.

Protocol ops: ``run`` (one program, fresh work dir), ``session_start`` / ``session_call`` /
``session_end`` (a persistent Python interpreter whose globals survive between calls; a call
that times out or kills the interpreter restarts it with empty state), ``ping``.
Main hook: ``Supervisor.handle(message) -> reply``.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import resource
import selectors
import signal
import stat
import sys
import time
import types

SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/work",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONIOENCODING": "utf-8",
}
"""The whole environment a program sees: nothing of the host's is passed on."""

WORK = "/work"
MAX_FETCH_BYTES = 8 << 20
GRACE_S = 0.2  # how long output pipes may stay open after the program exited

# The interpreter a session keeps: reads one JSON request per line on fd 0, runs the code in
# one persistent globals dict (the value of a trailing expression is printed, like a REPL),
# answers on fd 3. User output goes to fd 1/2, which the supervisor drains with caps.
SESSION_DRIVER = r"""
import ast, json, os, resource, sys, traceback
reply = os.fdopen(3, "w")
requests = os.fdopen(0, "r")
sys.stdin = open(os.devnull)
scope = {"__name__": "__main__", "__builtins__": __builtins__}
for line in requests:
    msg = json.loads(line)
    before = resource.getrusage(resource.RUSAGE_SELF)
    code = 0
    try:
        tree = ast.parse(msg["code"], "<cell>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<cell>", "exec"), scope)
        if last is not None:
            value = eval(compile(last, "<cell>", "eval"), scope)
            if value is not None:
                print(repr(value))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    after = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    total = after.ru_utime + after.ru_stime + kids.ru_utime + kids.ru_stime
    reply.write(json.dumps({"exit_code": code, "cpu_s": cpu, "total_cpu_s": total,
                            "maxrss_kb": after.ru_maxrss}) + "\n")
    reply.flush()
"""


# --------------------------------------------------------------------------- launching


class Kernel:
    """The kernel calls the standard library lacks, through ctypes (part of the standard
    library; the sandbox image has it): no-new-privileges, dumpability, capabilities,
    filesystem ids, and installing the seccomp filter (BPF bytes compiled on the host by
    ``sandboxes/seccomp.py``; the supervisor never needs libseccomp itself)."""

    PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_CAPBSET_DROP = 4, 22, 24
    PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
    SECCOMP_MODE_FILTER = 2
    CAP_KILL, CAP_SETGID, CAP_SETUID, CAP_SETPCAP = 5, 6, 7, 8
    CAPABILITY_VERSION_3 = 0x20080522

    def __init__(self, seccomp_bpf: bytes = b"") -> None:
        import ctypes

        self.c = ctypes
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.filter = None
        if seccomp_bpf:
            if len(seccomp_bpf) % 8:
                raise ValueError(f"a seccomp filter is 8 bytes per instruction, got {len(seccomp_bpf)} bytes")

            class Fprog(ctypes.Structure):  # struct sock_fprog
                _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

            self._bpf = ctypes.create_string_buffer(seccomp_bpf, len(seccomp_bpf))
            self.filter = Fprog(len(seccomp_bpf) // 8, ctypes.cast(self._bpf, ctypes.c_void_p))

    def _prctl(self, option: int, arg2, what: str) -> None:
        c = self.c
        arg = arg2 if not isinstance(arg2, int) else c.c_ulong(arg2)
        if self.libc.prctl(c.c_int(option), arg, c.c_ulong(0), c.c_ulong(0), c.c_ulong(0)) != 0:
            err = c.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def set_dumpable(self, dumpable: bool) -> None:
        self._prctl(self.PR_SET_DUMPABLE, int(dumpable), "PR_SET_DUMPABLE")

    def restrict_program(self) -> None:
        """In a program's process, after the uid switch, before exec: no new privileges,
        dumpable like any exec'd program (a fork of the supervisor inherits "not dumpable"),
        then the seccomp filter, which every process and thread it makes inherits."""
        self._prctl(self.PR_SET_NO_NEW_PRIVS, 1, "PR_SET_NO_NEW_PRIVS")
        self.set_dumpable(True)
        if self.filter is not None:
            c = self.c
            if self.libc.prctl(c.c_int(self.PR_SET_SECCOMP), c.c_ulong(self.SECCOMP_MODE_FILTER),
                               c.byref(self.filter), c.c_ulong(0), c.c_ulong(0)) != 0:
                err = c.get_errno()
                raise OSError(err, f"installing the seccomp filter: {os.strerror(err)}")

    def drop_bounding_set(self, keep=()) -> None:
        """Drop every capability but ``keep`` from the bounding set: no exec can gain it back
        (needs CAP_SETPCAP; a process that lacks it has a bounding set fixed by its starter)."""
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
        for cap in range(last + 1):
            if cap not in keep:
                self._prctl(self.PR_CAPBSET_DROP, cap, f"dropping capability {cap} from the bounding set")

    def drop_capabilities(self, keep=()) -> None:
        """Keep only the capabilities ``keep`` (numbers), effective and permitted, none
        inheritable or ambient."""
        try:
            self._prctl(self.PR_CAP_AMBIENT, self.PR_CAP_AMBIENT_CLEAR_ALL, "clearing ambient capabilities")
        except OSError:  # a kernel without ambient capabilities (before 4.3) has none to clear
            pass
        mask = 0
        for cap in keep:
            mask |= 1 << cap
        c = self.c
        header = (c.c_uint32 * 2)(self.CAPABILITY_VERSION_3, 0)
        data = (c.c_uint32 * 6)(mask & 0xFFFFFFFF, mask & 0xFFFFFFFF, 0, mask >> 32, mask >> 32, 0)
        if self.libc.capset(header, data) != 0:
            err = c.get_errno()
            raise OSError(err, f"capset: {os.strerror(err)}")

    def filesystem_ids(self, uid: int) -> None:
        """From now on this thread's file access is checked as ``uid`` (gid ``uid``), with
        no capability that bypasses file permissions; ``filesystem_ids(0)`` switches back."""
        self.libc.setfsgid(uid)
        self.libc.setfsuid(uid)
        if self.libc.setfsuid(-1) != uid:  # an invalid id changes nothing and returns the current one
            raise OSError(f"setfsuid({uid}) did not take effect")


def set_limits(limits: dict) -> None:
    """rlimits of the program (called in the child, before dropping root)."""
    mb = 1 << 20
    cpu = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    mem = int(limits["memory_mb"]) * mb
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    fsize = int(limits["file_mb"]) * mb
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_NPROC, (int(limits["nproc"]), int(limits["nproc"])))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_inline(path: str) -> None:
    """Run the Python program at ``path`` in this (forked, already unprivileged) process as
    a fresh ``python -I -S path`` would, then exit. Saves an interpreter start (~10 ms).

    Reset: environment, argv, sys.path (no sandboxes dir), our modules dropped from
    sys.modules, a new ``__main__``, new std streams on fds 0/1/2, Python's signal
    dispositions, atexit. Exit like the interpreter: SystemExit codes, uncaught exceptions
    through ``sys.excepthook`` with status 1, non-daemon threads joined, atexit run."""
    import atexit
    import builtins
    import io
    import types

    os.environ.clear()
    os.environ.update(SANDBOX_ENV)
    sys.argv = [path]
    here = os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else None  # none under -c
    sys.path[:] = [p for p in sys.path if p and p != here]
    for name in ("supervisor", "jail", "sandboxes.supervisor", "sandboxes.jail"):
        sys.modules.pop(name, None)
    atexit._clear()
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True)
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    status = 0
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        exec(compile(source, path, "exec"), main.__dict__)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            status = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            status = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    try:
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        status = status or 120
    os._exit(status & 0xFF)


def launch(argv: list[str], uid: int, limits: dict, fds: dict[int, int], kernel: Kernel, join_fds=(),
           inline: str = "") -> int:
    """Fork the program: own session, ``fds`` mapped onto 0/1/2(/3), joined to the given
    cgroup.procs files, rlimits set, groups dropped and uid switched (unless it is ours
    already: a rootless jail), no new privileges, the seccomp filter; then exec ``argv``,
    or, with ``inline`` (a Python file), run it in the forked interpreter."""
    pid = os.fork()
    if pid:
        return pid
    try:
        os.setsid()
        for target, fd in fds.items():
            os.dup2(fd, target, inheritable=True)
        for fd in join_fds:
            os.write(fd, b"0")
        os.closerange(max(fds) + 1, 1 << 16)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        set_limits(limits)
        if os.getresuid() != (uid, uid, uid):
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        kernel.restrict_program()
        os.chdir(WORK)
        os.umask(0o022)
        if inline:
            run_inline(inline)
        os.execve(argv[0], argv, SANDBOX_ENV)
    except BaseException as e:  # report why the program could not start
        try:
            os.write(2, f"sandbox: cannot start {argv[0]}: {e}\n".encode())
        finally:
            os._exit(127)
    raise AssertionError("unreachable")


def uid_pids(uid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    out.append(int(name))
            except OSError:
                pass
    return out


_REAPED: dict[int, tuple] = {}  # (status, rusage) of children reaped while sweeping orphans


def reap() -> None:
    """Collect every finished child (as pid 1 we inherit the program's orphans)."""
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _REAPED[pid] = (status, usage)


def wait_for(pid: int) -> tuple:
    """(wait status, rusage) of ``pid``, also when a sweep has already reaped it."""
    if pid in _REAPED:
        return _REAPED.pop(pid)
    try:
        return os.wait4(pid, 0)[1:]
    except ChildProcessError:
        return _REAPED.pop(pid, (0, None))


def kill_uid(uid: int, rounds: int = 400) -> bool:
    """SIGKILL every process owned by ``uid`` (found in /proc), until none is left."""
    for _ in range(rounds):
        pids = uid_pids(uid)
        if not pids:
            return True
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reap()
        time.sleep(0.002)
    return not uid_pids(uid)


def kill_all(rounds: int = 400) -> bool:
    """As pid 1: SIGKILL every other process of this pid namespace, until none is left
    (``kill(-1)`` reaches all of them at once, forks in flight included)."""
    for _ in range(rounds):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            reap()
            return True
        reap()
        time.sleep(0.0005)
    return False


def signal_all(sig: int) -> None:
    """As pid 1: send ``sig`` to every other process of this pid namespace."""
    try:
        os.kill(-1, sig)
    except ProcessLookupError:
        pass


# --------------------------------------------------------------------------- supervising


class Capture:
    """Bytes read from one pipe, kept up to ``cap``; what is beyond is counted, not kept."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.over = False

    def feed(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        if len(chunk) > room:
            self.over = True
        self.data += chunk[: max(room, 0)]

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def _read_into(fd: int, cap: Capture) -> bool:
    """Read what is there; False at EOF."""
    try:
        chunk = os.read(fd, 1 << 16)
    except BlockingIOError:
        return True
    except OSError:
        return False
    if not chunk:
        return False
    cap.feed(chunk)
    return True


def _drain(fd: int, cap: Capture, limit: int = 64) -> None:
    """Read what is already in the pipe (at most ``limit`` chunks), without waiting."""
    for _ in range(limit):
        try:
            chunk = os.read(fd, 1 << 16)
        except OSError:
            return
        if not chunk:
            return
        cap.feed(chunk)


class Child:
    """A program this process forked: woken by its pidfd, collected with wait4."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self.fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.fd = None  # then supervise polls every 10 ms

    def poll(self):
        """(wait status, rusage) once it has exited, else None."""
        if self.pid in _REAPED:
            return _REAPED.pop(self.pid)
        got, status, usage = os.wait4(self.pid, os.WNOHANG)
        return (status, usage) if got else None

    def wait(self):
        return wait_for(self.pid)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Template:
    """A pristine interpreter, forked when the container starts and before any request, that
    forks each Python program on demand (``run_inline``). A program's process is then a copy
    of an interpreter that never held another request's code or output, and the ~10 ms of a
    fresh interpreter start are saved. It reports each program's wait status back."""

    def __init__(self, kernel: Kernel) -> None:
        import socket

        self._socket = socket
        self.kernel = kernel
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.pid = os.fork()
        if self.pid == 0:
            ours.close()
            self._serve(theirs)
        theirs.close()
        self.sock = ours

    def _serve(self, sock) -> None:
        try:
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            os.dup2(devnull, 1)  # never write on the supervisor's protocol stream
            while True:
                msg, fds, _, _ = self._socket.recv_fds(sock, 1 << 16, 8)
                if not msg:
                    os._exit(0)
                order = json.loads(msg)
                fd_map = dict(zip(order["targets"], fds, strict=True))
                pid = launch(order["argv"], order["uid"], order["limits"], fd_map, self.kernel, (), order["inline"])
                for fd in fds:
                    os.close(fd)
                sock.send(json.dumps({"pid": pid}).encode())
                _, status, usage = os.wait4(pid, 0)
                sock.send(json.dumps({"status": status, "utime": usage.ru_utime, "stime": usage.ru_stime,
                                      "maxrss": usage.ru_maxrss}).encode())
        finally:
            os._exit(1)

    def spawn(self, argv, uid, limits, fds: dict[int, int], inline: str) -> TemplateChild:
        order = {"argv": argv, "uid": uid, "limits": limits, "targets": list(fds), "inline": inline}
        self.sock.settimeout(10)
        self._socket.send_fds(self.sock, [json.dumps(order).encode()], list(fds.values()))
        reply = self.sock.recv(1 << 16)
        if not reply:
            raise OSError("the template interpreter is gone")
        return TemplateChild(self, json.loads(reply)["pid"])


class TemplateChild:
    """A program the template forked: woken and collected through the template's socket."""

    def __init__(self, template: Template, pid: int) -> None:
        self.template = template
        self.pid = pid
        self.fd = template.sock.fileno()

    def _parse(self, msg: bytes):
        if not msg:
            raise OSError("the template interpreter is gone")
        d = json.loads(msg)
        usage = types.SimpleNamespace(ru_utime=d["utime"], ru_stime=d["stime"], ru_maxrss=d["maxrss"])
        return d["status"], usage

    def poll(self):
        self.template.sock.setblocking(False)  # (a socket with a timeout would wait for it)
        try:
            return self._parse(self.template.sock.recv(1 << 16))
        except BlockingIOError:
            return None

    def wait(self):
        self.template.sock.settimeout(30)
        return self._parse(self.template.sock.recv(1 << 16))

    def close(self) -> None:
        """Nothing to release: the template owns the socket and reaps the program (``Child.close``
        closes a pidfd; this is its counterpart for template-forked programs)."""


def supervise(child, out_fd, err_fd, caps, deadline, reply_fd=None, stop_on_cap=True) -> dict:
    """Drain ``out_fd``/``err_fd`` into capped buffers until the program (``child``) exits
    (or, in a session, until it writes one reply line on ``reply_fd``) or the deadline passes."""
    out, err = Capture(caps), Capture(caps)
    reply = bytearray()
    sel = selectors.DefaultSelector()
    for fd in (out_fd, err_fd) + ((reply_fd,) if reply_fd is not None else ()):
        os.set_blocking(fd, False)
    sel.register(out_fd, selectors.EVENT_READ, out)
    sel.register(err_fd, selectors.EVENT_READ, err)
    if reply_fd is not None:
        sel.register(reply_fd, selectors.EVENT_READ, "reply")
    pidfd = child.fd
    if pidfd is not None:
        sel.register(pidfd, selectors.EVENT_READ, "exit")
    status = usage = None
    timed_out = over_cap = replied = False
    exit_grace = None
    open_pipes = 2
    while True:
        now = time.monotonic()
        if now >= deadline:
            timed_out = True
            break
        if exit_grace is not None and (open_pipes == 0 or now >= exit_grace):
            break
        if replied and reply_fd is not None:
            break
        wait = min(deadline, exit_grace or deadline) - now
        if pidfd is None:
            wait = min(wait, 0.01)
        for key, _ in sel.select(max(wait, 0)):
            if key.data == "exit":
                pass  # collected by child.poll() below
            elif key.data == "reply":
                try:
                    chunk = os.read(reply_fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(reply_fd)
                reply += chunk
                replied = reply.endswith(b"\n")
            elif not _read_into(key.fd, key.data):
                sel.unregister(key.fd)
                open_pipes -= 1
            if (out.over or err.over) and stop_on_cap:
                over_cap = True
        if over_cap:
            break
        if status is None:
            done = child.poll()
            if done is not None:
                status, usage = done
                sel.unregister(pidfd) if pidfd is not None else None
                exit_grace = time.monotonic() + GRACE_S
                if reply_fd is not None:  # the interpreter died mid-call: drain what is there
                    _drain(out_fd, out)
                    _drain(err_fd, err)
                    break
    if replied:  # what the cell wrote before its reply is already in the pipes
        _drain(out_fd, out)
        _drain(err_fd, err)
    sel.close()
    child.close()
    return {
        "status": status,
        "usage": usage,
        "stdout": out,
        "stderr": err,
        "timed_out": timed_out,
        "over_cap": over_cap or out.over or err.over,
        "reply": bytes(reply),
    }


def classify(*, exit_code, sig, timed_out, over_cap, oom, cpu_s, cpu_limit, stderr) -> str:
    """The ExecStatus value of one finished program."""
    if over_cap:
        return "output_limit"
    if timed_out or sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_s >= cpu_limit):
        return "timeout"
    tail = stderr.rstrip().rsplit("\n", 1)[-1]
    if oom or (exit_code not in (0, None) and tail.startswith("MemoryError")):
        return "memory"
    if exit_code == 0 and sig is None:
        return "ok"
    return "runtime_error"


# --------------------------------------------------------------------------- the supervisor


def _safe_name(name: str) -> str:
    norm = os.path.normpath(name)
    if os.path.isabs(norm) or norm == "." or norm.startswith(".."):
        raise ValueError(f"file name {name!r} must be a relative path inside the work dir")
    return norm


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_parent(name: str, make: bool) -> tuple[int, str]:
    """(descriptor of the directory that holds ``name`` in the work dir, last component).

    Walked one component at a time from a descriptor of /work, each opened with
    ``O_NOFOLLOW | O_DIRECTORY`` relative to the one before: a link (or a file) at any depth
    stops the walk with ValueError, whatever the program swaps in meanwhile. ``make``
    creates missing directories on the way."""
    parts = _safe_name(name).split(os.sep)
    fd = os.open(WORK, _DIR_FLAGS)
    try:
        for i, part in enumerate(parts[:-1]):
            if make:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    where = os.path.join(WORK, *parts[: i + 1])
                    raise ValueError(f"{name!r}: {where} is not a directory of the work dir (a link or a file)") from e
                raise
            os.close(fd)
            fd = sub
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1]


def wipe(dir_fd: int) -> None:
    """Remove everything in the directory open at ``dir_fd`` (best effort; the program's
    processes are dead by now, so nothing is swapped under the walk)."""
    for entry in list(os.scandir(dir_fd)):
        try:
            if entry.is_dir(follow_symlinks=False):
                os.chmod(entry.name, 0o700, dir_fd=dir_fd)  # the program may have closed it to itself
                sub = os.open(entry.name, _DIR_FLAGS, dir_fd=dir_fd)
                try:
                    wipe(sub)
                finally:
                    os.close(sub)
                os.rmdir(entry.name, dir_fd=dir_fd)
            else:
                os.unlink(entry.name, dir_fd=dir_fd)
        except OSError:
            pass


class ContainerMemory:
    """OOM kills of the container's own memory cgroup, read through its read-only
    /sys/fs/cgroup view (v1 ``memory.oom_control`` or v2 ``memory.events``), so a program
    the kernel OOM-kills is reported as MEMORY. Peak memory stays the program's max RSS."""

    PATHS = ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events")

    def __init__(self) -> None:
        self.path = next((p for p in self.PATHS if os.access(p, os.R_OK)), None)
        self.seen = 0

    def _kills(self) -> int:
        if self.path is None:
            return 0
        with open(self.path) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def join_fds(self) -> tuple:
        self.seen = self._kills()
        return ()

    def oom(self) -> bool:
        return self._kills() > self.seen

    def peak_mb(self) -> float:
        return 0.0


class Supervisor:
    """Serves the protocol for one sandbox slot (one uid, one work dir, one session at most).

    ``python`` is the interpreter programs run under; ``kernel`` installs their seccomp
    filter; ``cgroups`` (optional) is an object with ``join_fds()``, ``oom()`` and
    ``peak_mb()`` (LocalSandbox's jail provides it); ``reusable``: the work dirs are wiped
    after each request (a container serves many; a jail serves one and is discarded).
    """

    def __init__(self, uid: int, python: str, kernel: Kernel, cgroups=None, inline_python: bool = False,
                 template: Template | None = None, reusable: bool = False) -> None:
        if os.getpid() != 1:  # it kills every other process it sees: only ever inside a jail/container
            raise RuntimeError("the supervisor runs only as pid 1 of a jail or container")
        self.uid = uid
        self.python = python
        self.kernel = kernel
        self.cgroups = cgroups
        self.inline_python = inline_python  # run Python programs in a fork of this interpreter
        self.template = template  # or in a fork of that pristine one (containers)
        self.reusable = reusable
        self.session = None  # (pid, stdin_w, out_r, err_r, reply_r)
        self.session_limits: dict = {}

    def handle(self, msg: dict) -> dict:
        op = msg.get("op")
        try:
            if op == "run":
                return self.run(msg["request"])
            if op == "session_start":
                self.session_end()
                self.session_limits = msg["limits"]
                self._start_driver()
                signal_all(signal.SIGSTOP)
                return {"ok": True}
            if op == "session_call":
                return self.session_call(msg["request"])
            if op == "session_end":
                self.session_end()
                return {"ok": True}
            if op == "ping":
                return {"ok": True, "pid": os.getpid(), "uid": self.uid}
            return {"status": "sandbox_error", "error": f"unknown op {op!r}"}
        except Exception as e:  # the backend failed: say so, keep serving
            return {"status": "sandbox_error", "error": f"{type(e).__name__}: {e}"}

    # ---- the work dir, with the program's own rights

    @contextlib.contextmanager
    def _as_program(self):
        """File access as the program's: its fsuid and fsgid (a no-op in a rootless jail,
        where the supervisor has the program's uid already)."""
        switch = os.geteuid() != self.uid
        if switch:
            self.kernel.filesystem_ids(self.uid)
        try:
            yield
        finally:
            if switch:
                self.kernel.filesystem_ids(os.geteuid())

    def _write_files(self, req: dict) -> None:
        items = [(n, c.encode()) for n, c in req.get("files", {}).items()]
        items += [(n, base64.b64decode(c)) for n, c in req.get("files_b64", {}).items()]
        if not items:
            return
        with self._as_program():
            for name, data in items:
                dir_fd, last = open_parent(name, make=True)
                try:
                    fd = os.open(last, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
                                 | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                        raise ValueError(f"{name!r} is in the work dir already and is not a regular file") from e
                    raise
                finally:
                    os.close(dir_fd)
                with os.fdopen(fd, "wb") as f:
                    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO someone reads
                        raise ValueError(f"{name!r} is in the work dir already and is not a regular file")
                    f.write(data)

    def _fetch(self, names: list[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        if not names:
            return out
        with self._as_program():
            work_dev = os.stat(WORK).st_dev
            for name in names:
                try:
                    dir_fd, last = open_parent(name, make=False)
                except (ValueError, OSError):
                    continue
                try:
                    fd = os.open(last, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                                 dir_fd=dir_fd)
                except OSError:
                    continue
                finally:
                    os.close(dir_fd)
                with os.fdopen(fd, "rb") as f:
                    st = os.fstat(fd)
                    if stat.S_ISREG(st.st_mode) and st.st_dev == work_dev:
                        out[name] = f.read(MAX_FETCH_BYTES).decode("utf-8", errors="replace")
        return out

    def _wipe(self) -> None:
        if not self.reusable:
            return
        with self._as_program():
            for d in (WORK, "/tmp", "/dev/shm"):
                try:
                    fd = os.open(d, _DIR_FLAGS)
                except OSError:
                    continue
                try:
                    wipe(fd)
                finally:
                    os.close(fd)

    def _kill_programs(self) -> None:
        if self.template is None:  # everything but pid 1 in this namespace is the program's
            kill_all()
        else:  # the template interpreter shares the namespace: kill by the program's uid
            kill_uid(self.uid)
        reap()

    # ---- one program

    def run(self, req: dict) -> dict:
        start = time.monotonic()
        limits = req["limits"]  # the host's ProgramLimits (sandboxes/program_limits.py)
        try:
            self._write_files(req)
        except (ValueError, OSError) as e:
            self._wipe()
            return {"status": "sandbox_error", "error": f"cannot write files: {e}"}
        ext = ".py" if req["language"] == "python" else ".sh"
        prog = "/tmp/.main" + ext
        try:
            os.unlink(prog)
        except FileNotFoundError:
            pass
        fd = os.open(prog, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(req["code"])
        argv = [self.python, "-I", "-S", prog] if ext == ".py" else ["/bin/bash", prog]
        stdin_fd = os.memfd_create("stdin")
        os.write(stdin_fd, req.get("stdin", "").encode())
        os.lseek(stdin_fd, 0, os.SEEK_SET)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        join = self.cgroups.join_fds() if self.cgroups else ()
        fds = {0: stdin_fd, 1: out_w, 2: err_w}
        child = None
        if ext == ".py" and self.template is not None:
            try:
                child = self.template.spawn(argv, self.uid, limits, fds, prog)
            except (OSError, ValueError):
                self.template = None  # it died: from now on every program gets a fresh interpreter
        if child is None:
            inline = prog if ext == ".py" and self.inline_python else ""
            child = Child(launch(argv, self.uid, limits, fds, self.kernel, join, inline))
        for fd in (stdin_fd, out_w, err_w):
            os.close(fd)
        deadline = time.monotonic() + float(req["time_limit_s"])
        sup = supervise(child, out_r, err_r, int(req["output_limit_bytes"]), deadline)
        status, usage = sup["status"], sup["usage"]
        if status is None:
            self._kill_programs()
            status, usage = child.wait()
        wall = time.monotonic() - start
        self._kill_programs()
        for fd in (out_r, err_r):
            os.close(fd)
        cpu = usage.ru_utime + usage.ru_stime if usage else 0.0
        exit_code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        oom = bool(self.cgroups and self.cgroups.oom())
        peak = (self.cgroups.peak_mb() if self.cgroups else 0.0) or (usage.ru_maxrss / 1024 if usage else 0.0)
        stderr = sup["stderr"].text()
        files = self._fetch(req.get("fetch", []))
        self._wipe()
        if self.reusable:  # (root's, in sticky /tmp: the wipe, as the program, leaves it)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(prog)
        return {
            "status": classify(
                exit_code=exit_code, sig=sig, timed_out=sup["timed_out"], over_cap=sup["over_cap"],
                oom=oom, cpu_s=cpu, cpu_limit=limits["cpu_s"], stderr=stderr,
            ),
            "exit_code": exit_code,
            "signal": sig,
            "stdout": sup["stdout"].text(),
            "stderr": stderr,
            "stdout_truncated": sup["stdout"].over,
            "stderr_truncated": sup["stderr"].over,
            "wall_s": round(wall, 6),
            "cpu_s": round(cpu, 6),
            "peak_memory_mb": round(peak, 3),
            "files": files,
        }

    # ---- a persistent interpreter

    def _start_driver(self) -> None:
        limits = dict(self.session_limits)
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        rep_r, rep_w = os.pipe()
        join = self.cgroups.join_fds() if self.cgroups else ()
        argv = [self.python, "-I", "-S", "-c", SESSION_DRIVER]
        pid = launch(argv, self.uid, limits, {0: in_r, 1: out_w, 2: err_w, 3: rep_w}, self.kernel, join)
        for fd in (in_r, out_w, err_w, rep_w):
            os.close(fd)
        self.session = (pid, in_w, out_r, err_r, rep_r)

    def session_end(self) -> None:
        if self.session is None:
            return
        signal_all(signal.SIGCONT)  # (a template interpreter was stopped with the rest)
        self._kill_programs()
        for fd in self.session[1:]:
            os.close(fd)
        self.session = None
        self._wipe()

    def session_call(self, req: dict) -> dict:
        if self.session is None:
            return {"status": "sandbox_error", "error": "no session: send session_start first"}
        start = time.monotonic()
        pid, in_w, out_r, err_r, rep_r = self.session
        try:  # while every process of the session is still stopped: nothing races these writes
            self._write_files(req)
        except (ValueError, OSError) as e:
            return {"status": "sandbox_error", "error": f"cannot write files: {e}"}
        signal_all(signal.SIGCONT)
        try:
            os.write(in_w, (json.dumps({"code": req["code"]}) + "\n").encode())
        except OSError:  # the interpreter is gone: restart it and say so
            self.session_end()
            self._start_driver()
            signal_all(signal.SIGSTOP)
            return {"status": "sandbox_error", "error": "the session interpreter had died; restarted"}
        deadline = start + float(req["time_limit_s"])
        sup = supervise(Child(pid), out_r, err_r, int(req["output_limit_bytes"]), deadline, rep_r, False)
        wall = time.monotonic() - start
        restarted = sup["status"] is not None or sup["timed_out"] or not sup["reply"]
        info = {}
        if sup["reply"]:
            info = json.loads(sup["reply"].decode().splitlines()[0])
        st = sup["status"]
        exit_code, sig = info.get("exit_code"), None
        if st is not None:
            exit_code = os.WEXITSTATUS(st) if os.WIFEXITED(st) else None
            sig = os.WTERMSIG(st) if os.WIFSIGNALED(st) else None
        files = self._fetch(req.get("fetch", []))
        if restarted:
            self.session_end()
            self._start_driver()
        signal_all(signal.SIGSTOP)  # background threads and processes wait for the next call
        stderr = sup["stderr"].text()
        return {
            "status": classify(
                exit_code=exit_code, sig=sig, timed_out=sup["timed_out"], over_cap=sup["over_cap"],
                oom=False, cpu_s=info.get("cpu_s", 0.0), cpu_limit=1e9, stderr=stderr,
            ),
            "exit_code": exit_code,
            "signal": sig,
            "stdout": sup["stdout"].text(),
            "stderr": stderr,
            "stdout_truncated": sup["stdout"].over,
            "stderr_truncated": sup["stderr"].over,
            "wall_s": round(wall, 6),
            "cpu_s": round(info.get("cpu_s", 0.0), 6),
            "peak_memory_mb": round(info.get("maxrss_kb", 0) / 1024, 3),
            "files": files,
            "session_cpu_s": round(info.get("total_cpu_s", 0.0), 6),
            "error": "interpreter restarted; its variables are gone" if restarted else "",
        }


def serve(supervisor: Supervisor, rfile, wfile) -> None:
    """Answer one JSON line per request line until EOF."""
    for line in rfile:
        if not line.strip():
            continue
        try:
            msg = json.loads(line)
        except ValueError as e:
            reply = {"status": "sandbox_error", "error": f"bad request line: {e}"}
        else:
            reply = supervisor.handle(msg)
        wfile.write((json.dumps(reply) + "\n").encode())
        wfile.flush()
    supervisor.session_end()


def container_main() -> None:
    """Entry point inside a DockerSandbox container (pid 1, root with SETUID, SETGID and KILL)."""
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    uid = int(os.environ.get("SANDBOX_UID", "10000"))
    os.chmod(WORK, 0o1777)
    kernel = Kernel(base64.b64decode(os.environ.get("SANDBOX_SECCOMP", "")))
    # (the bounding set is the container's: Docker's cap_add, these three)
    kernel.drop_capabilities(keep=(Kernel.CAP_KILL, Kernel.CAP_SETGID, Kernel.CAP_SETUID))
    kernel.set_dumpable(False)
    template = Template(kernel) if os.environ.get("SANDBOX_FORK_INTERPRETER", "1") == "1" else None
    supervisor = Supervisor(uid, python=os.environ.get("SANDBOX_PYTHON", "/usr/bin/python3"), kernel=kernel,
                            cgroups=ContainerMemory(), template=template, reusable=True)
    serve(supervisor, sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__" and sys.argv[1:2] == ["container"]:
    container_main()
