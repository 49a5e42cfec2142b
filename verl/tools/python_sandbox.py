"""A Python tool: runs the model's code in an isolated, limited process and returns what it printed.

Each call runs ``python -I -B -c <bootstrap>`` under bubblewrap with a seccomp filter
(:mod:`verl.tools.isolation`): its own user, PID, mount and network namespaces as uid 65534 with no
capabilities, a read-only view of the system's programs and of the trainer's Python installation, a
``/sandbox`` tmpfs of ``disk_mb`` as its only writable place, and no new processes, device nodes, priority or
affinity changes, ptrace, pidfds or mounts. The host must allow user namespaces and have ``bwrap``
(``apt install bubblewrap`` or ``pip install 'verl[sandbox]'``): the tool checks at start-up and refuses with the
reason when it cannot isolate. ``isolation: none`` in its config runs the code without the OS isolation, with a
warning (the limits and the audit hook below only: a guard against honest mistakes, not a security boundary).

Before the code runs the bootstrap, in either case,

* sets resource limits: CPU time, address space, file size, open files, no core files and, unisolated and for a
  non-root user, no new processes or threads (root ignores RLIMIT_NPROC);
* unisolated, moves into a new network namespace where the host allows it;
* installs an audit hook (:func:`sys.addaudithook`) as a second layer: it refuses sockets other than local
  socket pairs, connect/bind/name lookups, starting processes, ctypes, changing resource limits, signals to
  other processes, gc object walks, symbolic links, and writes, deletes, renames, permission changes and hard
  links outside the work directory. Reading files stays allowed: the interpreter needs it.

The parent kills the call's process group at the wall-clock limit and when the call ends or is cancelled
(bubblewrap's ``--die-with-parent`` takes the sandbox's processes along), and reads the output to its end while
keeping only its head and tail. What the isolation stops, with the test that shows each, and what it does not:
docs/agent_loop.md, "Security".

Config keys (the tool's ``config`` dict): ``cpu_time_s`` (5), ``wall_time_s`` (10), ``memory_mb`` (512),
``max_output_chars`` (1024), ``file_size_mb`` (4), ``disk_mb`` (64: the work directory's size, isolated only),
``isolation`` (``bwrap``, or ``none`` to opt out), ``max_concurrency`` (the number of CPUs: calls beyond it
wait their turn, so that CPU-starved calls do not all hit the wall-clock limit); ``type`` is ignored.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import logging
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
import weakref
from typing import Any

from verl.tools import isolation
from verl.tools.base import BaseTool, OpenAIFunctionToolSchema, ToolError, ToolResponse, string_argument

logger = logging.getLogger(__name__)

PYTHON_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "python",
        "description": (
            "Run a Python 3 program and return what it prints (stdout and stderr). Each call is a fresh "
            "process with no network and a short time limit; use print() to show results."
        ),
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the Python source code to run"}},
            "required": ["code"],
        },
    },
}

DEFAULTS: dict[str, float] = {
    "cpu_time_s": 5,
    "wall_time_s": 10,
    "memory_mb": 512,
    "max_output_chars": 1024,
    "file_size_mb": 4,
    "disk_mb": 64,
}
"""the tool's limits and their defaults (see the module docstring for ``isolation``, ``max_concurrency`` and
``type``)"""

ISOLATION_CHOICES = ("bwrap", "none")

_READ_CHUNK = 65536
_KILL_GRACE_S = 5.0
"""how long to wait for the process and its output pipe to close after SIGKILL"""

# Runs in the child before the model's code; argv[1] is a JSON object of limits. Everything it needs is
# bound before the audit hook is installed, and the hook only calls functions captured in its closure and a
# private copy of the builtins, so the code cannot disarm it by patching modules.
_BOOTSTRAP = r"""
import builtins, json, os, resource, sys, types

