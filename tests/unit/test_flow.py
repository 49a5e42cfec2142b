"""The Controller / Role / DataChannel DAG on the in-process backend."""

import threading
import time

import pytest

from verl import Controller, DataChannel, Role
from verl.single_controller import Dispatch, Worker, WorkerError, register
from verl.single_controller.flow import StepError


class Generator:
    """A plain class (no Worker base), as in the seed's example."""

    def generate(self, prompt: list[str]) -> dict:
        return {"responses": [p.upper() for p in prompt]}

    def compute_loss(self, responses: list[str], values: list[float], rewards: list[float]) -> dict:
        return {
            "loss": sum(r - v for r, v in zip(rewards, values, strict=True)),
            "gae": [0.0] * len(responses),
        }


class SlowScorer:
    def __init__(self, value: float, seconds: float = 1.0) -> None:
        self.value = value
        self.seconds = seconds

    def score(self, responses: list[str]) -> list[float]:
        time.sleep(self.seconds)
        return [self.value * len(r) for r in responses]


def recorder(log: list[str]) -> type:
    """A worker class whose ``act(tag, delay)`` appends ``tag`` to ``log`` after ``delay`` seconds."""

    class Recorder:
        def act(self, tag: str, delay: float = 0.0) -> str:
            time.sleep(delay)
            log.append(tag)
            return tag

    return Recorder


def seed_controller(seconds: float = 1.0) -> Controller:
    controller = Controller()
    controller.register_role(Role(name="actor", role_type="actor", worker_class=Generator))
    controller.register_role(
        Role("critic", "critic", worker_class=SlowScorer, init_kwargs={"value": 0.5, "seconds": seconds})
    )
    controller.register_role(
        Role("rm", "reward_model", worker_class=SlowScorer, init_kwargs={"value": 1.0, "seconds": seconds})
    )
    return controller


@pytest.mark.serial
def test_seed_example_runs_and_independent_steps_overlap():
    controller = seed_controller(seconds=1.0)
    start = time.perf_counter()
    samples = controller.step(
        role="actor", method="generate", inputs={"prompt": ["ab", "cde"]}, outputs=["responses"]
    )
    critic = controller.step(
        role="critic", method="score", inputs={"responses": samples["responses"]}, outputs=["values"]
    )
    rm = controller.step(
        role="rm", method="score", inputs={"responses": samples["responses"]}, outputs=["rewards"]
    )
    assert time.perf_counter() - start < 0.5, "step() must declare, not wait"
    loss = controller.step(
        role="actor",
        method="compute_loss",
        inputs={"responses": samples["responses"], "values": critic["values"], "rewards": rm["rewards"]},
        outputs=["loss", "gae"],
    )
    assert loss["loss"].get() == pytest.approx((2 - 1) + (3 - 1.5))
    elapsed = time.perf_counter() - start
    # critic.score and rm.score (1 s each) ran at the same time: about 1 s in all, not 2 s
    assert 0.95 < elapsed < 1.6, elapsed
    assert samples["responses"][0] == "AB"  # a channel reads like its value
    assert f"{critic['values'][1]:.2f}" == "1.50"
    assert isinstance(samples["responses"], DataChannel)
    controller.shutdown()


def test_steps_of_one_role_run_in_declared_order():
    log: list[str] = []

    with Controller() as controller:
        controller.register_role(Role("a", worker_class=recorder(log)))
        controller.step(role="a", method="act", inputs={"tag": "first", "delay": 0.3})
        controller.step(role="a", method="act", inputs={"tag": "second"})  # no channel links them
        controller.wait_all()
    assert log == ["first", "second"]


def test_failure_fails_dependents_but_not_independent_branches():
    class Flaky:
        def boom(self, x: int) -> int:
            raise ValueError(f"bad input {x}")

        def ok(self, x: int) -> int:
            return x + 1

    with Controller() as controller:
        controller.register_role(Role("bad", worker_class=Flaky))
        controller.register_role(Role("good", worker_class=Flaky))
        failed = controller.step(role="bad", method="boom", inputs={"x": 1}, outputs=["y"])
        downstream = controller.step(role="good", method="ok", inputs={"x": failed["y"]}, outputs=["z"])
        independent = controller.step(role="good", method="ok", inputs={"x": 41}, outputs=["z"])
        assert independent["z"].get() == 42
        with pytest.raises(StepError) as info:
            failed["y"].get()
        assert "bad.boom" in str(info.value) and "role 'bad' rank 0" in str(info.value)
        assert "ValueError: bad input 1" in str(info.value)
        assert isinstance(info.value.__cause__, WorkerError)
        with pytest.raises(StepError, match=r"good.ok did not run.*from step bad.boom, which failed"):
            downstream["z"].get()


