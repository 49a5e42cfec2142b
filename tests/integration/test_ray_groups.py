"""RayWorkerGroup: the same worker classes as LocalWorkerGroup, one Ray actor process per rank."""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from verl.protocol import DataProto
from verl.single_controller import Dispatch, LocalWorkerGroup, Worker, WorkerError, register

ray = pytest.importorskip("ray")
from verl.single_controller.ray import RayWorkerGroup, ensure_ray  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    # The worker classes below live in this test module, importable only through the sys.path pytest
    # gave the driver: the hosts find them because RayWorkerGroup hands that path on.
    started_here = not ray.is_initialized()
    ensure_ray()
    yield
    if started_here:
        ray.shutdown()


class ToyWorker(Worker):
    def __init__(self, scale: float = 2.0) -> None:
        self.scale = scale

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        n = len(data)
        return DataProto.from_dict(
            tensors={"x": data.batch["x"] * self.scale},
            non_tensors={"rank": [self.rank] * n, "pid": [os.getpid()] * n},
        )

    @register()
    def whoami(self, tag: str) -> tuple[int, int, str]:
        return (self.rank, self.world_size, tag)

    @register()
    def getenv(self, *names: str) -> list[str | None]:
        return [os.environ.get(name) for name in names]

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def route(self, item: str, *, suffix: str) -> str:
        return f"rank{self.rank}:{item}{suffix}"

    @register()
    def fail_on(self, rank: int, error: str) -> int:
        if self.rank == rank:
            raise {"key": KeyError("missing field"), "memory": MemoryError("no room")}[error]
        return self.rank


class Broken(Worker):
    def __init__(self) -> None:
        if self.rank == 1:
            raise ValueError("bad config")


class Plain:  # not a Worker, nothing registered
    def __init__(self, k: int) -> None:
        self.k = k

    def times(self, x: int) -> tuple[int, int]:
        return self.k * x, os.getpid()


class Counter(Worker):
    def __init__(self) -> None:
        self.count = 0

    @register()
    def bump(self) -> int:
        self.count += 1
        return self.count

    @register()
    def nap(self, seconds: float) -> int:
        time.sleep(seconds)
        return os.getpid()

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def nap_or_fail(self, seconds: float | None) -> int:
        if seconds is None:
            raise RuntimeError("gave up")
        time.sleep(seconds)
        return os.getpid()

    def get_state(self) -> int:
        return self.count

    def set_state(self, state: int) -> None:
        self.count = state


class GlooWorker(Worker):
    def __init__(self) -> None:
        # env:// rendezvous: MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE come from the host
        torch.distributed.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))

    @register()
    def all_reduce(self, value: float) -> float:
        tensor = torch.tensor([value * (self.rank + 1)])
        torch.distributed.all_reduce(tensor)
        return tensor.item()


def rows(n: int) -> DataProto:
    return DataProto.from_dict(tensors={"x": torch.arange(2 * n, dtype=torch.float32).reshape(n, 2)})


def timed(*calls) -> float:
    """Run the calls from separate driver threads at once; the wall time they took together."""
    start = time.monotonic()
    with ThreadPoolExecutor(len(calls)) as pool:
        for future in [pool.submit(call) for call in calls]:
            future.result()
    return time.monotonic() - start


@pytest.fixture(scope="module")
def toy():
    group = RayWorkerGroup(
        ToyWorker, world_size=2, init_kwargs={"scale": 3.0}, name="toy", env={"VERL_TEST_FLAG": "on"}
    )
    yield group
    group.shutdown()


# ---------------------------------------------------------------- dispatch across processes


def test_dp_compute_proto_matches_local_group_and_runs_in_two_processes(toy):
    data = rows(5)
    out = toy.double(data)
    expected = LocalWorkerGroup(ToyWorker, world_size=2, init_kwargs={"scale": 3.0}).double(data)
    assert torch.equal(out.batch["x"], expected.batch["x"])
    assert (
        out.non_tensor_batch["rank"].tolist() == expected.non_tensor_batch["rank"].tolist() == [0, 0, 0, 1, 1]
    )
    pids = out.non_tensor_batch["pid"].tolist()
    assert pids == [toy.pids()[0]] * 3 + [toy.pids()[1]] * 2
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert not toy.in_process


