"""The stop signals of the ``verl`` command (:mod:`verl.cli`): Ctrl-C and SIGTERM as exceptions in the main
thread, and those that arrive while the command is still starting."""

from __future__ import annotations

import os
import signal
import sys

from verl.utils import stopping


class Terminated(BaseException):
    """SIGTERM, turned into an exception so the run unwinds like Ctrl-C: the run directory's lock is
    released, workers are stopped, and a checkpoint being written is either whole or left unfinished
    (and removed by the next run)."""


def _on_sigterm(signum: int, frame: object) -> None:
    """Raise :class:`Terminated`; ``received`` stays set, so should a library catch and drop the exception (a
    bare ``except:``, a finalizer that was running), the next step raises it again (``Tracking.log``)."""
    _on_sigterm.received = True  # type: ignore[attr-defined]
    stopping.arm(signum)
    raise Terminated()


_deferred: list[int] = []
"""stop signals that arrived while the ``verl`` command was starting (`verl.cli.entry`), raised by `verl.cli.main`"""


def _defer_signal(signum: int, frame: object) -> None:
    if signum == signal.SIGINT and signal.SIGINT in _deferred:  # a second Ctrl-C: leave at once
        os._exit(130)
    _deferred.append(signum)
    stopping.arm(signum)


def _on_sigint(signum: int, frame: object) -> None:
    """First Ctrl-C: unwind (KeyboardInterrupt: the lock is released, workers stop). A second one while
    that cleanup runs: leave at once (the OS drops the lock; checkpoints are whole or unfinished)."""
    if getattr(_on_sigint, "pressed", False):
        print("\ninterrupted again: exiting now", file=sys.stderr)
        os._exit(130)
    _on_sigint.pressed = True  # type: ignore[attr-defined]
    stopping.arm(signum)
    raise KeyboardInterrupt
