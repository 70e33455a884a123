"""The local jail: fresh Linux namespaces, a read-only root, and our supervisor as pid 1.

What it is: a warm fork server (the *zygote*, ``zygote_main``) that LocalSandbox starts once,
as root on the host (*root mode*) or, without root, inside one bubblewrap sandbox of its own
(*rootless mode*, ``sandboxes/local.py`` builds the ``bwrap`` command). At start it builds,
in a mount namespace of its own, the read-only template of every jail's root. For each jail
it is sent a small JSON message and one end of a socket pair; it picks a free *slot* (a uid
and, in root mode, a reusable pair of cgroups) and clones pid 1 of new pid/net/ipc/uts
namespaces (``clone_jail``; rootless, a user namespace too), which unshares the mount
namespace (a copy of the template), mounts its own ``/work``, ``/tmp`` and a read-only
``/proc``, pivots into it, drops its capabilities and serves the supervisor protocol
(``sandboxes/supervisor.py``) on the socket. When the socket closes, pid 1 exits and the
kernel kills everything left in the namespace; the slot is reused once its cgroup is empty.

What is covered (both modes unless said):
  * pid namespace: the program sees only its jail; it cannot signal host processes; every
    process it leaves behind dies with pid 1;
  * empty net namespace (not even ``lo`` is up): no socket reaches anything, 127.0.0.1 included;
  * mount namespace with pivot_root into a tmpfs root that holds read-only, nosuid, nodev
    binds of ``/usr`` and the interpreter's prefix, a minimal ``/etc`` and ``/dev``, size-
    bounded tmpfs ``/work`` and ``/tmp``, and ``/proc`` of the jail's own pid namespace,
    read-only and with ``hidepid=2`` (pid 1, the supervisor, is not dumpable, so it is not
    even listed); the host's other files (``/root``, ``/home``, the repository,
    ``/etc/shadow``) are not in its view;
  * ipc and uts namespaces; hostname ``sandbox``;
  * the seccomp filter of ``sandboxes/seccomp.py`` on every program (no namespaces, mounts,
    ptrace, bpf, perf, keyrings, modules, ...), no new privileges, no capabilities, rlimits
    on CPU, address space, file size, processes, fds and core size;
  * root mode: programs run as the unprivileged uid of their slot (never two live jails
    with one uid), no supplementary groups; pid 1 keeps only SETUID, SETGID and KILL, and
    does its file I/O with the program's filesystem uid;
  * root mode: cgroups (v1 or v2, when writable) cap memory (also tmpfs pages) and process
    count and report OOM kills and peak memory; they nest under ``cgroup_parent``;
  * rootless mode: the whole fork server lives in a bubblewrap sandbox (user, pid, net, ipc,
    uts and cgroup namespaces; only ``/usr``, the interpreter and this directory read-only),
    and each jail has a user namespace of its own mapping one uid (the host user's): pid 1
    drops every capability, so it holds nothing the program does not, and the per-jail user
    namespace makes ``RLIMIT_NPROC`` count this jail's processes only;
  * Python programs run in a fork of pid 1's warm interpreter, after the privileges are
    dropped and the interpreter is reset to a fresh ``python -I -S`` state (see
    ``supervisor.run_inline``); that fork holds nothing but this jail's own request.

What is not covered: kernel exploits through the system calls the filter allows, CPU
contention between jails (no cpu quota; the CPU-time rlimit bounds each program), timing side
channels, and the readable contents of ``/usr`` and the interpreter's prefix. Rootless mode
has no cgroups: memory is bounded by RLIMIT_AS and the tmpfs sizes, not by a cgroup, and peak
memory is the program's max RSS; there pid 1 shares the program's uid, so it is kept from
the program by the pid namespace (init receives only the signals it handles), by being
non-dumpable and by the filter (no ptrace, no prlimit of another process), not by a uid of
its own: the program may still lower pid 1's scheduling priority, which slows its own run
only. Core dumps are off (RLIMIT_CORE 0); a host ``core_pattern`` that pipes to a helper is
the host's to configure.
Main hook: ``zygote_main(fd, config)``.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import gc
import json
import os
import select
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from supervisor import Kernel, Supervisor, serve  # noqa: E402  (stdlib-only sibling, importable as a script)

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
KEEP_AS_ROOT = (Kernel.CAP_KILL, Kernel.CAP_SETGID, Kernel.CAP_SETUID)
"""The capabilities a root-mode jail's pid 1 keeps (and the zygote's bounding set)."""
ROOTLESS_UID = 1000
"""The uid programs (and pid 1) have inside a rootless jail; it maps to the host user's uid."""