def test_one_to_all_and_all_to_all(toy):
    assert toy.whoami("hi") == [(0, 2, "hi"), (1, 2, "hi")]
    assert toy.route(["a", "b"], suffix=["!", "?"]) == ["rank0:a!", "rank1:b?"]


def test_each_process_gets_the_rendezvous_env_and_the_groups_env(toy):
    names = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "VERL_TEST_FLAG")
    (addr0, port0, *rest0), (addr1, port1, *rest1) = toy.getenv(*names)
    # rank 0's node leads the rendezvous: its address (the one Ray advertises) and a port free there
    assert addr0 == addr1 == toy.nodes()[0][1] and port0 == port1 and int(port0) > 0
    assert rest0 == ["0", "2", "0", "on"] and rest1 == ["1", "2", "1", "on"]


def test_method_errors_name_role_rank_kind_and_cause(toy):
    with pytest.raises(WorkerError) as info:
        toy.fail_on(1, "key")
    error = info.value
    assert (error.role, error.rank, error.method, error.kind) == ("toy", 1, "fail_on", "exception")
    assert error.cause == "KeyError: 'missing field'" and error.pid == toy.pids()[1]
    assert isinstance(error.__cause__, KeyError)

    with pytest.raises(WorkerError) as info:
        toy.fail_on(0, "memory")
    assert (info.value.rank, info.value.kind, info.value.cause) == (0, "oom", "MemoryError: no room")

    with pytest.raises(WorkerError) as info:
        toy.whoami(threading.Lock())  # Ray cannot send it
    assert (info.value.rank, info.value.kind) == (0, "exception") and "serialize" in info.value.cause

    assert toy.fail_on(-1, "key") == [0, 1]  # the group still works afterwards


def test_a_failing_init_names_the_rank_and_leaves_shared_processes_alone(toy):
    with pytest.raises(WorkerError) as info:
        RayWorkerGroup(Broken, world_size=2, name="broken", colocate_with=toy)
    error = info.value
    assert (error.role, error.rank, error.method, error.cause) == (
        "broken",
        1,
        "__init__",
        "ValueError: bad config",
    )
    assert toy.whoami("still here") == [(0, 2, "still here"), (1, 2, "still here")]


def test_a_failing_rank_does_not_wait_for_a_stuck_peer(toy):
    group = RayWorkerGroup(Counter, world_size=2, name="stuck", colocate_with=toy)
    group.failure_grace_s = 0.2
    try:
        start = time.monotonic()
        with pytest.raises(WorkerError, match="rank 1 .*RuntimeError: gave up"):
            group.nap_or_fail([3.0, None])  # rank 0 would still be napping for 3 s
        assert time.monotonic() - start < 2.0
    finally:
        group.shutdown()


def test_plain_class_serves_as_a_single_worker_role():
    group = RayWorkerGroup(Plain, init_kwargs={"k": 3}, name="plain")
    try:
        value, pid = group.call("times", 5)
        assert value == 15 and pid == group.pids()[0] != os.getpid()
    finally:
        group.shutdown()
    group.shutdown()  # idempotent
    with pytest.raises(RuntimeError, match="shut down"):
        group.call("times", 5)


# ---------------------------------------------------------------- colocation, death, restart


def test_colocated_groups_share_processes_and_run_at_the_same_time(toy):
    first = RayWorkerGroup(Counter, world_size=2, name="first", colocate_with=toy)
    second = RayWorkerGroup(Counter, world_size=2, name="second", colocate_with=toy)
    try:
        assert first.pids() == second.pids() == first.nap(0) == second.nap(0) == toy.pids()
        # different groups in one process overlap; calls on one group take turns
        assert timed(lambda: first.nap(1.0), lambda: second.nap(1.0)) < 1.7
        assert timed(lambda: first.nap(0.5), lambda: first.nap(0.5)) >= 1.0
        with pytest.raises(ValueError, match="sizes must match"):
            RayWorkerGroup(Counter, world_size=1, colocate_with=toy)
        with pytest.raises(ValueError, match="second group named 'first'"):
            RayWorkerGroup(Counter, world_size=2, name="first", colocate_with=toy)
        first.shutdown()  # the processes live on for the groups still using them
        assert second.bump() == [1, 1] and toy.whoami("x") == [(0, 2, "x"), (1, 2, "x")]
    finally:
        first.shutdown()
        second.shutdown()


