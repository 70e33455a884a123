"""The seccomp filter every sandboxed program runs under, compiled on the host by libseccomp.

What it is: ``program_filter()`` builds, once per process, a classic-BPF seccomp program with
libseccomp (``libseccomp.so.2``, Debian's ``libseccomp2``, through ctypes) and returns its
bytes. The supervisor (``sandboxes/supervisor.py``, standard library only) installs those bytes
with ``prctl(PR_SET_SECCOMP)`` in each program's process, after dropping to the program's
uid and setting no-new-privileges, just before ``execve``; the filter is inherited by every
process and thread the program makes and cannot be removed.

The filter allows everything but the calls a program has no business making, which fail
with EPERM (``clone3``, whose flags live in memory a filter cannot read, fails with ENOSYS,
and the C library then falls back to ``clone``):
  * new namespaces and joining others: ``unshare``, ``setns``, ``clone`` with any
    ``CLONE_NEW*`` flag (a user namespace would give the program every capability in it);
  * mounts: ``mount``, ``umount2``, ``pivot_root``, ``chroot`` and the new mount API;
  * other processes' memory and limits: ``ptrace``, ``process_vm_readv/writev``,
    ``pidfd_getfd``, ``prlimit64`` on any pid but its own (0);
  * kernel attack surface unprivileged code does not need: ``bpf``, ``perf_event_open``,
    ``userfaultfd``, ``io_uring_*``, ``keyctl``/``add_key``/``request_key``;
  * the host's machine state: kernel modules, ``kexec``, ``reboot``, swap, ``acct``,
    quotas, clocks, ``syslog``, ``iopl``/``ioperm``, handle-based opens.

Architectures: names are resolved by libseccomp for the machine that builds the filter
(x86-64, aarch64, ...; a name the architecture lacks is skipped), and the BPF starts with
libseccomp's architecture check: a syscall made through another ABI (i386 or x32 on x86-64)
kills the process. Docker's engine runs on this host, so its containers share the arch.

What it is not: a whitelist. The rest of the kernel's interface stays reachable, so a kernel
bug in an allowed call is not covered. Main hook: ``program_filter() -> bytes``.
"""

from __future__ import annotations

import ctypes
import functools
import os

from agentrl.errors import SandboxUnavailable

DENIED = (
    # namespaces and mounts
    "unshare", "setns", "mount", "umount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    # other processes' memory
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
    # kernel attack surface
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key",
    # the machine
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "settimeofday", "clock_settime",
    "clock_adjtime", "adjtimex", "syslog", "iopl", "ioperm", "open_by_handle_at", "name_to_handle_at",
    "lookup_dcookie", "nfsservctl", "uselib", "vhangup",
)
"""System calls that fail with EPERM for every program."""

CLONE_NEW_FLAGS = {
    "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000, "CLONE_NEWTIME": 0x00000080,
}
"""``clone`` flags (its first argument on x86-64 and aarch64) that make a program fail with EPERM."""

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_ACT_KILL_PROCESS = 0x80000000
SCMP_FLTATR_ACT_BADARCH = 2
SCMP_CMP_NE, SCMP_CMP_MASKED_EQ = 1, 7
EPERM, ENOSYS = 1, 38


def _errno(value: int) -> int:
    return 0x00050000 | value  # SCMP_ACT_ERRNO(value)


class _ArgCmp(ctypes.Structure):
    """libseccomp's ``struct scmp_arg_cmp``."""

    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


def _library() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    except OSError as e:
        raise SandboxUnavailable(
            f"libseccomp is not installed ({e}); the sandboxes filter every program's system calls "
            "with it: install it (Debian/Ubuntu: apt install libseccomp2; Fedora: dnf install libseccomp)"
        ) from e
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_export_pfc.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_arch_resolve_name.restype = ctypes.c_uint32
    lib.seccomp_arch_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_arch_native.restype = ctypes.c_uint32
    lib.seccomp_arch_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    lib.seccomp_arch_remove.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    return lib


def syscall_number(name: str) -> int:
    """This machine's number of the system call ``name`` (-1 when it has none)."""
    lib = _library()
    nr = lib.seccomp_syscall_resolve_name(name.encode())
    return nr if nr >= 0 else -1


def _check(ret: int, what: str) -> None:
    if ret < 0:
        raise SandboxUnavailable(f"libseccomp could not {what}: {os.strerror(-ret)}")


def _build(export: str, arch: str = "") -> bytes:
    lib = _library()
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise SandboxUnavailable("libseccomp could not make a filter (seccomp_init failed)")
    try:
        token = lib.seccomp_arch_resolve_name(arch.encode()) if arch else 0
        if arch and not token:
            raise ValueError(f"libseccomp knows no architecture {arch!r}")
        if token and token != lib.seccomp_arch_native():
            # another machine's filter (numbers are translated by name): for review and tests
            _check(lib.seccomp_arch_add(ctx, token), f"add the architecture {arch}")
            _check(lib.seccomp_arch_remove(ctx, 0), "remove the native architecture")
        _check(lib.seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS), "set the bad-arch action")
        for name in DENIED:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:  # not a call of this architecture (or unknown to libseccomp)
                continue
            _check(lib.seccomp_rule_add_array(ctx, _errno(EPERM), nr, 0, None), f"deny {name}")
        clone = lib.seccomp_syscall_resolve_name(b"clone")
        for flag in CLONE_NEW_FLAGS.values():
            cmp = _ArgCmp(0, SCMP_CMP_MASKED_EQ, flag, flag)
            _check(lib.seccomp_rule_add_array(ctx, _errno(EPERM), clone, 1, ctypes.byref(cmp)), "filter clone")
        prlimit = lib.seccomp_syscall_resolve_name(b"prlimit64")
        if prlimit >= 0:  # another process's limits (its own, pid 0, stay settable: setrlimit uses it)
            cmp = _ArgCmp(0, SCMP_CMP_NE, 0, 0)
            _check(lib.seccomp_rule_add_array(ctx, _errno(EPERM), prlimit, 1, ctypes.byref(cmp)), "filter prlimit64")
        clone3 = lib.seccomp_syscall_resolve_name(b"clone3")
        if clone3 >= 0:
            _check(lib.seccomp_rule_add_array(ctx, _errno(ENOSYS), clone3, 0, None), "filter clone3")
        r, w = os.pipe()
        try:
            exporter = lib.seccomp_export_bpf if export == "bpf" else lib.seccomp_export_pfc
            _check(exporter(ctx, w), f"export the filter as {export}")
        finally:
            os.close(w)
        with os.fdopen(r, "rb") as f:
            return f.read()
    finally:
        lib.seccomp_release(ctx)


@functools.lru_cache(maxsize=1)
def program_filter() -> bytes:
    """The filter as BPF bytes (8 bytes per instruction), for ``supervisor.Seccomp``.
    Raises SandboxUnavailable when libseccomp is missing."""
    bpf = _build("bpf")
    if not bpf or len(bpf) % 8:
        raise SandboxUnavailable(f"libseccomp exported a malformed filter ({len(bpf)} bytes)")
    return bpf


def describe(arch: str = "") -> str:
    """The filter in libseccomp's readable pseudo-code (for reviewing what is denied), for
    this machine or for the architecture named by libseccomp (``"aarch64"``, ``"x86_64"``)."""
    return _build("pfc", arch).decode()
