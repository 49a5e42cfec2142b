"""How one measurement is taken: a fresh process, warm-up excluded, repeated runs, peak memory.

Each measurement (a *case*) runs in its own process forked from a forkserver that has already imported
torch, transformers and verl, so a case pays no import time, starts with no memory left over from an
earlier case, and a case that crashes or runs out of memory becomes an error row instead of ending the
bench. Inside that process:

1. ``setup(case)`` loads the model and builds the inputs (not timed), and every weight is read once
   (memory-mapped weights would otherwise become resident during the first run and count as its memory);
2. the resident set size (RSS) is read, and the kernel's RSS high-water mark is reset
   (``/proc/self/clear_refs``), so the peak that follows belongs to the work alone;
3. ``warmup`` untimed runs (first calls pay for lazy initialisation, allocator growth and kernel
   selection), then timed runs: ``repeats`` of them, fewer when a run is so slow that they would
   exceed ``budget_s`` (never fewer than ``MIN_REPEATS``);
4. the high-water mark is read: ``peak_rss_mb`` is the largest RSS of the process during warm-up and
   timed runs, ``peak_delta_mb`` its excess over the RSS after setup, i.e. what the work needed on
   top of the loaded model and inputs (activations, KV cache, gradients, optimizer state).

tracemalloc would miss torch's allocations entirely (they are not Python objects), hence RSS.

While the runs go, :class:`ContentionMeter` measures how much CPU other processes took: on a shared
machine that is what makes a number untrustworthy, and each row reports it.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MIN_REPEATS = 2
"""Timed runs a case gets however slow it is: a median of one run would hide a disturbed run."""


@dataclass(frozen=True)
class Case:
    """One measurement: which section, on which model, with what parameters and repetition policy."""

    section: str
    model: str
    model_path: str
    params: dict[str, Any]
    data_dir: str
    threads: int = 2
    warmup: int = 1
    repeats: int = 5
    budget_s: float = 60.0
    seed: int = 0

    def label(self) -> str:
        details = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.section} {self.model} {details}"


@dataclass
class Prepared:
    """What a section's setup hands the harness: ``run()`` does the timed unit of work once and returns
    per-run facts (e.g. ``tokens``); ``info`` describes the case; ``close()`` releases resources."""

    run: Callable[[], dict[str, Any]]
    info: dict[str, Any] = field(default_factory=dict)
    close: Callable[[], None] = lambda: None
    modules: list[Any] = field(default_factory=list)
    """models the work uses: their weights are paged in before the baseline RSS is read"""


def make_resident(modules: list[Any]) -> None:
    """Read every parameter once. Weights loaded from safetensors may be memory-mapped and only become
    resident when first used; without this the first run's page-ins would count as the work's memory."""
    import torch

    with torch.no_grad():
        for module in modules:
            for tensor in [*module.parameters(), *module.buffers()]:
                tensor.sum()


class CaseFailed(RuntimeError):
    """A case raised or its process died; the message says which and why."""


# ---------------------------------------------------------------------------------------------- memory

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_mb(field_name: str) -> float | None:
    """A ``VmXXX`` line of /proc/self/status in MiB (Linux), or None where there is no such file."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def current_rss_mb() -> float | None:
    return _status_mb("VmRSS")


def reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark of this process (Linux >= 4.0); False where impossible."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """Largest RSS since the last reset (VmHWM), else ``ru_maxrss`` (peak since the process started)."""
    hwm = _status_mb("VmHWM")
    if hwm is not None:
        return hwm
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / 2**20 if sys.platform == "darwin" else maxrss / 1024  # bytes on macOS, KiB elsewhere


def memory_method() -> str:
    """How peak memory is measured on this machine, for the report."""
    if _CLEAR_REFS.exists() and _STATUS.exists():
        return (
            "process RSS high-water mark (VmHWM, reset via /proc/self/clear_refs after setup) in a fresh "
            "process per case; delta = peak minus RSS after loading the model and inputs"
        )
    return (
        "ru_maxrss of a fresh process per case (includes model loading); delta = peak minus RSS after setup"
    )


# ---------------------------------------------------------------------------------------------- timing


def planned_repeats(repeats: int, budget_s: float, seconds_per_run: float) -> int:
    """Timed runs to do: ``repeats``, cut so their total stays near ``budget_s``, at least MIN_REPEATS."""
    if seconds_per_run <= 0:
        return repeats
    fit = int(budget_s // seconds_per_run)
    return max(min(repeats, fit), min(MIN_REPEATS, repeats))


def time_runs(
    run: Callable[[], dict[str, Any]], warmup: int, repeats: int, budget_s: float
) -> tuple[list[float], list[float], list[dict[str, Any]]]:
    """Warm-up runs, then timed runs: (warm-up seconds, timed seconds, each timed run's facts)."""
    warm_times = []
    for _ in range(warmup):
        start = time.perf_counter()
        run()
        warm_times.append(time.perf_counter() - start)
    # The last warm-up run is the best estimate of a timed run (the first one pays one-off costs).
    n = planned_repeats(repeats, budget_s, warm_times[-1] if warm_times else 0.0)
    times, outputs = [], []
    for _ in range(n):
        start = time.perf_counter()
        outputs.append(run())
        times.append(time.perf_counter() - start)
    return warm_times, times, outputs


# ---------------------------------------------------------------------------------------------- contention

_PROC_STAT = Path("/proc/stat")


def _machine_busy_s() -> float | None:
    """CPU seconds all processes on the machine have spent busy since boot (Linux), else None."""
    try:
        fields = [int(x) for x in _PROC_STAT.read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return usage.ru_utime + usage.ru_stime


class ContentionMeter:
    """Share of the machine's CPU time that OTHER processes used while it ran: the machine's busy time
    (/proc/stat) minus this process's own (getrusage), over wall time x CPUs. Above a few percent the
    timings are slower and noisier than on an idle machine; with every core used by the bench's threads,
    a thread descheduled in favour of another process stalls its whole OpenMP team."""

    def __enter__(self) -> ContentionMeter:
        self.others_pct: float | None = None
        self._start = (time.perf_counter(), _machine_busy_s(), _own_cpu_s())
        return self

    def __exit__(self, *exc: object) -> None:
        wall0, busy0, own0 = self._start
        busy1 = _machine_busy_s()
        if busy0 is None or busy1 is None:
            return
        wall = time.perf_counter() - wall0
        others = (busy1 - busy0) - (_own_cpu_s() - own0)
        # /proc/stat counts in clock ticks (10 ms): over a short interval the share can round past 100%
        self.others_pct = min(100.0, 100 * max(others, 0.0) / max(wall * (os.cpu_count() or 1), 1e-9))


BUSY_PCT = 5.0
"""Share of the machine's CPU used by other processes above which a measurement counts as disturbed."""


def cpu_busy_pct(seconds: float) -> float | None:
    """Share of the machine's CPU time spent busy (by any process) over the next ``seconds``."""
    busy0, start = _machine_busy_s(), time.perf_counter()
    time.sleep(seconds)
    busy1 = _machine_busy_s()
    if busy0 is None or busy1 is None:
        return None
    return 100 * (busy1 - busy0) / ((time.perf_counter() - start) * (os.cpu_count() or 1))


def wait_for_idle(timeout_s: float, sample_s: float = 0.5) -> float | None:
    """Wait (at most ``timeout_s``) until the CPUs are nearly idle; returns the last busy share seen.
    Called between cases, when the bench itself uses no CPU, so any load is someone else's."""
    deadline = time.monotonic() + timeout_s
    while True:
        busy = cpu_busy_pct(sample_s)
        if busy is None or busy <= BUSY_PCT or time.monotonic() >= deadline:
            return busy
        time.sleep(sample_s)


def median(values: list[float]) -> float:
    return float(statistics.median(values))


# ---------------------------------------------------------------------------------------------- running

Setup = Callable[[Case], Prepared]


def execute(setup: Setup, case: Case) -> dict[str, Any]:
    """Run one case in this process: setup, reset the memory peak, warm up, time, read the peak."""
    import torch
    from transformers.utils import logging as hf_logging

    from verl.utils.seeding import set_seed

    hf_logging.disable_progress_bar()
    torch.set_num_threads(case.threads)
    set_seed(case.seed)
    prepared = setup(case)
    try:
        make_resident(prepared.modules)
        rss_before = current_rss_mb()
        reset_peak_rss()
        with ContentionMeter() as contention:
            warm_times, times, outputs = time_runs(prepared.run, case.warmup, case.repeats, case.budget_s)
        peak = peak_rss_mb()
    finally:
        prepared.close()
    return {
        "warmup_s": warm_times,
        "times_s": times,
        "runs": outputs,
        "info": prepared.info,
        "torch_threads": case.threads,  # set above (an RLTrainer's own thread then drives on one)
        "rss_after_setup_mb": rss_before,
        "peak_rss_mb": peak,
        "peak_delta_mb": None if rss_before is None else max(peak - rss_before, 0.0),
        "others_cpu_pct": contention.others_pct,
    }


def _child(setup: Setup, case: Case, conn: Any) -> None:
    try:
        conn.send(("ok", execute(setup, case)))
    except BaseException:  # report anything, KeyboardInterrupt included, then let the process end
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


_CONTEXT: Any = None


def _context(preload: list[str]) -> Any:
    """A forkserver context whose server imported ``preload`` once: cases start in milliseconds.

    Forking from a server that never computed anything is safe with OpenMP, unlike forking the caller,
    which may have run torch ops (and started its thread pool) already. Where forkserver does not exist
    (Windows), spawn: slower, same isolation.
    """
    global _CONTEXT
    if _CONTEXT is None:
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        _CONTEXT = multiprocessing.get_context(method)
        if method == "forkserver":
            _CONTEXT.set_forkserver_preload(preload)
    return _CONTEXT


def run_case(
    setup: Setup, case: Case, isolate: bool = True, preload: list[str] | None = None
) -> dict[str, Any]:
    """Measure ``case``: in a fresh process (``isolate``, the default) or in this one (tests).

    Raises :class:`CaseFailed` with the case's traceback, or with the exit code of a process that died.
    """
    if not isolate:
        try:
            return execute(setup, case)
        except Exception as e:
            raise CaseFailed(traceback.format_exc()) from e
    ctx = _context(preload or [])
    receiver, sender = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_child, args=(setup, case, sender), daemon=True)
    process.start()
    sender.close()
    try:
        status, payload = receiver.recv()
    except EOFError:
        process.join()
        killed = " (killed: out of memory?)" if process.exitcode == -9 else ""
        raise CaseFailed(f"the measuring process died with exit code {process.exitcode}{killed}") from None
    finally:
        receiver.close()
    process.join()
    if status != "ok":
        raise CaseFailed(payload)
    return payload
