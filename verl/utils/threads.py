"""How many torch intra-op threads a process computes with: ``trainer.torch_threads`` (a number, null for
torch's own default, or ``auto``).

``auto`` gives every process that computes at the same time its share of the cores it may run on, except
for small models: below :data:`SMALL_MODEL_PARAMS` a matrix product is too short to split, and two
OpenMP threads spinning against each other on two cores made the default recipe's 1M-parameter model
slower, not faster (docs/performance.md, "Threads"). A CPU result is reproducible only for a fixed thread
count, so the choice is a pure function of the model, the cores and the process layout, logged at start.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl.utils.cpu import usable_cores

AUTO = "auto"
SMALL_MODEL_PARAMS = 2_000_000
"""below this many parameters ``auto`` takes one thread. Measured on 2 cores (docs/performance.md, "Threads"):
the 1M default model gains nothing from a second thread. The 4M bench model's GRPO step is 15% slower with two
on the arithmetic task's 4-token answers, and 1.6x faster on 32-token responses (benchmarks/vs_trl.py); the
longer responses are the common case, so 4M is above the cut."""


@dataclass(frozen=True)
class ThreadChoice:
    """The intra-op thread count of a process (None: torch's default) and why."""

    threads: int | None
    reason: str

    def describe(self) -> str:
        count = "torch's default" if self.threads is None else str(self.threads)
        return f"torch threads: {count} ({self.reason})"


def count_parameters(model_path: str | os.PathLike[str] | None) -> int | None:
    """The parameter count of a local HuggingFace model directory, from its safetensors headers (no weights
    are read); None when it cannot be told (a hub id, other weight formats)."""
    if not model_path or not Path(model_path).is_dir():
        return None
    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for file in files:
        numel = _safetensors_numel(file)
        if numel is None:  # a damaged file: loading the model reports it, with its name
            return None
        total += numel
    return total


def _safetensors_numel(file: Path) -> int | None:
    """Elements in a safetensors file, from its header (an 8-byte little-endian length, then JSON of shapes);
    None when the header cannot be read."""
    try:
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size <= file.stat().st_size:
                return None
            header = json.loads(f.read(size))
        numel = 0
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for dim in entry["shape"]:
                count *= int(dim)
            numel += count
        return numel
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def choose_torch_threads(
    setting: Any, *, model_path: str | None, processes: int = 1, cores: int | None = None
) -> ThreadChoice:
    """Resolve ``trainer.torch_threads``: ``processes`` is how many processes of this node compute at once
    (data-parallel workers sharing its cores)."""
    if setting is None:
        return ThreadChoice(None, "trainer.torch_threads=null")
    if setting != AUTO:
        return ThreadChoice(int(setting), "trainer.torch_threads")
    cores = usable_cores()[0] if cores is None else cores
    share = max(1, cores // max(1, processes))
    layout = f"{cores} usable cores, {processes} computing process{'es' if processes > 1 else ''}"
    params = count_parameters(model_path)
    if params is None:
        return ThreadChoice(share, f"auto: {layout}; model size unknown")
    size = f"{params / 1e6:.1f}M parameters"
    if params < SMALL_MODEL_PARAMS and share > 1:
        return ThreadChoice(1, f"auto: {size} < {SMALL_MODEL_PARAMS / 1e6:g}M, too small to split; {layout}")
    return ThreadChoice(share, f"auto: {size}, {layout}")


def computing_processes(trainer: Any) -> int:
    """Processes of one node computing at once: the Ray backend's data-parallel workers of a node; the
    local backend computes in the driver alone. With trainer.v1.trainer_mode=separate_async the rollout
    worker computes at the same time as the actor: one more (in the local backend a thread of the driver,
    which takes its share of the cores all the same)."""
    separate_rollout = 1 if trainer.get("v1", {}).get("trainer_mode", "sync") == "separate_async" else 0
    if trainer.get("backend", "local") == "ray":
        return max(1, int(trainer.n_gpus_per_node)) + separate_rollout
    return 1 + separate_rollout


def configure_torch_threads(choice: ThreadChoice) -> None:
    """Fix the intra-op thread count; results on CPU are reproducible only for a fixed count."""
    import torch  # here, so that config validation can read AUTO without importing torch

    if choice.threads:
        torch.set_num_threads(choice.threads)  # the process's count, and the calling thread's
        if getattr(_this_thread, "drives", False):
            drive_on_one_openmp_thread()  # a thread that drives stays on one (a worker built on it calls this)


def threads_for_run(config: Any) -> ThreadChoice:
    """The thread choice of an RL run's driver and workers (the same in every process of the run)."""
    return choose_torch_threads(
        config.trainer.torch_threads,
        model_path=config.actor_rollout_ref.model.path,
        processes=computing_processes(config.trainer),
    )


_this_thread = threading.local()


@functools.cache  # the runtime torch loaded does not change: one read of /proc/self/maps per process
def openmp_runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime torch computes with (the libgomp its Linux wheels ship; libiomp5 / libomp in other
    builds), as loaded in this process; None when torch does not use OpenMP or it cannot be told which.
    Other packages load their own copies (scikit-learn's ``libgomp-<hash>.so``): torch's directory wins."""
    import torch

    if "OpenMP" not in torch.__config__.parallel_info().split("ATen parallel backend:")[-1]:
        return None
    try:
        with open("/proc/self/maps") as maps:  # address, perms, offset, dev, inode, path
            fields = [line.rstrip("\n").split(maxsplit=5) for line in maps]
    except OSError:  # no /proc: not Linux
        return None
    chosen = torch_openmp_path([f[5] for f in fields if len(f) == 6], os.path.dirname(torch.__file__))
    return ctypes.CDLL(chosen) if chosen else None  # already loaded: dlopen hands back the same handle


def torch_openmp_path(loaded: list[str], torch_dir: str) -> str | None:
    """Of the libraries mapped in a process, the OpenMP runtime under ``torch_dir``; else the only one
    loaded; None when there is none or several of other packages' (which one torch uses cannot be told)."""
    names = ("libgomp", "libiomp5", "libomp.")
    runtimes = sorted({path for path in loaded if os.path.basename(path).startswith(names)})
    inside = os.path.realpath(torch_dir) + os.sep
    own = [path for path in runtimes if os.path.realpath(path).startswith(inside)]
    if own:
        return own[0]
    return runtimes[0] if len(runtimes) == 1 else None


def drive_on_one_openmp_thread() -> bool:
    """Make torch ops issued from the calling thread run on one OpenMP thread; other threads keep theirs.

    For threads that drive rather than compute (the controller, its step threads, a rule-based reward's
    thread), in a process whose compute runs on another thread. Each thread that runs a parallel torch op
    gets an OpenMP team of its own, kept until the thread ends, and once the process holds more OpenMP
    threads than CPUs, libgomp stops letting idle team threads spin: each parallel op then waits for its
    helper to be woken, ~15-40 us on a 2-core machine. A decode step of SmolLM2 issues ~600 such ops,
    and a GRPO step of the smollm2_arithmetic recipe took 9.0 s against 6.3 s with the driver's threads on
    one OpenMP thread (docs/performance.md, "One OpenMP team per process"). A thread that already holds a
    team keeps it; so this is called before a thread's first parallel op. Returns whether it applied
    (False: torch does not compute with OpenMP here).
    """
    import torch

    _this_thread.drives = True
    runtime = openmp_runtime()
    if runtime is None:
        return False
    torch.get_num_threads()  # torch sets a thread's OpenMP thread count at its first use: let it do so first
    runtime.omp_set_num_threads(ctypes.c_int(1))  # the calling thread's count only (an OpenMP ICV)
    return torch.get_num_threads() == 1  # torch reads the same runtime's count
