"""Per-call time limits for reward functions (``reward_model.timeout_s``).

A rule-based scorer can hang: a regex with catastrophic backtracking, a sympy simplification that
never ends, a sandbox that never answers. The caller waits at most ``timeout_s`` per call.

Why a thread and not a process: a process pool could kill a hung call, but it needs the scoring
function to pickle by name in a fresh interpreter (a custom function loaded from a file with
``custom_reward_function.path`` does not), forking a process that runs torch and controller threads
is unsafe, and spawning one costs seconds. A thread runs any callable for microseconds of overhead.
The price: Python cannot kill a thread. A call that times out keeps running on its thread, which is
abandoned (a daemon thread, so it never blocks the interpreter's exit) and replaced by a fresh one.
A function stuck in a busy loop therefore keeps a core busy; after ``max_abandoned`` hung threads
the caller refuses to go on, because by then the function is broken rather than unlucky.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

_STOP = None


class CallTimeout(TimeoutError):
    """A call did not return within the time limit (its thread was abandoned)."""


class TimeLimitExhausted(RuntimeError):
    """Too many calls hung: no more are started (their threads cannot be stopped)."""


def _serve(jobs: queue.SimpleQueue) -> None:
    """The helper thread: run jobs until told to stop. BaseException is kept too, so that whatever the
    function raises reaches the caller instead of silently ending the thread."""
    while True:
        job = jobs.get()
        if job is _STOP:
            return
        fn, box, done = job
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc
        finally:
            done.set()


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
        self._jobs = jobs
        return jobs

    def __call__(self, fn: Callable[[], T]) -> T:
        """``fn()``, or :class:`CallTimeout` when it runs past the limit; its own exceptions pass through."""
        if self.abandoned >= self.max_abandoned:
            raise TimeLimitExhausted(
                f"{self.abandoned} reward calls are still running past reward_model.timeout_s="
                f"{self.timeout_s:g}; their threads cannot be stopped, so no more calls are started. "
                "Fix the hanging reward function (or raise the timeout)."
            )
        jobs = self._jobs or self._start()
        box: dict[str, Any] = {}
        done = threading.Event()
        jobs.put((fn, box, done))
        if not done.wait(self.timeout_s):
            self._abandon(jobs)
            raise CallTimeout(f"did not return within reward_model.timeout_s={self.timeout_s:g} s")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def _abandon(self, jobs: queue.SimpleQueue) -> None:
        jobs.put(_STOP)  # if the hung call ever returns, its thread then exits
        self._jobs = None
        self.abandoned += 1
        logger.warning(
            "a reward call exceeded reward_model.timeout_s=%g s; its thread is abandoned (%d so far)",
            self.timeout_s,
            self.abandoned,
        )
