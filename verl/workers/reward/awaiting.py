"""``async def`` reward functions: awaited together for a whole batch, each under ``reward_model.timeout_s``.

verl's reward loop awaits one coroutine per sample, all at once, and recommends ``async def`` for a scorer that
calls a service (a generative reward model, a judge behind an API): the calls overlap instead of queueing, and
a reward-model server batches the requests that arrive together. Here too: :func:`run_to_completion` makes
such a function callable like any other (one sample, its own event loop) and marks it, and a manager scoring a
batch asks :func:`coroutine_function` for the coroutine function behind it, then :func:`await_all` runs every
sample's call on one event loop.

The time limit: each call is awaited at most ``timeout_s`` seconds, then cancelled, so a slow request ends at its
deadline and the sample gets :class:`~verl.workers.reward.timeout.CallTimeout`, as a plain function's call
does. A coroutine that blocks its thread (a synchronous HTTP call inside ``async def``) stalls the whole loop,
which no deadline on the loop can interrupt: the loop runs on a daemon thread, and the caller stops waiting once
``timeout_s`` plus a grace period has passed without every call finished, reporting the unfinished ones as
timed out and abandoning the thread (Python cannot kill a thread; see :mod:`verl.workers.reward.timeout`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from functools import partial, wraps
from typing import Any

from verl.workers.reward.timeout import CallTimeout, Outcome

logger = logging.getLogger(__name__)

COROUTINE_ATTR = "__verl_coroutine_function__"
"""set on the plain-callable form of an ``async def`` reward function: the coroutine function itself"""

MAX_IN_FLIGHT = 512
"""calls awaited at the same time at most: each holds a connection (a file descriptor) while it waits, and a
process may open about a thousand; a reward-model server batches what arrives together either way"""

GRACE_S = 5.0
"""how long past ``timeout_s`` the caller still waits for an event loop that every call's deadline should
have ended (a loop stalled by blocking code does not get there)"""


def run_to_completion(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    """An ``async def`` scoring function as a plain one: each call runs the coroutine to its end on an event loop
    of its own, on whichever thread calls it. Marked, so that a batch is awaited together instead."""

    @wraps(fn)
    def scored(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(fn(*args, **kwargs))

    setattr(scored, COROUTINE_ATTR, fn)
    return scored


def coroutine_function(fn: Any) -> Callable[..., Awaitable[Any]] | None:
    """The coroutine function behind ``fn`` (a function :func:`run_to_completion` made, or a ``functools.partial``
    of one, its bound arguments kept), or None when ``fn`` is a plain function."""
    if isinstance(fn, partial):
        inner = coroutine_function(fn.func)
        return None if inner is None else partial(inner, *fn.args, **fn.keywords)
    return getattr(fn, COROUTINE_ATTR, None)


def await_all(calls: Sequence[Callable[[], Awaitable[Any]]], timeout_s: float | None) -> list[Outcome]:
    """The outcome of every call, in order, awaited together on one event loop (its own thread; at most
    :data:`MAX_IN_FLIGHT` at a time): ``(True, value)``, ``(False, exception)``, or ``(False, CallTimeout)`` for a
    call past ``timeout_s`` (None: no limit)."""
    outcomes: list[Outcome | None] = [None] * len(calls)

    async def one(index: int, call: Callable[[], Awaitable[Any]], slots: asyncio.Semaphore) -> None:
        async with slots:  # the deadline counts from the call's own start, as a plain function's does
            await awaited(index, call)

    async def awaited(index: int, call: Callable[[], Awaitable[Any]]) -> None:
        try:
            task = asyncio.ensure_future(call())
        except Exception as exc:  # calling it raised before any coroutine existed (a wrong argument)
            outcomes[index] = (False, exc)
            return
        finished, _ = await asyncio.wait({task}, timeout=timeout_s)
        if not finished:  # past the deadline (the call's own TimeoutError is its exception, below)
            task.cancel()
            outcomes[index] = (False, CallTimeout(float(timeout_s or 0.0)))
        elif task.cancelled():
            outcomes[index] = (False, RuntimeError("the call was cancelled (by its own code)"))
        elif task.exception() is not None:
            outcomes[index] = (False, task.exception())
        else:
            outcomes[index] = (True, task.result())

    async def every() -> None:
        slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        await asyncio.gather(*(one(i, call, slots) for i, call in enumerate(calls)))

    done = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(every())
        except BaseException as exc:  # the loop itself failed (not a call): the caller raises it
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="reward-await", daemon=True).start()
    rounds = -(-len(calls) // MAX_IN_FLIGHT)  # calls beyond MAX_IN_FLIGHT wait for a slot
    if not done.wait(None if timeout_s is None else rounds * timeout_s + GRACE_S):
        logger.warning(
            "async reward calls still running %.0f s past their deadlines (reward_model.timeout_s=%g): a coroutine "
            "is blocking the event loop (a synchronous call inside async def?); its thread is abandoned",
            GRACE_S,
            timeout_s,
        )
    if failure:
        raise failure[0]
    return [o if o is not None else (False, CallTimeout(timeout_s or 0.0)) for o in outcomes]