def _sandbox():
    cfg = json.loads(sys.argv[1])
    code = sys.stdin.buffer.read().decode("utf-8", "replace")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(0, "r", closefd=False)
    sys.argv = ["<code>"]
    sys.dont_write_bytecode = True
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(encoding="utf-8", errors="backslashreplace", line_buffering=True)

    if not cfg["isolated"]:  # under bubblewrap the network namespace is there already
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        clone_newnet, clone_newuser = 0x40000000, 0x10000000
        if libc.unshare(clone_newnet) != 0:
            libc.unshare(clone_newnet | clone_newuser)
        del libc

    def limit(which, soft, hard=None):
        hard = soft if hard is None else hard
        try:
            current = resource.getrlimit(which)[1]
            if current != resource.RLIM_INFINITY:
                soft, hard = min(soft, current), min(hard, current)
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError):
            pass

    limit(resource.RLIMIT_CPU, cfg["cpu"], cfg["cpu"] + 1)  # SIGXCPU at the soft limit, SIGKILL a second later
    limit(resource.RLIMIT_AS, cfg["memory"])
    limit(resource.RLIMIT_FSIZE, cfg["fsize"])
    limit(resource.RLIMIT_NOFILE, 64)
    limit(resource.RLIMIT_CORE, 0)
    if os.geteuid() != 0 and not cfg["isolated"]:  # isolated, the seccomp filter refuses new processes
        limit(resource.RLIMIT_NPROC, 0)

    # subprocess starts children through _posixsubprocess.fork_exec, which raises no audit event itself.
    import _posixsubprocess

    def fork_exec(*args, **kwargs):
        raise PermissionError("starting processes is disabled in the sandbox")

    _posixsubprocess.fork_exec = fork_exec

    import posix, _stat
    hook = _make_hook(cfg["root"], os.getpid(), os.getpgrp(), posix.getcwd, posix.readlink, posix.stat,
                      posix.fspath, _stat.S_ISDIR)
    private = {"__builtins__": dict(vars(builtins))}
    sys.addaudithook(types.FunctionType(hook.__code__, private, "audit_hook", None, hook.__closure__))
    del hook, private
    return code


def _make_hook(root, pid, pgid, getcwd, readlink, stat, fspath, isdir):
    network = "network access is disabled in the sandbox"
    process = "starting processes is disabled in the sandbox"
    write_flags = 0o1 | 0o2 | 0o100 | 0o1000 | 0o2000  # O_WRONLY O_RDWR O_CREAT O_TRUNC O_APPEND
    exact = {
        "os.system": process, "os.exec": process, "os.fork": process, "os.forkpty": process,
        "os.posix_spawn": process, "os.spawn": process, "pty.spawn": process, "subprocess.Popen": process,
        "os.startfile": process,
        # a link's target is resolved when followed, so a link inside could point anywhere
        "os.symlink": "symbolic links are disabled in the sandbox",
        "socket.bind": network, "socket.connect": network, "socket.getaddrinfo": network,
        "socket.gethostbyname": network, "socket.gethostbyaddr": network, "socket.getnameinfo": network,
        "socket.sendto": network, "socket.sendmsg": network, "socket.sethostname": network,
        "resource.setrlimit": "changing resource limits is disabled in the sandbox",
        "resource.prlimit": "changing resource limits is disabled in the sandbox",
        "gc.get_objects": "gc object walks are disabled in the sandbox",
        "gc.get_referrers": "gc object walks are disabled in the sandbox",
        "gc.get_referents": "gc object walks are disabled in the sandbox",
        "sys._current_frames": "inspecting other threads is disabled in the sandbox",
        "sqlite3.enable_load_extension": "loading native extensions is disabled in the sandbox",
        "sqlite3.load_extension": "loading native extensions is disabled in the sandbox",
    }
    # event -> positions of (path, dir_fd) pairs it changes
    writes = {
        "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),), "os.chmod": ((0, 2),),
        "os.chown": ((0, 3),), "os.utime": ((0, 3),), "os.truncate": ((0, None),),
        "os.rename": ((0, 2), (1, 3)), "os.link": ((0, 2), (1, 3)),
        "os.setxattr": ((0, None),), "os.removexattr": ((0, None),), "os.chflags": ((0, None),),
        "os.lchflags": ((0, None),), "shutil.rmtree": ((0, 1),), "shutil.chown": ((0, None),),
        "sqlite3.connect": ((0, None),),
    }

    def absolute(path, dir_fd):
        if type(path) is not str and type(path) is not bytes:
            path = fspath(path)
        if type(path) is bytes:
            path = path.decode("utf-8", "surrogateescape")
        if not path.startswith("/"):
            if dir_fd is None or dir_fd == -1 or dir_fd == -100:  # -100: AT_FDCWD
                base = getcwd()
            else:
                base = readlink("/proc/self/fd/%d" % dir_fd)
            path = base + "/" + path
        parts = []
        for part in path.split("/"):
            if part == "" or part == ".":
                continue
            if part == "..":
                if parts:
                    parts.pop()
                continue
            parts.append(part)
        return "/" + "/".join(parts)

    def inside(path):
        return path == root or path.startswith(root + "/")

    def refuse_outside(path, dir_fd, what):
        if type(path) is int:
            # an open file descriptor: chmod/chown/utime work even on one opened read-only
            if what != "os.truncate":
                raise PermissionError("%s on a file descriptor is disabled in the sandbox" % what)
            return
        if what == "sqlite3.connect" and (path == ":memory:" or path == "" or path == b":memory:"):
            return
        target = absolute(path, dir_fd)
        if not inside(target):
            raise PermissionError("writing outside the sandbox directory is disabled: %r" % target)

    def hook(event, args):
        message = exact.get(event)
        if message is not None:
            raise PermissionError(message)
        if event == "open":
            path, mode, flags = args
            if type(path) is int:
                return
            writing = (type(mode) is str and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)) or (
                type(flags) is int and flags & write_flags
            )
            target = absolute(path, None)
            if inside(target):
                return
            if writing:
                if target == "/dev/null":
                    return
                raise PermissionError("writing outside the sandbox directory is disabled: %r" % target)
            # a directory fd would let os.open(name, dir_fd=fd) write outside, and the open event does not
            # carry dir_fd
            try:
                is_dir = isdir(stat(target).st_mode)
            except OSError:
                return
            if is_dir and mode is None:
                raise PermissionError("opening directories outside the sandbox directory is disabled")
            return
        if event == "socket.__new__":
            if args[1] != 1:  # AF_UNIX only: asyncio's event loop needs a socket pair
                raise PermissionError(network)
            return
        if event.startswith("ctypes."):
            raise PermissionError("ctypes is disabled in the sandbox")
        if event == "import" and args[0] == "_posixsubprocess":
            raise PermissionError(process)
        if event == "os.kill":
            if args[0] != pid and args[0] != 0:
                raise PermissionError("sending signals to other processes is disabled in the sandbox")
            return
        if event == "os.killpg":
            if args[0] != pgid:
                raise PermissionError("sending signals to other processes is disabled in the sandbox")
            return
        positions = writes.get(event)
        if positions is not None:
            for path_at, fd_at in positions:
                dir_fd = args[fd_at] if fd_at is not None and fd_at < len(args) else None
                refuse_outside(args[path_at], dir_fd, event)

    return hook


