"""(e) FSDP2 against DDP: the policy update's speed and what each rank holds, with 1 and 2 ranks.

The update is the train section's (:mod:`verl.bench.training`): the same config
(``update_config``, padded mode), the same rollout-like batch (``rollout_like_batch``: 64 sequences,
random response lengths, one optimizer step), the same ``ActorRolloutRefWorker.update_actor``, with
``actor_rollout_ref.actor.strategy`` set to ``dp`` (replicated; DDP with more than one rank) or ``fsdp2``
(``fully_shard``: each rank keeps its shard of the parameters, gradients and AdamW state). With N ranks
each rank trains on its contiguous 1/N of the batch, as the controller's ``DP_COMPUTE_PROTO`` dispatch
gives it, and the global batch, mini-batch and micro-batch size per rank stay as they are: tokens/s
counts the real tokens of the whole batch over the wall time of the update on all ranks.

Every rank runs one torch thread (``THREADS_PER_RANK``, whatever ``--threads`` says): 2 ranks use the
2 cores of the development machine, and the 1-rank rows do the same work per core.

How the ranks run: the measuring process (a fresh process per case, as for every section) is rank 0.
It starts ranks 1.. before computing anything, as forks of itself (run in-process, as the tests do, as
new interpreters: see `_Helpers`), and they form a gloo process group. Rank 0 drives them through
that group: before each run of the harness (warm-up and timed) it broadcasts RUN and every rank calls
``update_actor`` (its collectives keep them in step); rank 0's run ends when every rank has finished.
After the last run it broadcasts REPORT, and each rank reports (what every rank runs, its session and
ranks 1..'s loop, is :mod:`verl.bench.fsdp_rank`; this module is the section and rank 0's driver):

- ``param_bytes`` / ``grad_bytes`` / ``optim_bytes``: `verl.workers.engine.fsdp.local_bytes` of the
  model's parameters, of their ``.grad`` and of the optimizer's state tensors (AdamW: ``exp_avg``,
  ``exp_avg_sq``, ``step``), taken after an update, so every one exists: the local shard of a DTensor,
  the whole of a plain tensor;
- its peak RSS: ranks 1.. reset their high-water mark after their setup, as the harness does for
  rank 0, and read it at REPORT;
- the CPU seconds it used meanwhile: the harness's contention meter sees the other ranks' CPU time as
  "other processes", and `correct_contention` takes it out again.

The row gives, for each per-rank figure, the MAXIMUM over the ranks (``per_rank`` in the JSON holds
every rank's). One rank alone with ``fsdp2`` still shards (over a one-process group), so its bytes equal
``dp``'s; DDP's all-reduce buckets (a flat copy of the gradients per rank) and FSDP2's gathered layers
are in the RSS, not in the byte columns.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from verl.bench.fsdp_rank import (
    REPORT,
    RUN,
    STOP,
    RankSession,
    broadcast_command,
    forked_rank,
    gather_stats,
    init_group,
)
from verl.bench.measure import Case, Prepared, median

STRATEGIES = ("dp", "fsdp2")
RANKS = (1, 2)
THREADS_PER_RANK = 1
MODE = "padded"
"""the train section's mode the update runs in (the plain padded forward: the prompts are distinct)"""

PACKAGE_PARENT = Path(__file__).resolve().parents[2]
"""the directory holding the ``verl`` package: on a new rank interpreter's path, as on this one's"""
_ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME")


def cases(
    model: str,
    model_path: str,
    sequences: int,
    max_response_length: int,
    micro_batch: int,
    ranks: tuple[int, ...] = RANKS,
    **common: Any,
) -> list[Case]:
    """dp x1, fsdp2 x1, dp x2, fsdp2 x2 (``ranks`` and then ``STRATEGIES`` in order)."""
    common = {**common, "threads": THREADS_PER_RANK}
    params = {
        "mode": MODE,
        "sequences": sequences,
        "max_response_length": max_response_length,
        "micro_batch": micro_batch,
    }
    return [
        Case("fsdp", model, model_path, {"strategy": s, "ranks": n, **params}, **common)
        for n in ranks
        for s in STRATEGIES
    ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    if sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = os.environ.get("GLOO_SOCKET_IFNAME", "lo")
    return env


class _ForkedRank:
    """A rank forked from this process, with the calls of ``subprocess.Popen`` that `_Helpers` uses."""

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
            time.sleep(0.05)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)


