"""What every rank of the ``fsdp`` section (:mod:`verl.bench.fsdp`) runs: its worker and share of the
batch (:class:`RankSession`), joining the case's gloo group, the commands rank 0 broadcasts (RUN, REPORT,
STOP) and the loop in which ranks 1.. serve them, as forks of rank 0 or as new interpreters
(:func:`rank_main`). Rank 0, the measuring process, starts and drives them from :mod:`verl.bench.fsdp`.
"""

from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import resource
import signal
import sys
import time
import traceback
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from omegaconf import read_write

from verl.bench.measure import Case, current_rss_mb, make_resident, peak_rss_mb, reset_peak_rss
from verl.bench.training import rollout_like_batch, update_config
from verl.config import derive_sizes, validate
from verl.workers.engine.fsdp import local_bytes
from verl.workers.requests import UpdateRequest
from verl.workers.roles import ActorRolloutRefWorker

TIMEOUT_S = 300
"""of the process group's rendezvous and collectives: a rank that died leaves the others waiting this long"""
RUN, REPORT, STOP = 1, 2, 3


def strategy_config(case: Case) -> Any:
    """The train section's config (``update_config``) with the case's strategy, validated again."""
    config = update_config(case)
    with read_write(config):
        config.actor_rollout_ref.actor.strategy = case.params["strategy"]
    validate(config)
    return config


class RankSession:
    """One rank's worker and its share of the batch (the process group, if any, is already formed)."""

    def __init__(self, case: Case, rank: int, world: int) -> None:
        config = strategy_config(case)
        self.worker = ActorRolloutRefWorker(config, total_training_steps=1000, need_ref=False)
        batch = rollout_like_batch(self.worker, case)  # the same full batch on every rank (seeded by case)
        self.shard = batch.chunk(world)[rank] if world > 1 else batch
        self.request = UpdateRequest(derive_sizes(config), progress=0.0)
        attention = batch.batch["attention_mask"]
        self.info = {
            "real_tokens": int(attention.sum()),
            "padded_tokens": int(attention.numel()),
            "response_tokens": int(batch.batch["response_mask"].sum()),
            "mean_response_length": float(batch.batch["response_mask"].sum(-1).float().mean()),
            "rows_per_rank": len(self.shard),
            "n_params": sum(p.numel() for p in self.worker.actor_model.parameters()),
        }

    def update(self) -> None:
        self.worker.update_actor(self.shard, self.request)

    def held_bytes(self) -> dict[str, int]:
        """What this rank holds of the trained state, after an update."""
        params = list(self.worker.actor_model.parameters())
        grads = [p.grad for p in params if p.grad is not None]
        state = self.worker.actor.optimizer.state.values()
        optim = [v for s in state for v in s.values() if isinstance(v, torch.Tensor)]
        held = {
            "param_bytes": local_bytes(params),
            "grad_bytes": local_bytes(grads),
            "optim_bytes": local_bytes(optim),
        }
        held["state_bytes"] = sum(held.values())
        return held


def broadcast_command(code: int) -> int:
    """Rank 0 sends ``code`` to every rank (the others pass anything and get rank 0's)."""
    tensor = torch.tensor([code], dtype=torch.int64)
    dist.broadcast(tensor, src=0)
    return int(tensor.item())


def gather_stats(stats: dict[str, Any]) -> list[dict[str, Any]]:
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [stats]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, stats)
    return out


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def init_group(rank: int, world: int, helpers: Any = None) -> None:
    """Join the case's gloo group. Rank 0 serves the rendezvous store and waits until every other rank
    has connected to it, or has died (then it raises with their output instead of waiting TIMEOUT_S);
    ``helpers``: rank 0's ``verl.bench.fsdp._Helpers``, the other ranks it started."""
    timeout = timedelta(seconds=TIMEOUT_S)
    port = int(os.environ["MASTER_PORT"])
    store = dist.TCPStore(
        "127.0.0.1", port, world, is_master=rank == 0, timeout=timeout, wait_for_workers=False
    )
    if rank == 0:
        ready = [f"ready{r}" for r in range(1, world)]
        deadline = time.monotonic() + TIMEOUT_S
        while not store.check(ready):
            dead = [p.returncode for p in helpers.procs if p.poll() is not None] if helpers else []
            if dead or time.monotonic() > deadline:
                why = f"exited with {dead}" if dead else f"did not connect within {TIMEOUT_S} s"
                raise RuntimeError(
                    f"the other ranks {why}; their output:\n{helpers.log_tail() if helpers else ''}"
                )
            time.sleep(0.1)
    else:
        store.set(f"ready{rank}", "1")
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)


def _die_with_parent() -> None:
    """Linux: this rank is killed when rank 0's process ends, however it ends."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def rank_main() -> NoReturn:
    """A rank other than 0 in a new interpreter: the case as JSON in argv, its place in the env."""
    case = Case(**json.loads(sys.argv[1]))
    _run_rank(case, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))


def forked_rank(case: Case, rank: int, world: int, env: dict[str, str], log_fd: int) -> NoReturn:
    """A rank other than 0 in a fork of rank 0's process: its output into the ranks' log."""
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.environ.update(env)
    _run_rank(case, rank, world)


def _run_rank(case: Case, rank: int, world: int) -> NoReturn:
    """Serve rank 0 until STOP, then leave at once: no teardown. (Tearing down did hang now and then: a
    DDP reducer freed after its process group was destroyed; and a fork must never return into the
    harness's code.)"""
    code = 1
    try:
        _rank_loop(case, rank, world)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _rank_loop(case: Case, rank: int, world: int) -> None:
    """The same setup as rank 0's, then RUN / REPORT / STOP as rank 0 broadcasts them."""
    _die_with_parent()
    from transformers.utils import logging as hf_logging

    from verl.utils.seeding import set_seed

    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # rank 0 asks where a stuck rank is
    hf_logging.disable_progress_bar()
    torch.set_num_threads(case.threads)
    set_seed(case.seed)
    init_group(rank, world)
    session = RankSession(case, rank, world)
    make_resident([session.worker.actor_model])
    rss_after_setup = current_rss_mb()
    reset_peak_rss()
    cpu0 = _cpu_s()
    while (code := broadcast_command(0)) != STOP:
        if code == RUN:
            session.update()
            dist.barrier()
        elif code == REPORT:
            peak = peak_rss_mb()
            delta = None if rss_after_setup is None else max(peak - rss_after_setup, 0.0)
            gather_stats(
                {
                    "rank": rank,
                    "torch_threads": torch.get_num_threads(),
                    **session.held_bytes(),
                    "rss_after_setup_mb": rss_after_setup,
                    "peak_rss_mb": peak,
                    "peak_delta_mb": delta,
                    "cpu_s": _cpu_s() - cpu0,
                }
            )