ROOT_DIR = "/tmp/.agentrl-jail-root"  # a mount point only: each zygote mounts the template on it
PROC_DIR = "/tmp/.agentrl-jail-proc"  # rootless: a clean /proc the jails' own /proc mounts rely on

_libc = ctypes.CDLL(None, use_errno=True)
_pylibc = ctypes.PyDLL(None, use_errno=True)
SYSCALLS: dict[str, int] = {}
"""This machine's numbers of the calls libc has no wrapper for (``clone`` without its stack
dance, ``pivot_root``), resolved by libseccomp on the host and passed in the zygote's config."""


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def bind_ro(src: str, target: str) -> None:
    mount(src, target, None, MS_BIND | MS_REC)
    mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


# --------------------------------------------------------------------------- cgroups


def _own_cgroup_path(controller: str) -> str:
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if controller in ctrls.split(",") or (controller == "" and ctrls == ""):
                return path
    return "/"


class Cgroups:
    """The memory and pids cgroups of one jail slot (v1 hierarchies or the v2 unified one).

    Made once by the zygote and reused by the jails that take the slot in turn (making and
    removing memory cgroups per run costs more than the whole rest of a jail)."""

    def __init__(self, name: str, parent: str = "") -> None:
        self.dirs: list[str] = []
        self.v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
        if self.v2:
            base = "/sys/fs/cgroup/" + parent.strip("/") if parent else "/sys/fs/cgroup" + _own_cgroup_path("")
            d = os.path.join(base, name)
            os.mkdir(d)
            self.dirs.append(d)
            self.procs = [os.open(f"{d}/cgroup.procs", os.O_WRONLY)]
            self.events = os.open(f"{d}/memory.events", os.O_RDONLY)
            self.peak = os.open(f"{d}/memory.peak", os.O_RDONLY) if os.path.exists(f"{d}/memory.peak") else None
        else:
            self.procs = []
            for ctrl in ("memory", "pids"):
                root = f"/sys/fs/cgroup/{ctrl}"
                base = os.path.join(root, parent.strip("/")) if parent else root + _own_cgroup_path(ctrl)
                if not os.path.isdir(base):
                    base = root
                d = os.path.join(base, name)
                os.mkdir(d)
                self.dirs.append(d)
                self.procs.append(os.open(f"{d}/cgroup.procs", os.O_WRONLY))
            mem = self.dirs[0]
            self.events = os.open(f"{mem}/memory.oom_control", os.O_RDONLY)
            self.peak = os.open(f"{mem}/memory.max_usage_in_bytes", os.O_RDWR)
        self._oom_seen = 0
        self._limits = (-1, -1)

    def configure(self, memory_mb: int, pids: int) -> None:
        """Set the limits for the next jail in this slot (nothing to write when unchanged)."""
        if self._limits == (memory_mb, pids):
            return
        self._limits = (-1, -1)  # unknown until every write below went through
        mb = memory_mb << 20
        if self.v2:
            self._write(self.dirs[0], "memory.max", mb)
            self._write(self.dirs[0], "memory.swap.max", 0, optional=True)
            self._write(self.dirs[0], "pids.max", pids)
        else:
            mem, pid = self.dirs
            # memsw >= memory at every step, so order the two writes by direction
            keys = ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
            current = int(open(f"{mem}/memory.limit_in_bytes").read())
            for key in (keys if mb <= current else keys[::-1]):
                self._write(mem, key, mb, optional=key.startswith("memory.memsw"))
            self._write(pid, "pids.max", pids)
        self._limits = (memory_mb, pids)

    @staticmethod
    def _write(d: str, key: str, value: int, optional: bool = False) -> None:
        try:
            with open(os.path.join(d, key), "w") as f:
                f.write(str(value))
        except OSError:
            if not optional:
                raise

    def empty(self) -> bool:
        with open(os.path.join(self.dirs[-1], "cgroup.procs")) as f:
            return not f.read().strip()

    def join_fds(self) -> list[int]:
        """cgroup.procs files a child writes "0" into to join (open before pivot_root)."""
        if self.peak is not None and not self.v2:
            os.pwrite(self.peak, b"0", 0)
        self._oom_seen = self._oom_kills()
        return list(self.procs)

    def _oom_kills(self) -> int:
        text = os.pread(self.events, 4096, 0).decode()
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def oom(self) -> bool:
        return self._oom_kills() > self._oom_seen

    def peak_mb(self) -> float:
        if self.peak is None:
            return 0.0
        return int(os.pread(self.peak, 64, 0).decode().strip() or 0) / (1 << 20)

    def remove(self) -> None:
        for d in self.dirs:
            for _ in range(100):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:  # the kernel is still tearing the last processes down
                    time.sleep(0.005)