@dataclass
class _Helpers:
    """Ranks 1.. of a case, started by rank 0 (this process), with their combined log.

    In a case's own process (the bench's way: forked from the harness's forkserver, nothing computed
    yet) the ranks are forks of it: they start from the same memory, so their RSS compares with rank
    0's (a freshly started interpreter has ~70 MB more resident, pages a fork shares untouched). Run
    in-process (tests), the process may already run OpenMP threads, which do not survive a fork: then
    they are new interpreters (``python -c ... rank_main()``).
    """

    procs: list[Any]
    log_path: str
    saved_env: dict[str, str | None]

    @classmethod
    def start(cls, case: Case) -> _Helpers:
        world = case.params["ranks"]
        port = _free_port()
        fork = multiprocessing.parent_process() is not None and hasattr(os, "fork")
        log = tempfile.NamedTemporaryFile(prefix="verl-bench-ranks-", suffix=".log", delete=False)
        procs: list[Any] = []
        for rank in range(1, world):
            env = _rank_env(rank, world, port)
            if fork:
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    forked_rank(case, rank, world, env, log.fileno())
                procs.append(_ForkedRank(pid))
                continue
            env = {**os.environ, **env, "OMP_NUM_THREADS": str(case.threads)}
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(PACKAGE_PARENT), os.environ.get("PYTHONPATH")])
            )
            command = [sys.executable, "-c", "from verl.bench.fsdp_rank import rank_main; rank_main()"]
            procs.append(
                subprocess.Popen(
                    [*command, json.dumps(asdict(case))], env=env, stdout=log, stderr=subprocess.STDOUT
                )
            )
        log.close()
        saved = {k: os.environ.get(k) for k in _ENV_KEYS}
        os.environ.update(_rank_env(0, world, port))
        return cls(procs, log.name, saved)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = Path(self.log_path).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def stop(self, wait_s: float = 30.0) -> str | None:
        """Wait for the ranks to exit (after STOP; a rank that does not is made to print where it is
        stuck, then killed), put the environment back; what went wrong, with their output, or None."""
        deadline = time.monotonic() + wait_s
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=max(deadline - time.monotonic(), 0.1)))
            except subprocess.TimeoutExpired:
                if hasattr(signal, "SIGUSR1"):
                    os.kill(proc.pid, signal.SIGUSR1)  # faulthandler: every thread's stack into the log
                    time.sleep(1.0)
                proc.kill()
                proc.wait(timeout=10.0)
                codes.append(None)
        for key, value in self.saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        problem = None
        if any(code != 0 for code in codes):
            exits = ", ".join("did not exit" if c is None else f"exit code {c}" for c in codes)
            problem = f"ranks 1..: {exits}; their output:\n{self.log_tail(60)}"
        Path(self.log_path).unlink(missing_ok=True)
        return problem


def setup(case: Case) -> Prepared:
    world = case.params["ranks"]
    had_group = dist.is_initialized()
    if world > 1 and had_group:
        raise RuntimeError("a process group already exists in this process: 2-rank cases need their own")
    helpers = _Helpers.start(case) if world > 1 else None
    try:
        if helpers is not None:
            init_group(0, world, helpers)
        session = RankSession(case, 0, world)
    except BaseException as e:
        if helpers is not None:
            for proc in helpers.procs:
                proc.kill()
            tail = helpers.log_tail()
            helpers.stop(wait_s=5.0)
            _leave_group(had_group)
            if tail and "their output" not in str(e):
                raise RuntimeError(f"{e}\nthe other ranks' output:\n{tail}") from e
        _leave_group(had_group)
        raise
    failed = False

    def run() -> dict[str, Any]:
        nonlocal failed
        try:
            if helpers is not None:
                broadcast_command(RUN)
            session.update()
            if helpers is not None:
                dist.barrier()  # the run ends when every rank's update has
        except BaseException:
            failed = True
            raise
        return {"tokens": session.info["real_tokens"]}

    info: dict[str, Any] = dict(session.info)

    def close() -> None:
        nonlocal session
        try:
            if not failed:
                if helpers is not None:
                    broadcast_command(REPORT)
                ranks = gather_stats(
                    {"rank": 0, "torch_threads": torch.get_num_threads(), **session.held_bytes()}
                )
                info["ranks"] = sorted(ranks, key=lambda r: r["rank"])
                info["helper_cpu_s"] = sum(r.get("cpu_s", 0.0) for r in ranks[1:])
            if helpers is not None and not failed:
                broadcast_command(STOP)
        finally:
            # After a failed run the other ranks are dead or stuck in a collective: a short wait.
            problem = helpers.stop(wait_s=2.0 if failed else 30.0) if helpers is not None else None
            session = None  # DDP's reducer goes while its process group is still there
            gc.collect()
            _leave_group(had_group)
        if problem:
            raise RuntimeError(problem)  # after a failed run, chained to its error

    return Prepared(run, info=info, close=close, modules=[session.worker.actor_model])


def _leave_group(had_group: bool) -> None:
    """Destroy the process group this case formed (FSDP2 forms a one-process one for 1 rank)."""
    if not had_group and dist.is_initialized():
        dist.destroy_process_group()


def correct_contention(result: dict[str, Any]) -> None:
    """Take the other ranks' CPU time out of the harness's ``others_cpu_pct`` (its meter counts only
    rank 0's process as the bench's own)."""
    helper_s, others = result["info"].get("helper_cpu_s"), result.get("others_cpu_pct")
    if not helper_s or others is None:
        return
    wall = sum(result["warmup_s"]) + sum(result["times_s"])  # the meter's window, but for a few calls
    share = 100 * helper_s / max(wall * (os.cpu_count() or 1), 1e-9)
    result["others_cpu_pct"] = max(others - share, 0.0)


def summarize(case: Case, result: dict[str, Any]) -> dict[str, Any]:
    """Speed over all ranks; every per-rank figure is the maximum over the ranks (``per_rank``: each)."""
    seconds = median(result["times_s"])
    info = dict(result["info"])
    ranks = [dict(r) for r in info.pop("ranks")]
    info.pop("helper_cpu_s", None)
    # Rank 0 is the measuring process: its memory is the harness's own measurement.
    ranks[0].update(
        rss_after_setup_mb=result["rss_after_setup_mb"],
        peak_rss_mb=result["peak_rss_mb"],
        peak_delta_mb=result["peak_delta_mb"],
    )

    def most(key: str) -> Any:
        values = [r[key] for r in ranks if r.get(key) is not None]
        return max(values) if values else None

    keys = ("param_bytes", "grad_bytes", "optim_bytes", "state_bytes")
    return {
        "median_s": seconds,
        "tokens_per_s": info["real_tokens"] / seconds,
        "padding_fraction": 1 - info["real_tokens"] / info["padded_tokens"],
        **{k: most(k) for k in keys},
        "peak_rss_mb": most("peak_rss_mb"),
        "peak_delta_mb": most("peak_delta_mb"),
        "rss_after_setup_mb": most("rss_after_setup_mb"),
        "per_rank": ranks,
        **info,
    }
