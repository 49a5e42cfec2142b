"""The python tool's process helpers: feeding a call's process its code and waiting for it, killing its
process group, and removing its work directory."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import stat
from typing import Any


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