class CrashOnce(Worker):
    """Fails its first call in the process; counts how many times it was built."""

    built = 0
    crashed = False

    def __init__(self) -> None:
        CrashOnce.built += 1
        self.total = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def add(self, x: int) -> int:
        if not CrashOnce.crashed:
            CrashOnce.crashed = True
            raise MemoryError("simulated out of memory")
        self.total += x
        return self.total

    def get_state(self) -> int:
        return self.total

    def set_state(self, state: int) -> None:
        self.total = state


def test_restart_policy_rebuilds_restores_and_retries():
    CrashOnce.built, CrashOnce.crashed = 0, False
    with Controller(trace=True) as controller:
        group = controller.register_role(Role("reward", worker_class=CrashOnce, on_failure="restart"))
        group.workers[0].total = 10
        group.save_state()
        out = controller.step(role="reward", method="add", inputs={"x": 5}, outputs=["total"])
        assert out["total"].get() == [15]  # retried on a fresh worker restored to the saved 10
        assert controller.restarts == {"reward": 1}
        assert CrashOnce.built == 2
        (node,) = controller.recorder.dags[-1].nodes
        assert node.attempts == 2 and node.state == "done"


def test_fallback_policy_answers_a_failed_call_and_the_branch_goes_on():
    calls = []

    def cached_total(method, x):
        calls.append((method, x))
        return [-1]

    CrashOnce.built, CrashOnce.crashed = 0, False
    with Controller() as controller:
        controller.register_role(
            Role("reward", worker_class=CrashOnce, on_failure="fallback", fallback=cached_total)
        )
        out = controller.step(role="reward", method="add", inputs={"x": 5}, outputs=["total"])
        after = controller.step(
            method=lambda total: total[0] * 2, inputs={"total": out["total"]}, outputs=["y"]
        )
        assert out["total"].get() == [-1] and after["y"].get() == -2
        assert calls == [("add", 5)] and controller.fallbacks == {"reward": 1}
        assert controller.restarts == {"reward": 0} and CrashOnce.built == 1  # not rebuilt


def test_a_fallback_with_restart_answers_once_the_restarts_are_used_up():
    CrashOnce.built, CrashOnce.crashed = 0, False
    with Controller() as controller:
        role = Role(
            "reward", worker_class=CrashOnce, on_failure="restart", max_restarts=0, fallback=lambda m, x: [0]
        )
        controller.register_role(role)
        out = controller.step(role="reward", method="add", inputs={"x": 5}, outputs=["total"])
        assert out["total"].get() == [0] and controller.fallbacks == {"reward": 1}


def test_fallback_policy_needs_a_function_and_fail_takes_none():
    with pytest.raises(ValueError, match="on_failure='fallback' needs fallback="):
        Role("reward", on_failure="fallback")
    with pytest.raises(ValueError, match="with on_failure='fail' a failure fails the step"):
        Role("reward", fallback=lambda method, **inputs: None)


def test_fail_policy_reports_the_worker_and_cause():
    CrashOnce.built, CrashOnce.crashed = 0, False
    with Controller() as controller:
        controller.register_role(Role("reward", worker_class=CrashOnce))
        out = controller.step(role="reward", method="add", inputs={"x": 5}, outputs=["total"])
        with pytest.raises(StepError, match=r"role 'reward' rank 0 \(pid \d+\) ran out of memory in add"):
            out["total"].get()
        assert controller.restarts == {"reward": 0}


def test_driver_functions_and_output_mapping():
    with Controller() as controller:
        both = controller.step(
            method=lambda a, b: {"sum": a + b, "diff": a - b},
            inputs={"a": 5, "b": 3},
            outputs=["sum", "diff"],
        )
        whole = controller.step(method=lambda s: [s, s], inputs={"s": both["sum"]}, outputs=["pair"])
        assert whole.wait() == {"pair": [8, 8]}
        bad = controller.step(method=lambda: 1, outputs=["x", "y"])
        with pytest.raises(StepError, match=r"declared outputs \['x', 'y'\]"):
            bad.wait()


def test_step_validates_role_and_method_up_front():
    with Controller() as controller:
        with pytest.raises(KeyError, match="role 'actor' is not registered"):
            controller.step(role="actor", method="generate", inputs={}, outputs=["responses"])
        controller.register_role(Role("actor", worker_class=Generator))
        with pytest.raises(AttributeError, match="has no method 'generat'"):
            controller.step(role="actor", method="generat")
        with pytest.raises(ValueError, match="no worker_class"):
            controller.register_role(Role("critic"))
    with pytest.raises(ValueError, match="on_failure"):
        Role("x", on_failure="retry")