def test_workers_form_a_gloo_group_and_free_it_on_shutdown(toy):
    group = RayWorkerGroup(GlooWorker, world_size=2, name="gloo", colocate_with=toy)
    assert group.all_reduce(1.0) == [3.0, 3.0]
    group.shutdown()  # the processes live on (toy), so the default process group must be destroyed ...
    again = RayWorkerGroup(GlooWorker, world_size=2, name="gloo-again", colocate_with=toy)
    try:
        assert again.all_reduce(2.0) == [6.0, 6.0]  # ... for a new group to form one there
    finally:
        again.shutdown()


def test_killed_rank_raises_died_then_restart_rebuilds_every_colocated_group():
    counter = RayWorkerGroup(Counter, world_size=2, name="counter")
    gloo = RayWorkerGroup(GlooWorker, world_size=2, name="gloo", colocate_with=counter)
    try:
        counter.bump(), counter.bump()
        assert counter.save_state() == 2
        counter.bump()  # lost with the processes
        old_pids = counter.pids()

        os.kill(old_pids[1], signal.SIGKILL)
        with pytest.raises(WorkerError) as info:
            counter.bump()
        error = info.value
        assert (error.role, error.rank, error.kind, error.pid) == ("counter", 1, "died", old_pids[1])
        assert "role 'counter' rank 1" in str(error) and "ActorDiedError" in error.cause
        with pytest.raises(WorkerError, match="role 'gloo' rank 1"):
            gloo.all_reduce(1.0)

        counter.restart()  # new processes for both groups (they share them)
        assert gloo.pids() == counter.pids() and not set(counter.pids()) & set(old_pids)
        assert counter.bump() == [3, 3]  # the saved 2, not the lost 3
        assert gloo.all_reduce(1.0) == [3.0, 3.0]  # a new process group, on a new MASTER_PORT
    finally:
        gloo.shutdown()
        counter.shutdown()


# ---------------------------------------------------------------- the watchdog


class Spinner(Worker):
    @register()
    def spin(self, seconds: float) -> int:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            _spin_a_little()
        return self.rank


def _spin_a_little() -> None:
    time.sleep(0.01)


@pytest.mark.serial
@pytest.mark.parametrize("found_by", ["deadline", "heartbeat"])
def test_a_stopped_rank_is_named_with_its_node_its_silence_and_its_stack(found_by):
    """SIGSTOP one rank mid-call: the call fails, not never, naming that rank (its peer, still running,
    answers the heartbeat) with the Python stack py-spy reads from the stopped process; found at the call's
    deadline, or by the heartbeats long before it."""
    group = RayWorkerGroup(Spinner, world_size=2, name="spinner")
    # set from here on: starting the processes may take longer on a busy machine
    if found_by == "deadline":
        group.call_timeout_s = 6
    else:
        group.call_timeout_s, group.heartbeat_timeout_s = 600, 6
    stopped = group.pids()[1]
    try:
        with ThreadPoolExecutor(1) as pool:
            call = pool.submit(group.spin, 120)
            time.sleep(2)
            os.kill(stopped, signal.SIGSTOP)
            start = time.monotonic()
            with pytest.raises(WorkerError) as info:
                call.result(timeout=300)
        error = info.value
        assert (error.kind, error.rank, error.pid, error.method) == ("hung", 1, stopped, "spin")
        assert error.node == f"{group.nodes()[1][0][:8]} at {group.nodes()[1][1]}"
        message = str(error)
        assert (
            f"role 'spinner' rank 1 (pid {stopped}, node {error.node}) stopped responding in spin" in message
        )
        if found_by == "deadline":
            assert "the limit being 6 s (trainer.worker_timeout_s)" in message
            assert "does not answer a heartbeat" in message
        else:
            assert "answered no heartbeat for 6 s (trainer.heartbeat_timeout_s)" in message
            assert "trainer.worker_timeout_s" not in message
        assert "ranks still out: 0,1, not answering: 1" in message
        stack = message.split("Its Python stack (py-spy dump):\n", 1)[1]
        assert stack.startswith("Thread ") and '"verl-spinner_0"' in stack.splitlines()[0], (
            stack
        )  # the worker's
        assert "_spin_a_little" in stack and "Spinner.spin (" in stack and "MainThread" not in stack, stack
        assert time.monotonic() - start < 60
    finally:
        os.kill(stopped, signal.SIGCONT)
        group.shutdown()
