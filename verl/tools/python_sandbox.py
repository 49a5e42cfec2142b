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

The bootstrap and its audit hook are in :mod:`verl.tools.sandbox_bootstrap`, the output capture in
:mod:`verl.tools.sandbox_output`, and the process helpers in :mod:`verl.tools.sandbox_process`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import tempfile
import time
import weakref
from typing import Any

from verl.tools import isolation
from verl.tools.base import BaseTool, OpenAIFunctionToolSchema, ToolError, ToolResponse, string_argument
from verl.tools.sandbox_bootstrap import _BOOTSTRAP
from verl.tools.sandbox_output import _Output
from verl.tools.sandbox_process import _feed_and_wait, _killpg, _rmtree

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

_KILL_GRACE_S = 5.0
"""how long to wait for the process and its output pipe to close after SIGKILL"""


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
