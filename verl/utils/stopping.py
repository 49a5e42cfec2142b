"""A run stops when asked, whatever it is waiting for.

Ctrl-C and SIGTERM become exceptions in the main thread (``verl.cli``), and the run unwinds: workers stop, the
trackers flush, the run directory's lock is released. That needs the main thread to get control back, and a
tool, a reward function or an engine call that never returns can keep it (or a thread the interpreter joins at
exit) waiting for ever. So the first signal also starts a deadline (:func:`arm`): when the unwinding has not
finished within :data:`GRACE_S`, the process leaves with the signal's exit code (130 for SIGINT, 143 for
SIGTERM). Leaving then is safe: checkpoints are written to a temporary directory and renamed when whole, so the
last whole checkpoint is intact and an unfinished one is removed by the next run; the lock is an ``flock`` the
OS drops with the process.

The deadline is armed from a watcher thread fed by :func:`signal.set_wakeup_fd`, so it starts even while the
main thread is inside a C call that does not return (Python runs signal handlers only between bytecodes of the
main thread); the Python-level handlers arm it too. Only a process that is the run arms it (:func:`enable`, from
the ``verl`` command's entry point): a test or a notebook calling ``verl.cli.main`` is not ended by it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

GRACE_S = float(os.environ.get("VERL_STOP_GRACE_S", "20"))
"""Seconds a run has to unwind after Ctrl-C or SIGTERM before it exits anyway (well inside the 30 s a
scheduler's SIGTERM-then-SIGKILL usually allows)."""

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}

_lock = threading.Lock()
_armed: list[int] = []
_enabled = False


def enable() -> None:
    """This process is the run: the first stop signal starts the deadline."""
    global _enabled
    _enabled = True
    _watch_signals()


def arm(signum: int) -> None:
    """Start the deadline for the first stop signal (later ones change nothing); a no-op unless enabled."""
    with _lock:
        if _armed or not _enabled:
            return
        _armed.append(signum)
    timer = threading.Thread(target=_expire, args=(signum,), name="verl-stop-deadline", daemon=True)
    timer.start()


def armed() -> bool:
    return bool(_armed)


def leave(code: int) -> None:
    """End an interrupted run now: the exit handlers run (Ray's shutdown, log flushes; still under the
    deadline), but no thread still stuck in a tool, reward function or engine call is waited for."""
    import atexit

    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def _expire(signum: int) -> None:
    threading.Event().wait(GRACE_S)
    code = EXIT_CODES.get(signal.Signals(signum), 128 + signum)
    name = signal.Signals(signum).name
    try:
        sys.stderr.write(
            f"\n{name}: the run did not finish stopping within {GRACE_S:g} s (a tool, a reward function or an "
            f"engine call is still running): exiting now with {code}; the last complete checkpoint (if any) is "
            "intact, rerun the same command to resume\n"
        )
        sys.stderr.flush()
        sys.stdout.flush()
    except Exception:  # a closed or broken stream must not keep the process alive
        pass
    os._exit(code)


_watching = False


def _watch_signals() -> None:
    """Arm the deadline from a watcher thread on the first SIGINT / SIGTERM, even when the main thread is stuck
    in C code (the wakeup fd carries signals that have a Python-level handler: verl.cli installs them). Keeps
    any wakeup fd another library set (asyncio's, for one)."""
    global _watching
    if _watching or threading.current_thread() is not threading.main_thread():
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    except ValueError:  # not the main thread of the main interpreter
        os.close(read_end)
        os.close(write_end)
        return
    if previous != -1:  # someone's already: give it back, the Python-level handlers arm the deadline anyway
        signal.set_wakeup_fd(previous)
        os.close(read_end)
        os.close(write_end)
        return
    _watching = True
    threading.Thread(target=_watch, args=(read_end,), name="verl-stop-watcher", daemon=True).start()


def _watch(read_end: int) -> None:
    while True:
        try:
            data = os.read(read_end, 64)
        except OSError:
            return
        if not data:
            return
        for signum in data:
            if signum in (signal.SIGINT, signal.SIGTERM):
                arm(signum)
