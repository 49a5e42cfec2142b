"""verl.utils.stopping: the deadline that ends a run after Ctrl-C / SIGTERM when its unwinding never finishes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from verl.utils import stopping

# A process that is the run (stopping.enable, verl's handlers) and user code that swallows every interrupt,
# as a library with a bare ``except:`` or a loop that retries on KeyboardInterrupt would.
SWALLOWS_INTERRUPTS = textwrap.dedent(
    """
    import signal, time
    from verl import cli
    from verl.utils import stopping
    stopping.enable()
    signal.signal(signal.SIGINT, cli._on_sigint)
    signal.signal(signal.SIGTERM, cli._on_sigterm)
    ready = False
    while True:
        try:  # "ready" is printed inside the try: the signal cannot land before the code that swallows it
            if not ready:
                ready = True
                print("ready", flush=True)
            time.sleep(100)
        except BaseException:
            pass
    """
)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_the_deadline_ends_a_run_whose_unwinding_never_finishes(sig, code):
    proc = subprocess.Popen(
        [sys.executable, "-c", SWALLOWS_INTERRUPTS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "VERL_STOP_GRACE_S": "2"},
    )
    assert proc.stdout.readline() == "ready\n"
    sent = time.monotonic()
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code
    assert 2 <= time.monotonic() - sent < 20
    assert f"{signal.Signals(sig).name}: the run did not finish stopping within 2 s" in stderr
    assert "the last complete checkpoint (if any) is intact" in stderr and "Traceback" not in stderr


def test_a_process_that_is_not_the_run_is_never_ended():
    # tests and notebooks call verl.cli.main in their own process: a signal there starts no deadline
    assert not stopping._enabled
    stopping.arm(signal.SIGINT)
    assert not stopping.armed()
