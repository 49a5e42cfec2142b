"""Threads that drive compute on one OpenMP thread; the workers' threads keep the run's count
(verl.utils.threads.drive_on_one_openmp_thread, LocalWorkerGroup(computes=...), the controller's step threads);
exclusive roles take turns on one thread (Role(exclusive=True))."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import torch

from verl.single_controller import LocalWorkerGroup, Worker, register
from verl.single_controller.flow import Controller
from verl.single_controller.role import Role
from verl.utils.threads import (
    ThreadChoice,
    configure_torch_threads,
    drive_on_one_openmp_thread,
    openmp_runtime,
    torch_openmp_path,
)

needs_openmp = pytest.mark.skipif(openmp_runtime() is None, reason="torch does not compute with OpenMP here")


def _in_new_thread(fn: Callable[[], object]) -> object:
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


class _Threads(Worker):
    """A worker that reports the intra-op thread count of the thread its calls run on."""

    @register()
    def threads(self) -> int:
        return torch.get_num_threads()

    @register()
    def span(self, seconds: float) -> tuple[int, float, float]:
        """(the thread it ran on, when it started, when it ended), after ``seconds`` of sleep."""
        start = time.perf_counter()
        time.sleep(seconds)
        return threading.get_ident(), start, time.perf_counter()


def test_torch_own_runtime_is_chosen_over_other_packages_copies() -> None:
    loaded = [
        "/site/scikit_learn.libs/libgomp-a34b3233.so.1.0.0",
        "/site/torch/lib/libgomp.so.1",
        "/site/torch/lib/libtorch_cpu.so",
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
    ]
    assert torch_openmp_path(loaded, "/site/torch") == "/site/torch/lib/libgomp.so.1"
    # a torch linked against the system's runtime: the only one loaded
    assert torch_openmp_path(loaded[2:] + ["/usr/lib/libgomp.so.1"], "/site/torch") == "/usr/lib/libgomp.so.1"
    # several, none torch's: which one torch uses cannot be told
    assert torch_openmp_path(["/a/libgomp.so.1", "/b/libiomp5.so"], "/site/torch") is None
    assert torch_openmp_path(loaded[2:], "/site/torch") is None


@needs_openmp
def test_a_driving_thread_runs_on_one_openmp_thread_and_others_keep_theirs(two_torch_threads) -> None:
    def drive() -> tuple[bool, int]:
        return drive_on_one_openmp_thread(), torch.get_num_threads()

    assert _in_new_thread(drive) == (True, 1)
    assert torch.get_num_threads() == 2  # the calling thread's count is its own
    assert _in_new_thread(torch.get_num_threads) == 2


@needs_openmp
def test_a_driving_thread_stays_on_one_when_a_worker_built_on_it_sets_the_run_count(
    two_torch_threads,
) -> None:
    def drive_then_configure() -> tuple[int, int]:
        drive_on_one_openmp_thread()
        configure_torch_threads(ThreadChoice(2, "test"))  # what a worker's setup does on its thread
        return torch.get_num_threads(), _in_new_thread(torch.get_num_threads)

    assert _in_new_thread(drive_then_configure) == (1, 2)  # new threads still take the run's count


@needs_openmp
def test_in_process_groups_compute_or_drive(two_torch_threads) -> None:
    computing = LocalWorkerGroup(_Threads, name="computing")
    driving = LocalWorkerGroup(_Threads, name="driving", computes=False)
    try:
        assert computing.threads() == [2]
        assert driving.threads() == [1]
    finally:
        computing.shutdown()
        driving.shutdown()


@needs_openmp
def test_the_controller_step_threads_drive(two_torch_threads) -> None:
    controller = Controller()
    try:
        assert controller._pool.submit(torch.get_num_threads).result() == 1
    finally:
        controller.shutdown()


@pytest.mark.serial  # timings
def test_exclusive_roles_take_turns_on_one_thread_and_others_run_beside_them() -> None:
    with Controller() as controller:
        for name, exclusive in (("actor", True), ("critic", True), ("rm", False)):
            controller.register_role(Role(name, worker_class=_Threads, exclusive=exclusive))
        seconds = {"actor": 0.3, "critic": 0.3, "rm": 0.5}
        spans = {
            name: controller.step(role=name, method="span", inputs={"seconds": s}, outputs=["span"])["span"]
            for name, s in seconds.items()
        }
        (actor_thread, *actor), (critic_thread, *critic), (rm_thread, *rm) = (
            spans[name].get()[0] for name in ("actor", "critic", "rm")
        )
    assert actor_thread == critic_thread != rm_thread
    first, second = sorted([actor, critic])
    assert first[1] <= second[0]  # one after the other
    assert rm[0] < second[0] < rm[1]  # the other role ran meanwhile