_code = _sandbox()
del _sandbox, _make_hook
import linecache, traceback
linecache.cache["<code>"] = (len(_code), None, _code.splitlines(True), "<code>")  # source lines in tracebacks
_main = types.ModuleType("__main__")
_main.__builtins__ = builtins
sys.modules["__main__"] = _main
try:
    exec(compile(_code, "<code>", "exec"), _main.__dict__)
except SystemExit:
    raise
except BaseException as _error:
    # the traceback as the code alone would print it: without the frames of this file and its audit hook
    _top = traceback.TracebackException(type(_error), _error, _error.__traceback__, compact=True)
    _report, _seen = _top, set()
    while _report is not None and id(_report) not in _seen:
        _seen.add(id(_report))
        _report.stack = traceback.StackSummary.from_list([f for f in _report.stack if f.filename != "<string>"])
        _report = _report.__cause__ or _report.__context__
    sys.stderr.write("".join(_top.format()))
    sys.exit(1)
"""


class PythonTool(BaseTool):
    """``python(code)``: run a Python program in a limited subprocess and return its output."""

    default_tool_schema = PYTHON_SCHEMA

    def __init__(
        self, config: dict[str, Any] | None = None, tool_schema: OpenAIFunctionToolSchema | None = None
    ) -> None:
        config = dict(config or {})
        unknown = set(config) - set(DEFAULTS) - {"type", "max_concurrency", "isolation"}
        if unknown:
            raise ValueError(
                f"unknown config keys {sorted(unknown)}; "
                f"known: {', '.join([*DEFAULTS, 'isolation', 'max_concurrency'])}"
            )
        mode = config.get("isolation", "bwrap")
        if mode not in ISOLATION_CHOICES:
            raise ValueError(f"config isolation must be one of {', '.join(ISOLATION_CHOICES)}, got {mode!r}")
        for key in [*DEFAULTS, "max_concurrency"]:
            value = config.get(key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
            ):
                raise ValueError(f"config {key} must be a positive number, got {value!r}")
        super().__init__(config, tool_schema or OpenAIFunctionToolSchema.from_dict(PYTHON_SCHEMA))
        self.cpu_time_s = int(max(1, round(config.get("cpu_time_s", DEFAULTS["cpu_time_s"]))))
        self.wall_time_s = float(config.get("wall_time_s", DEFAULTS["wall_time_s"]))
        self.memory_mb = int(config.get("memory_mb", DEFAULTS["memory_mb"]))
        self.max_output_chars = int(config.get("max_output_chars", DEFAULTS["max_output_chars"]))
        self.file_size_mb = float(config.get("file_size_mb", DEFAULTS["file_size_mb"]))
        self.disk_mb = float(config.get("disk_mb", DEFAULTS["disk_mb"]))
        self.max_concurrency = int(config.get("max_concurrency") or os.cpu_count() or 4)
        self.sandbox = _isolation(mode)
        # a Semaphore belongs to one event loop; tests and callers may use several in turn
        self._semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        code = string_argument(parameters, "code", "the Python source to run")
        loop = asyncio.get_running_loop()
        semaphore = self._semaphores.setdefault(loop, asyncio.Semaphore(self.max_concurrency))
        async with semaphore:
            try:
                output, exit_code, wall_s, timed_out = await self._run(code)
            except OSError as error:  # the machine is out of processes, memory or file descriptors
                raise ToolError(f"could not start the sandbox: {error}") from error
        metrics = {"exit_code": exit_code, "wall_s": round(wall_s, 3), "timed_out": timed_out}
        if timed_out:
            raise ToolError(self._failure(f"timed out after {self.wall_time_s:g} s", output))
        if exit_code != 0:
            raise ToolError(self._failure(self._describe_exit(exit_code), output))
        text = self._truncate(output)
        return ToolResponse(text if text.strip() else "(no output)"), 0.0, metrics

    async def _run(self, code: str) -> tuple[_Output, int, float, bool]:
        """Run ``code`` once: its output, exit code (negative: killed by that signal), wall seconds and
        whether the wall-clock limit killed it."""
        # isolated: a tmpfs inside the sandbox; unisolated: a fresh directory of the host's, removed after
        root = (
            isolation.SANDBOX_DIR
            if self.sandbox
            else os.path.realpath(tempfile.mkdtemp(prefix="verl_python_"))
        )
        limits = {
            "root": root,
            "isolated": self.sandbox is not None,
            "cpu": self.cpu_time_s,
            "memory": self.memory_mb * 2**20,
            "fsize": int(self.file_size_mb * 2**20),
        }
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": root,
            "TMPDIR": root,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            # one thread per BLAS/OpenMP pool: fewer processes and far less address space under RLIMIT_AS
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        # keep the head for the answer and the tail for the error message
        output = _Output(head_chars=self.max_output_chars, tail_chars=self.max_output_chars)
        start = time.monotonic()
        proc = reader = waiter = None
        timed_out = False
        argv = [sys.executable, "-I", "-B", "-c", _BOOTSTRAP, json.dumps(limits)]
        seccomp_fd = None
        try:
            if self.sandbox is not None:
                argv, seccomp_fd = self.sandbox.command(argv, env, int(self.disk_mb * 2**20))
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    cwd=None if self.sandbox else root,
                    env=env,
                    start_new_session=True,
                    pass_fds=() if seccomp_fd is None else (seccomp_fd,),
                )
            finally:
                if seccomp_fd is not None:
                    os.close(seccomp_fd)
            reader = asyncio.ensure_future(output.read_from(proc.stdout))
            try:
                await asyncio.wait_for(_feed_and_wait(proc, code, reader), timeout=self.wall_time_s)
            except asyncio.TimeoutError:
                timed_out = True
            _killpg(proc.pid)
            # the pipe closes once every process holding it is dead; one that left the group could hold it
            waiter = asyncio.ensure_future(proc.wait())
            await asyncio.wait([reader, waiter], timeout=_KILL_GRACE_S)
        finally:
            if proc is not None:
                _killpg(proc.pid)  # also on cancellation, and for any child the code left behind
            for task in (reader, waiter):
                if task is not None and not task.done():
                    task.cancel()
            if self.sandbox is None:
                _rmtree(root)
        exit_code = proc.returncode if proc.returncode is not None else -signal.SIGKILL
        if self.sandbox is not None and 128 < exit_code < 128 + signal.NSIG:
            exit_code = 128 - exit_code  # bwrap reports a child killed by signal N as exit code 128 + N
        return output, exit_code, time.monotonic() - start, timed_out

    def _describe_exit(self, exit_code: int) -> str:
        if exit_code == -signal.SIGXCPU:
            return f"CPU time limit exceeded ({self.cpu_time_s} s)"
        if exit_code == -signal.SIGKILL:  # the hard CPU limit, a second after SIGXCPU, or the OOM killer
            return f"killed (SIGKILL): CPU time limit ({self.cpu_time_s} s) or out of memory"
        if exit_code < 0:
            try:
                return f"killed by signal {signal.Signals(-exit_code).name}"
            except ValueError:
                return f"killed by signal {-exit_code}"
        return f"exit code {exit_code}"

    def _failure(self, reason: str, output: _Output) -> str:
        text = output.tail_text()
        if not text.strip():
            return reason
        if output.total_chars > len(text):  # the tail of a longer output: start it at a line
            text = "..." + text[text.find("\n") + 1 :] if "\n" in text[:-1] else "..." + text
        return f"{reason}:\n{text.rstrip()}"

    def _truncate(self, output: _Output) -> str:
        text = output.head_text()
        if output.total_chars > len(text):
            text += f"\n...[truncated {output.total_chars - len(text)} chars]"
        return text


def _isolation(mode: str) -> isolation.Bubblewrap | None:
    """The host's isolation (checked once per process), or None for ``isolation: none``; a host that cannot
    isolate is refused at start-up with the reason and the fix."""
    if mode == "none":
        logger.warning(
            "python tool: isolation: none runs the model's code WITHOUT OS isolation, as %s: only resource "
            "limits and an audit hook stand between it and this machine (not a security boundary)",
            "root" if os.geteuid() == 0 else "this user",
        )
        return None
    try:
        return isolation.require()
    except isolation.IsolationUnavailable as error:
        raise ValueError(
            f"the python tool runs the model's code only in an OS sandbox, and this host has none: {error}. "
            "To run it without isolation anyway (trusted code only), set isolation: none in the tool's config"
        ) from None


class _Output:
    """A child's output read to the end while keeping only its first and last characters."""

    def __init__(self, head_chars: int, tail_chars: int) -> None:
        self.head_chars = head_chars
        self.tail_chars = tail_chars
        self.total_chars = 0
        self._head: list[str] = []
        self._head_len = 0
        self._tail = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    async def read_from(self, stream: asyncio.StreamReader) -> None:
        while True:
            chunk = await stream.read(_READ_CHUNK)
            if not chunk:
                self._add(self._decoder.decode(b"", final=True))
                return
            self._add(self._decoder.decode(chunk))

    def _add(self, text: str) -> None:
        if not text:
            return
        self.total_chars += len(text)
        if self._head_len < self.head_chars:
            piece = text[: self.head_chars - self._head_len]
            self._head.append(piece)
            self._head_len += len(piece)
        self._tail = (self._tail + text)[-self.tail_chars :]

    def head_text(self) -> str:
        return "".join(self._head)

    def tail_text(self) -> str:
        return self._tail


async def _feed_and_wait(proc: asyncio.subprocess.Process, code: str, reader: asyncio.Future) -> None:
    """Send the code and return when the process has exited."""
    try:
        proc.stdin.write(code.encode("utf-8", "replace"))
        await proc.stdin.drain()
    except (BrokenPipeError, ConnectionResetError):  # it died before reading all of it
        pass
    finally:
        proc.stdin.close()
    # proc.wait() also waits for the output pipe to close, which a process the code left behind can hold open
    while proc.returncode is None:
        if reader.done():
            await proc.wait()
        else:
            await asyncio.wait([reader], timeout=0.05)


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _rmtree(path: str) -> None:
    """Remove the call's directory even where the code took away its own permissions."""

    def allow_and_retry(function: Any, failed: str, _: Any) -> None:
        try:
            os.chmod(os.path.dirname(failed), stat.S_IRWXU)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, stat.S_IRWXU)
            function(failed)
        except OSError:
            pass

    shutil.rmtree(path, onerror=allow_and_retry)