def test_trace_records_states_edges_and_bytes(tmp_path):
    import torch

    class Tensors:
        def make(self) -> torch.Tensor:
            return torch.zeros(256, dtype=torch.float32)

        def total(self, t: torch.Tensor) -> float:
            return float(t.sum())

    with Controller(trace=True) as controller:
        controller.register_role(Role("a", worker_class=Tensors))
        controller.register_role(Role("b", worker_class=Tensors))
        with controller.dag("step 1"):
            made = controller.step(role="a", method="make", outputs=["t"])
            controller.step(role="b", method="total", inputs={"t": made["t"]}, outputs=["s"])
        (dag,) = controller.recorder.dags
        assert [n.state for n in dag.nodes] == ["done", "done"]
        (edge,) = dag.edges
        assert (edge.src, edge.dst, edge.channel, edge.nbytes, edge.transport) == (
            dag.nodes[0].node_id,
            dag.nodes[1].node_id,
            "t",
            1024,
            "in-process",
        )
        path = controller.write_trace(str(tmp_path / "trace.html"))
    assert "b.total" in open(path).read() or "total" in open(path).read()


def test_many_concurrent_steps_do_not_deadlock():
    class Echo:
        def echo(self, x: int) -> int:
            return x

    with Controller(max_concurrency=2) as controller:
        for i in range(6):
            controller.register_role(Role(f"r{i}", worker_class=Echo))
        chans = [
            controller.step(role=f"r{i % 6}", method="echo", inputs={"x": i}, outputs=["y"])
            for i in range(60)
        ]
        total = controller.step(
            method=lambda **kw: sum(kw.values()),
            inputs={f"c{i}": c["y"] for i, c in enumerate(chans)},
            outputs=["s"],
        )
        assert total["s"].get(timeout=10) == sum(range(60))
    assert threading.active_count() < 50


def test_call_and_driver_shorthands_time_each_step_by_its_name():
    with Controller() as controller:
        controller.register_role(
            Role("rm", worker_class=SlowScorer, init_kwargs={"value": 2.0, "seconds": 0.05})
        )
        with controller.dag("step 1"):
            rewards = controller.call("rm", "score", responses=["ab", "c"], name="reward")
            more = controller.call("rm", "score", responses=["xyz"], name="reward")
            total, count = controller.driver(
                lambda rewards, more: {"total": sum(rewards) + sum(more), "count": len(rewards) + len(more)},
                name="sum",
                outputs=("total", "count"),
                rewards=rewards,
                more=more,
            )
            single = controller.driver(lambda items: len(items), name="len", items=["only", "one"])
        assert rewards.get() == [4.0, 2.0] and total.get() == 12.0 and count.get() == 3
        timings = controller.last_step_timings()
        assert set(timings) == {"reward", "sum", "len"}
        assert timings["reward"] >= 0.1  # two calls named "reward", summed
        assert single.get() == 2  # one output: the channel holds the whole result


@pytest.mark.serial
def test_a_background_step_outlives_its_dag_block_and_keeps_the_role_order():
    """What asynchronous training builds on: step N's block ends while its background generation runs on,
    the next block reads it, and a later call on the same role still waits for it."""
    log: list[str] = []

    with Controller() as controller:
        controller.register_role(Role("a", worker_class=recorder(log)))
        start = time.perf_counter()
        with controller.dag("step 1"):
            ahead = controller.call("a", "act", tag="ahead", delay=0.3, name="gen", background=True)
            controller.driver(lambda: "quick", name="quick")
        assert time.perf_counter() - start < 0.25 and not ahead.ready()  # the block did not wait
        assert "gen" not in controller.last_step_timings()
        with controller.dag("step 2"):
            after = controller.call("a", "act", tag="after")  # same role: runs after the background call
            assert ahead.get() == "ahead"
        assert after.get() == "after" and log == ["ahead", "after"]
        assert controller.seconds(ahead) >= 0.3


def test_finished_steps_do_not_keep_earlier_steps_alive():
    """A finished node forgets the nodes it waited for: otherwise each role's last node chains back through
    every step of the run, with their output values, and the driver's memory grows every RL step."""
    import gc
    import weakref

    class Payload:
        pass

    class Consumer:
        def act(self, tag: object) -> None:
            return None

    with Controller() as controller:
        controller.register_role(Role("a", worker_class=Consumer))
        old: list[weakref.ref] = []
        for step in range(5):
            with controller.dag(f"step {step}"):
                made = controller.driver(lambda: Payload(), name="make")
                controller.step(role="a", method="act", inputs={"tag": made})
                controller.step(role="a", method="act", inputs={"tag": "second"})
            old.append(weakref.ref(made.get()))
            del made
        gc.collect()
        assert [ref() is None for ref in old[:-1]] == [True] * 4  # only the last step's value may remain
