"""Per-call time limits for reward functions (``reward_model.timeout_s``).

A rule-based scorer can hang: a regex with catastrophic backtracking, a sympy simplification that
never ends, a sandbox that never answers. The caller waits at most ``timeout_s`` per call, counted
from the call's own start.

Why a thread and not a process: a process pool could kill a hung call, but it needs the scoring
function to pickle by name in a fresh interpreter (a custom function loaded from a file with
``custom_reward_function.path`` does not), forking a process that runs torch and controller threads
is unsafe, and spawning one costs seconds. A thread runs any callable for microseconds of overhead.
The price: Python cannot kill a thread. A call that times out keeps running on its thread, which is
abandoned (a daemon thread, so it never blocks the interpreter's exit) and replaced by a fresh one.
A function stuck in a busy loop therefore keeps a core busy; after ``max_abandoned`` hung threads
the caller refuses to go on, because by then the function is broken rather than unlucky.

A batch of calls (one per sample) is handed to the thread at once (:meth:`TimeLimit.map`): the thread
runs them back to back and the caller wakes when all are done or when the running call reaches its
deadline, so a batch of fast calls costs one thread hand-off, not one per sample.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from verl.utils.threads import drive_on_one_openmp_thread

logger = logging.getLogger(__name__)

T = TypeVar("T")

_STOP = None

DEFAULT_TIMEOUT_S = 60.0
"""The default of ``reward_model.timeout_s`` (the schema spells the same number; a test checks they agree)."""

TIMEOUT_HINT = (
    "if it is slow rather than stuck, raise reward_model.timeout_s=<seconds> (null = no limit; the default is "
    f"{DEFAULT_TIMEOUT_S:g})"
)
"""How to give a slow reward function more time, appended to every timeout error."""

Outcome = tuple[bool, Any]
"""``(True, value)`` of a call that returned, ``(False, exception)`` of one that raised or timed out."""


class CallTimeout(TimeoutError):
    """A call did not return within the time limit (its thread was abandoned)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"did not return within reward_model.timeout_s={timeout_s:g} s")
        self.timeout_s = timeout_s
        self.hint = TIMEOUT_HINT

    def __reduce__(self):
        return (type(self), (self.timeout_s,))


class TimeLimitExhausted(RuntimeError):
    """Too many calls hung: no more are started (their threads cannot be stopped)."""


class _Run:
    """Calls handed to the helper thread at once, run in order. ``started`` is when the running call began
    (None between calls); the caller sets ``cancelled`` when that call is past its deadline, and the
    thread then records nothing more and runs no further call."""

    def __init__(self, calls: Sequence[Callable[[], Any]], stop_on_error: bool) -> None:
        self.calls = calls
        self.stop_on_error = stop_on_error
        self.outcomes: list[Outcome] = []
        self.started: float | None = None
        self.cancelled = False
        self.lock = threading.Lock()
        self.done = threading.Event()

    def execute(self) -> None:
        """On the helper thread. BaseException is kept too, so that whatever a function raises reaches
        the caller instead of silently ending the thread."""
        try:
            for fn in self.calls:
                with self.lock:
                    if self.cancelled:
                        return
                    self.started = time.monotonic()
                try:
                    outcome: Outcome = (True, fn())
                except BaseException as exc:
                    outcome = (False, exc)
                with self.lock:
                    if self.cancelled:  # the caller gave up on this call: it is reported as timed out
                        return
                    self.outcomes.append(outcome)
                    self.started = None
                if self.stop_on_error and not outcome[0]:
                    return
        finally:
            self.done.set()


def _serve(jobs: queue.SimpleQueue) -> None:
    """The helper thread: run batches of calls until told to stop."""
    drive_on_one_openmp_thread()  # reward functions are light: no OpenMP team to slow the workers' threads
    while True:
        run = jobs.get()
        if run is _STOP:
            return
        run.execute()


class TimeLimit:
    """Run calls on one daemon helper thread and wait at most ``timeout_s`` seconds for each.

    One caller at a time (a reward manager scores its batch sequentially). The thread starts at the
    first call and is not pickled, so an object holding a ``TimeLimit`` still travels to a Ray worker.
    """

    def __init__(self, timeout_s: float, max_abandoned: int = 32) -> None:
        if not timeout_s > 0:
            raise ValueError(f"reward_model.timeout_s must be > 0 seconds; got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.max_abandoned = max_abandoned
        self.abandoned = 0
        """threads left running a call that timed out"""
        self._jobs: queue.SimpleQueue | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {
            "timeout_s": self.timeout_s,
            "max_abandoned": self.max_abandoned,
            "abandoned": 0,
            "_jobs": None,
        }

    def _start(self) -> queue.SimpleQueue:
        jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=_serve, args=(jobs,), name="reward-time-limit", daemon=True).start()
        weakref.finalize(
            self, jobs.put, _STOP
        )  # the thread ends with its TimeLimit (e.g. its reward manager)
        self._jobs = jobs
        return jobs

    def __call__(self, fn: Callable[[], T]) -> T:
        """``fn()``, or :class:`CallTimeout` when it runs past the limit; its own exceptions pass through."""
        ok, value = self.map([fn], stop_on_error=True)[0]
        if not ok:
            raise value
        return value

    def map(self, calls: Sequence[Callable[[], Any]], *, stop_on_error: bool = False) -> list[Outcome]:
        """Run ``calls`` in order, each within ``timeout_s`` of its own start; one :data:`Outcome` per call.

        A call past its deadline gets ``(False, CallTimeout)``, its thread is abandoned and the calls after
        it run on a fresh one. With ``stop_on_error`` the list ends at the first call that raised or timed
        out (the later calls are not run). :class:`TimeLimitExhausted` when too many threads hang.
        """
        outcomes: list[Outcome] = []
        remaining = list(calls)
        while remaining:
            if self.abandoned >= self.max_abandoned:
                raise TimeLimitExhausted(
                    f"{self.abandoned} reward calls are still running past reward_model.timeout_s="
                    f"{self.timeout_s:g}; their threads cannot be stopped, so no more calls are started. "
                    "Fix the hanging reward function (or raise reward_model.timeout_s)."
                )
            jobs = self._jobs or self._start()
            run = _Run(remaining, stop_on_error)
            jobs.put(run)
            finished, timed_out = self._wait(run)
            outcomes.extend(finished)
            if not timed_out:
                return outcomes
            self._abandon(jobs)
            outcomes.append((False, CallTimeout(self.timeout_s)))
            if stop_on_error:
                return outcomes
            remaining = remaining[len(finished) + 1 :]
        return outcomes

    def _wait(self, run: _Run) -> tuple[list[Outcome], bool]:
        """Wait until the run is done or its running call is past the deadline: (outcomes, timed out)."""
        while not run.done.is_set():
            with run.lock:
                started = run.started
                now = time.monotonic()
                if started is not None and now - started >= self.timeout_s:
                    run.cancelled = True
                    return list(run.outcomes), True
            run.done.wait(self.timeout_s if started is None else started + self.timeout_s - now)
        return list(run.outcomes), False

    def _abandon(self, jobs: queue.SimpleQueue) -> None:
        jobs.put(_STOP)  # if the hung call ever returns, its thread then exits
        self._jobs = None
        self.abandoned += 1
        logger.warning(
            "a reward call exceeded reward_model.timeout_s=%g s; its thread is abandoned (%d so far)",
            self.timeout_s,
            self.abandoned,
        )
