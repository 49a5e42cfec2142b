"""Running a tool's coroutines (``create``, ``execute``, ``calc_reward``, ``release``) so that no tool can stop
a rollout: a tool that never returns, blocks, exits or raises ends as an error message to the model.

- **A time limit per call** (``actor_rollout_ref.rollout.multi_turn.tool_call_timeout_s``, 60 s by default,
  null for none): past it the call is cancelled and :class:`ToolTimeout` is raised to the agent loop.
- **A thread of their own.** Tools run on an event loop in a daemon thread (:class:`ToolThread`), not on the
  rollout's. A tool that blocks (``time.sleep`` or a busy loop inside ``async def execute``) cannot be
  interrupted by ``asyncio`` on any loop, but on this one it blocks only the tool thread: the rollout's loop
  still sees the deadline pass, and when a cancelled call has not ended :data:`CANCEL_GRACE_S` later the
  thread is left behind (a daemon: it never keeps the process from exiting). Until it frees itself, later
  calls of that tool fail at once with :class:`ToolBlocked` (a tool that blocks for ever is not given a new
  thread to block at every call); then they run on a fresh thread. Each tool has its own thread, so a tool
  that blocks holds up no other tool.
- **Whatever a tool raises is its error**, ``SystemExit`` (``sys.exit()`` in a tool) and ``KeyboardInterrupt``
  (raised by its own code) included: the agent loop reports it as :class:`ToolFailed`. Python runs signal
  handlers in the main thread only, and tools never run there, so a real Ctrl-C or SIGTERM (``verl.cli``
  raises ``KeyboardInterrupt`` / ``Terminated`` from its handlers) always lands in the rollout's code and ends
  the run; a ``KeyboardInterrupt`` seen in the tool thread can only be the tool's own.
- **Cancellation reaches the tool.** When a call times out, or the rollout is cancelled (``asyncio.run``
  cancels every loop when an interruption reaches it), the tool's coroutine gets ``CancelledError`` in its
  thread (a subprocess tool kills its process there), and the caller waits up to :data:`CANCEL_GRACE_S` for
  it to end. The rollout's own loop usually runs in a worker thread, which a Ctrl-C or SIGTERM does not reach
  (it lands in the main thread); so a pending call also watches for the run being stopped
  (:func:`run_stopping`: ``verl.utils.stopping`` armed by the signal) and then cancels the tool's call and
  raises :class:`RunStopping`, which ends the rollout at once; no new call starts after that. At exit,
  :func:`cancel_all` cancels whatever is still in flight, so no tool's child process outlives the run.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger(__name__)

TIMEOUT_KEY = "actor_rollout_ref.rollout.multi_turn.tool_call_timeout_s"
DEFAULT_TIMEOUT_S = 60.0
CANCEL_GRACE_S = 5.0
"""how long a cancelled call may take to end (a subprocess tool kills and reaps its process)"""
_POLL_S = 0.25
"""how often a pending call looks whether the run is being stopped"""


class RunStopping(Exception):
    """The run is being stopped (Ctrl-C, SIGTERM): the tool call was cancelled, and the rollout ends. Not a tool
    error: the agent loop lets it through."""


def run_stopping() -> bool:
    """Whether this process is a run that got a stop signal (``verl.utils.stopping.armed()``; read from the
    module only if the ``verl`` command loaded it, so a test or a notebook is never taken for one)."""
    stopping = sys.modules.get("verl.utils.stopping")
    armed = getattr(stopping, "armed", None)
    try:
        return bool(armed()) if callable(armed) else False
    except Exception:  # an interface that changed: the exit handler still cancels the calls
        return False


class ToolTimeout(Exception):
    """A tool call that ran past its time limit (and was cancelled)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the tool call timed out after {format_seconds(seconds)} s")
        self.seconds = seconds


class ToolBlocked(Exception):
    """A call refused because an earlier call of the tool still blocks its thread."""