# --------------------------------------------------------------------------- the root


def build_template(root: str, python_prefix: str, rootless: bool) -> None:
    """Build the read-only part of every jail's root at ``root``, once, in the zygote's own
    mount namespace; each jail's mount namespace starts as a copy of it."""
    unshare(CLONE_NEWNS)
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    if rootless:
        # A jail (in a user namespace of its own) may mount its /proc only where a proc
        # mount is already fully visible; bubblewrap's /proc has read-only binds on top.
        os.makedirs(PROC_DIR, mode=0o755, exist_ok=True)
        mount("proc", PROC_DIR, "proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for d in ("usr", "etc", "dev", "proc", "work", "tmp"):
        os.mkdir(f"{root}/{d}")
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = f"/{top}"
        if os.path.islink(host):
            os.symlink(os.readlink(host), f"{root}/{top}")
        elif os.path.isdir(host):
            os.mkdir(f"{root}/{top}")
            bind_ro(host, f"{root}/{top}")
    bind_ro("/usr", f"{root}/usr")
    if python_prefix != "/usr" and not python_prefix.startswith("/usr/"):
        os.makedirs(root + python_prefix)
        bind_ro(python_prefix, root + python_prefix)
    etc = {
        "passwd": "root:x:0:0::/:/bin/false\nnobody:x:65534:65534::/nonexistent:/bin/false\n",
        "group": "root:x:0:\nnogroup:x:65534:\n",
        "hostname": "sandbox\n",
        "hosts": "127.0.0.1 localhost sandbox\n",
    }
    for name, text in etc.items():
        with open(f"{root}/etc/{name}", "w") as f:
            f.write(text)
    if os.path.exists("/etc/ld.so.cache"):
        open(f"{root}/etc/ld.so.cache", "w").close()
        bind_ro("/etc/ld.so.cache", f"{root}/etc/ld.so.cache")
    for dev in ("null", "zero", "full", "random", "urandom"):
        open(f"{root}/dev/{dev}", "w").close()
        mount(f"/dev/{dev}", f"{root}/dev/{dev}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{root}/dev/{name}")
    mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def map_own_ids(inner: int, outer_uid: int, outer_gid: int) -> None:
    """In a fresh user namespace: map ``inner`` (uid and gid) to this process's ids outside
    (its parent's: unmapped, they read as the overflow id in here), the one mapping an
    unprivileged process may write for itself."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{inner} {outer_uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{inner} {outer_gid} 1")


def enter_root(root: str, work_mb: int, uid: int, rootless: bool) -> None:
    """In a fresh mount namespace (a copy of the zygote's): mount the jail's own /work,
    /tmp and /proc on the template and pivot into it, dropping the host's tree."""
    unshare(CLONE_NEWNS)
    if rootless:
        # Copied into this jail's (less privileged) user namespace, the template's mounts
        # are locked, and pivot_root refuses a locked new root; a bind of it is not locked
        # (its submounts, /usr and the rest, stay locked: they cannot be unmounted).
        mount(root, root, None, MS_BIND | MS_REC)
    opts = f"size={work_mb}m,mode=700,uid={uid},gid={uid}"
    mount("tmpfs", f"{root}/work", "tmpfs", MS_NOSUID | MS_NODEV, opts)
    mount("tmpfs", f"{root}/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={max(work_mb // 4, 1)}m,mode=1777")
    # read-only (no /proc/sys, /proc/self/mem or /proc/*/attr writes), other processes hidden
    mount("proc", f"{root}/proc", "proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
    os.chdir(root)
    _check(_libc.syscall(SYSCALLS["pivot_root"], b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")


# --------------------------------------------------------------------------- the zygote


def clone_jail(flags: int) -> int:
    """fork() into new namespaces in one step: the child is pid 1 of a fresh pid namespace.

    A raw ``clone`` (no CLONE_VM, so a copy-on-write copy like fork) through ``PyDLL``, which
    keeps the GIL held. Python's at-fork hooks do not run in the child; the zygote is
    single-threaded and holds no locks, and the child only sets up the jail and serves it
    (it forks its own children with ``os.fork``). Saves a whole intermediate process per jail."""
    pid = _pylibc.syscall(SYSCALLS["clone"], ctypes.c_ulong(flags | signal.SIGCHLD), 0, 0, 0, 0)
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"clone: {os.strerror(err)}")
    return pid


def _pid1(sock: socket.socket, params: dict, config: dict, kernel: Kernel, uid: int, cg: Cgroups | None) -> None:
    """Pid 1 of a new jail (cloned by the zygote): ids, root, supervisor, no capabilities
    beyond what it needs, serve. Never returns."""
    try:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the zygote gone: the jail goes
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # init gets only the signals it handles
        if config["rootless"]:
            map_own_ids(uid, *config["outer_ids"])
        _libc.sethostname(b"sandbox", 7)
        enter_root(ROOT_DIR, params["work_mb"], uid, config["rootless"])
        supervisor = Supervisor(uid, config["python"], kernel, cgroups=cg, inline_python=params.get("inline_python", False))
        if config["rootless"]:  # the user namespace gave a full bounding set; pid 1 has the program's uid
            kernel.drop_bounding_set()  # already and needs nothing
            kernel.drop_capabilities()
        else:  # what switching to the program's uid and killing its processes need (bounding set: the zygote's)
            kernel.drop_capabilities(KEEP_AS_ROOT)
        kernel.set_dumpable(False)  # no /proc/1/{mem,environ,fd} for the program, not even listed
        f = sock.makefile("rwb")
        serve(supervisor, f, f)
        os._exit(0)
    except BaseException as e:
        try:
            sock.sendall((json.dumps({"status": "sandbox_error", "error": f"jail setup: {e}"}) + "\n").encode())
        finally:
            os._exit(1)


def join_parent(parent: str) -> None:
    """Move this process under the cgroup ``parent`` (made beforehand, e.g. by a test), so
    the zygote and every jail count against its limits. In cgroup v2 a cgroup with
    children may hold no processes, so the zygote takes a leaf of its own there."""
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        base = f"/sys/fs/cgroup/{parent.strip('/')}"
        with open(f"{base}/cgroup.subtree_control", "w") as f:
            f.write("+memory +pids")
        leaf = f"{base}/zygote-{os.getpid()}"
        os.makedirs(leaf, exist_ok=True)
        paths = [leaf]
    else:
        paths = [f"/sys/fs/cgroup/{c}/{parent.strip('/')}" for c in ("memory", "pids")]
    for path in paths:
        with open(f"{path}/cgroup.procs", "w") as f:
            f.write("0")


class Slots:
    """Jail slots: slot ``i`` owns uid ``uid_base + i`` and (when cgroups are writable) one
    reusable pair of cgroups. A slot is busy from its jail's fork until the zygote reaps
    that jail's first process, which happens after everything in the jail has died."""

    def __init__(self, uid_base: int, cgroup_parent: str, use_cgroups: bool) -> None:
        self.uid_base = uid_base
        self.parent = cgroup_parent
        self.use_cgroups = use_cgroups
        self.cgroups: dict[int, Cgroups | None] = {}
        self.free: list[int] = []
        self.busy: dict[int, int] = {}  # jail pid -> slot
        self.draining: list[int] = []

    def reap(self) -> None:
        while self.busy:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            slot = self.busy.pop(pid, None)
            if slot is not None:
                self.draining.append(slot)
        # a killed jail's processes may still be dying: reuse its slot only once it is empty
        for slot in list(self.draining):
            cg = self.cgroups[slot]
            if cg is None or cg.empty():
                self.draining.remove(slot)
                self.free.append(slot)

    def take(self, memory_mb: int, pids: int) -> tuple[int, Cgroups | None]:
        self.reap()
        while self.free:
            slot = self.free.pop()
            cg = self.cgroups[slot]
            try:
                if cg is not None:
                    cg.configure(memory_mb, pids)
                return slot, cg
            except OSError:  # the old jail's pages still pin usage above the new limit
                continue  # leave this slot aside; a fresh one is made below
        slot = len(self.cgroups)
        cg = None
        if self.use_cgroups:
            try:
                cg = Cgroups(f"agentrl-{os.getpid()}-{slot}", self.parent)
                cg.configure(memory_mb, pids)
            except OSError:
                self.use_cgroups = False  # not writable here: rlimits only
                cg = None
        self.cgroups[slot] = cg
        return slot, cg

    def close(self) -> None:
        """The sandbox is closing: kill the jails still running, then drop the cgroups."""
        for pid in list(self.busy):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)  # a jail's pid 1: the kernel kills the rest
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        for cg in self.cgroups.values():
            if cg is not None:
                cg.remove()


def zygote_main(fd: int, config: dict) -> None:
    """Serve jail requests on the SEQPACKET socket ``fd`` until it closes. ``config``:
    ``python`` (programs' interpreter), ``rootless``, ``cgroup_parent``, ``uid_base``,
    ``seccomp`` (the filter's BPF, base64), ``syscalls`` (name -> number, see SYSCALLS)."""
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    with contextlib.suppress(OSError):  # (bubblewrap made us a session leader already)
        os.setsid()
    control = socket.socket(fileno=fd)
    rootless = bool(config["rootless"])
    config["outer_ids"] = (os.getuid(), os.getgid())
    try:
        SYSCALLS.update(config["syscalls"])
        python = config["python"]
        prefix = os.path.realpath(os.path.join(os.path.dirname(python), ".."))
        # Only a mount point: the template is mounted on it inside this zygote's own mount
        # namespace, so every zygote on the host can share the one empty directory.
        os.makedirs(ROOT_DIR, mode=0o755, exist_ok=True)
        st = os.lstat(ROOT_DIR)
        if not os.path.isdir(ROOT_DIR) or os.path.islink(ROOT_DIR) or st.st_uid != 0:
            raise OSError(f"{ROOT_DIR} must be a directory owned by root (not a link); remove it")
        build_template(ROOT_DIR, prefix, rootless)
        if config["cgroup_parent"] and not rootless:  # (rootless: LocalSandbox joined it before bwrap)
            join_parent(config["cgroup_parent"])
        kernel = Kernel(base64.b64decode(config["seccomp"]))
        if not rootless:  # every jail inherits it (a rootless jail's user namespace starts a full one)
            kernel.drop_bounding_set(KEEP_AS_ROOT)
    except Exception as e:  # tell LocalSandbox why, then stop
        control.send(json.dumps({"ready": False, "error": f"{type(e).__name__}: {e}"}).encode())
        return
    control.send(json.dumps({"ready": True}).encode())
    slots = Slots(config["uid_base"], config["cgroup_parent"], use_cgroups=not rootless)
    flags = CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | (CLONE_NEWUSER if rootless else 0)
    # Forked jails touch less of the zygote's memory (fewer copy-on-write faults) when the
    # collector neither runs nor walks the objects made so far; they run for milliseconds.
    gc.disable()
    gc.freeze()
    try:
        while True:
            ready, _, _ = select.select([control], [], [], 1.0)
            if not ready:
                slots.reap()
                continue
            msg, fds, _, _ = socket.recv_fds(control, 1 << 16, 1)
            if not msg:
                return
            params = json.loads(msg)
            jail_sock = socket.socket(fileno=fds[0])
            try:
                slot, cg = slots.take(params["memory_mb"], params["pids"])
            except OSError as e:
                jail_sock.sendall((json.dumps({"status": "sandbox_error", "error": f"jail slot: {e}"}) + "\n").encode())
                jail_sock.close()
                continue
            try:
                pid = clone_jail(flags)
            except OSError as e:
                slots.free.append(slot)
                jail_sock.sendall((json.dumps({"status": "sandbox_error", "error": f"jail: {e}"}) + "\n").encode())
                jail_sock.close()
                continue
            if pid == 0:
                control.close()
                _pid1(jail_sock, params, config, kernel, ROOTLESS_UID if rootless else config["uid_base"] + slot, cg)
            slots.busy[pid] = slot
            try:  # the host kills the jail through this pidfd (its pid means nothing outside our namespace)
                pidfd = os.pidfd_open(pid)
            except OSError:
                pidfd = None
            with contextlib.suppress(OSError):
                hello = (json.dumps({"jail_pid": pid}) + "\n").encode()
                socket.send_fds(jail_sock, [hello], [pidfd] if pidfd is not None else [])
            if pidfd is not None:
                os.close(pidfd)
            jail_sock.close()
    finally:
        slots.close()


if __name__ == "__main__":
    zygote_main(int(sys.argv[1]), json.loads(sys.argv[2]))