class ToolFailed(Exception):
    """A tool raised something that is not an ``Exception`` (``SystemExit``, ``KeyboardInterrupt``, another
    ``BaseException``): reported like any other tool error, never propagated."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(describe_base_exception(error))
        self.error = error


def describe_base_exception(error: BaseException) -> str:
    if isinstance(error, SystemExit):
        return f"the tool called sys.exit({error.code!r})"
    text = str(error)
    return f"the tool raised {type(error).__name__}" + (f": {text}" if text else "")


def format_seconds(seconds: float) -> str:
    return f"{seconds:g}"


def check_timeout(value: Any) -> float | None:
    """``tool_call_timeout_s`` as seconds (None: no limit); a ValueError naming the key for anything else."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(
            f"{TIMEOUT_KEY} must be a number of seconds > 0, or null for no limit; got {value!r}"
        )
    return float(value)


class ToolThread:
    """An event loop in a daemon thread, on which tool calls run (see the module docstring). Started at the
    first call; replaced when a cancelled call does not end (the tool blocks its thread)."""

    def __init__(self, name: str = "verl-tools") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._freed: threading.Event | None = None
        """set when the thread last abandoned runs again (the blocking call returned)"""
        self.abandoned = 0
        """threads left behind because a tool blocked them"""
        self._in_flight: set[_Call] = set()
        _THREADS.add(self)

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                self._loop = _start_loop_thread(f"{self.name}-{self.abandoned}")
                weakref.finalize(self, _stop_loop, self._loop)
            return self._loop

    def abandon(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Leave ``loop`` (blocked by a tool) to its thread, which ends once it is free again; calls are
        refused until then (:meth:`check_free`), and the next one after starts a fresh thread. False when
        ``loop`` was left already (by another of the calls it blocked)."""
        with self._lock:
            if self._loop is not loop:
                return False
            self._loop = None
            self.abandoned += 1
            self._freed = threading.Event()
            loop.call_soon_threadsafe(self._freed.set)
            loop.call_soon_threadsafe(loop.stop)
            return True

    def check_free(self, what: str) -> None:
        """Raise :class:`ToolBlocked` while an abandoned call of this tool still blocks its thread."""
        with self._lock:
            if self._freed is None or self._freed.is_set():
                self._freed = None
                return
        raise ToolBlocked(
            f"{what} is unavailable: an earlier call still blocks it (it did not stop when cancelled)"
        )

    async def call(self, make: Callable[[], Awaitable[Any]], timeout: float | None, what: str) -> Any:
        """``await make()`` on the tool thread within ``timeout`` seconds (None: no limit). Raises
        :class:`ToolTimeout`, :class:`ToolFailed`, or the ``Exception`` the tool raised; cancelling this
        coroutine cancels the tool's. :class:`ToolBlocked` while an earlier call still blocks the tool."""
        if run_stopping():
            raise RunStopping(f"the run is stopping: {what} was not started")
        self.check_free(what)
        loop = self.loop()
        call = _Call(make, asyncio.get_running_loop(), loop)
        with self._lock:
            self._in_flight.add(call)
        try:
            loop.call_soon_threadsafe(call.start)
            outcome = await self._wait(call, timeout)
        except asyncio.TimeoutError:
            await self._stop(call, loop, what)
            raise ToolTimeout(timeout) from None
        except RunStopping:
            await self._stop(call, loop, what)
            raise
        except asyncio.CancelledError:  # the rollout is cancelled: so is the tool's call
            await self._stop(call, loop, what)
            raise
        finally:
            with self._lock:
                self._in_flight.discard(call)
        kind, value = outcome
        if kind == "ok":
            return value
        if kind == "cancelled":  # by cancel_all: the process is stopping
            raise RunStopping(f"the run is stopping: {what} was cancelled")
        if isinstance(value, Exception):
            raise value
        raise ToolFailed(value)

    @staticmethod
    async def _wait(call: _Call, timeout: float | None) -> tuple[str, Any]:
        """The call's outcome; TimeoutError past ``timeout``, RunStopping as soon as the run is stopped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise asyncio.TimeoutError
            done, _ = await asyncio.wait(
                {call.result}, timeout=_POLL_S if left is None else min(_POLL_S, left)
            )
            if done:
                return call.result.result()
            if run_stopping():
                raise RunStopping("the run is stopping (Ctrl-C or SIGTERM): the tool call was cancelled")

    async def _stop(self, call: _Call, loop: asyncio.AbstractEventLoop, what: str) -> None:
        """Cancel the call in the tool thread and wait up to CANCEL_GRACE_S for it to end; a call that does
        not end blocks its thread, which is then abandoned. Cancelling this wait (the rollout is cancelled)
        leaves the rest to the tool thread and propagates."""
        try:
            loop.call_soon_threadsafe(call.cancel)
        except RuntimeError:  # its loop is closed: nothing runs there any more
            return
        deadline = time.monotonic() + CANCEL_GRACE_S
        while not call.ended.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if not call.ended.is_set() and self.abandon(loop):
            logger.warning(
                "%s did not end within %g s of being cancelled: it blocks its thread (time.sleep or a busy loop "
                "inside async code?); its thread is left behind, and its calls are refused until it is free",
                what,
                CANCEL_GRACE_S,
            )

    def in_flight(self) -> list[_Call]:
        with self._lock:
            return list(self._in_flight)


_THREADS: weakref.WeakSet[ToolThread] = weakref.WeakSet()
"""every ToolThread of the process, for :func:`cancel_all`"""


def cancel_all(grace_s: float | None = None) -> int:
    """Cancel every tool call in flight in this process and wait up to ``grace_s`` (CANCEL_GRACE_S) in all
    for them to end; returns how many there were. Registered to run at exit: an interrupted run ends without
    waiting for the worker thread its rollout runs in, and a call left running there would leave its child
    processes behind."""
    calls = [call for thread in list(_THREADS) for call in thread.in_flight() if not call.ended.is_set()]
    for call in calls:
        try:
            call.loop.call_soon_threadsafe(call.cancel)
        except RuntimeError:  # its loop is closed
            pass
    deadline = time.monotonic() + (CANCEL_GRACE_S if grace_s is None else grace_s)
    for call in calls:
        call.ended.wait(max(0.0, deadline - time.monotonic()))
    if calls:
        logger.info("cancelled %d tool call(s) still running", len(calls))
    return len(calls)


atexit.register(cancel_all)


class _Call:
    """One call's task on the tool loop and its outcome, handed back to the caller's loop."""

    def __init__(
        self,
        make: Callable[[], Awaitable[Any]],
        caller: asyncio.AbstractEventLoop,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.make = make
        self.caller = caller
        self.loop = loop
        """the tool loop it runs on"""
        self.result: asyncio.Future = caller.create_future()
        self.ended = threading.Event()
        self.task: asyncio.Task | None = None
        self.cancelled = False

    def start(self) -> None:
        if self.cancelled:  # cancelled before it started
            self.ended.set()
            self._hand_back(("cancelled", None))
            return
        self.task = self.loop.create_task(self._run())
        self.task.add_done_callback(self._done)

    def cancel(self) -> None:
        self.cancelled = True
        if self.task is not None:
            self.task.cancel()

    async def _run(self) -> tuple[str, Any]:
        try:
            return "ok", await self.make()
        except asyncio.CancelledError as error:
            if self.cancelled:  # by us: a timeout, a cancelled rollout, the run stopping
                raise
            return "error", error  # the tool's own code raised it: its error like any other
        except BaseException as error:  # SystemExit, KeyboardInterrupt of the tool's own code: its errors
            return "error", error

    def _done(self, task: asyncio.Task) -> None:
        self.ended.set()
        self._hand_back(("cancelled", None) if task.cancelled() else task.result())

    def _hand_back(self, outcome: tuple[str, Any]) -> None:
        try:
            self.caller.call_soon_threadsafe(_resolve, self.result, outcome)
        except RuntimeError:  # the caller's loop has closed: nobody waits for this outcome
            pass


def _resolve(future: asyncio.Future, outcome: tuple[str, Any]) -> None:
    if not future.done():
        future.set_result(outcome)


def _stop_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Let a tool thread end once its ToolThread is gone (a loop already closed needs nothing)."""
    try:
        loop.call_soon_threadsafe(loop.stop)
    except RuntimeError:
        pass


def _start_loop_thread(name: str) -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        loop.run_forever()

    threading.Thread(target=serve, name=name, daemon=True).start()
    ready.wait()
    return loop
