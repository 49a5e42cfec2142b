"""The Controller on the Ray backend: the same DAG semantics with workers in their own processes."""

import os
import time

import pytest

ray = pytest.importorskip("ray")

from verl import Controller, Role  # noqa: E402
from verl.single_controller.flow import StepError  # noqa: E402


class SlowScorer:
    def __init__(self, value: float) -> None:
        self.value = value

    def score(self, responses: list[str]) -> dict:
        start = time.time()
        time.sleep(1.0)
        return {
            "scores": [self.value * len(r) for r in responses],
            "pid": os.getpid(),
            "span": (start, time.time()),
        }


class Generator:
    def generate(self, prompt: list[str]) -> list[str]:
        return [p.upper() for p in prompt]

    def crash(self) -> None:
        os._exit(3)  # the process dies, as on a segfault or OOM kill


@pytest.fixture(scope="module")
def controller():
    with Controller(backend="ray", trace=True) as ctl:
        ctl.register_role(Role("actor", "actor", worker_class=Generator))
        ctl.register_role(Role("critic", "critic", worker_class=SlowScorer, init_kwargs={"value": 0.5}))
        ctl.register_role(Role("rm", "reward_model", worker_class=SlowScorer, init_kwargs={"value": 1.0}))
        yield ctl


@pytest.mark.serial
def test_independent_steps_on_ray_workers_overlap(controller):
    # warm up: the first call on a fresh Ray actor pays for imports
    controller.step(role="critic", method="score", inputs={"responses": ["x"]}, outputs=["scores"]).wait()
    controller.step(role="rm", method="score", inputs={"responses": ["x"]}, outputs=["scores"]).wait()
    start = time.perf_counter()
    with controller.dag("seed step"):
        samples = controller.step(
            role="actor", method="generate", inputs={"prompt": ["ab", "c"]}, outputs=["responses"]
        )
        critic = controller.step(
            role="critic",
            method="score",
            inputs={"responses": samples["responses"]},
            outputs=["scores", "pid", "span"],
        )
        rm = controller.step(
            role="rm",
            method="score",
            inputs={"responses": samples["responses"]},
            outputs=["scores", "pid", "span"],
        )
    elapsed = time.perf_counter() - start
    assert critic["scores"].get() == [1.0, 0.5] and rm["scores"].get() == [2.0, 1.0]
    # two 1-second steps in two other processes: about 1 s, not 2 s
    assert 0.95 < elapsed < 1.7, elapsed
    assert len({critic["pid"].get(), rm["pid"].get(), os.getpid()}) == 3
    (c0, c1), (r0, r1) = critic["span"].get(), rm["span"].get()
    assert min(c1, r1) > max(c0, r0), "the two scoring calls did not overlap in time"
    dag = controller.recorder.dags[-1]
    assert {e.transport for e in dag.edges} == {"cross-process"}
    assert all(node.process.startswith("ray pid") for node in dag.nodes)


def test_a_dead_worker_fails_its_step_with_role_rank_and_cause(controller):
    failed = controller.step(role="actor", method="crash", outputs=["nothing"])
    independent = controller.step(role="rm", method="score", inputs={"responses": ["ok"]}, outputs=["scores"])
    with pytest.raises(StepError) as info:
        failed.wait()
    message = str(info.value)
    assert "role 'actor' rank 0" in message and "died" in message, message
    assert independent["scores"].get() == [2.0]  # the other branch is not disturbed


@pytest.mark.serial
def test_info_logging_splits_a_ray_steps_time_into_workers_and_moving_data(controller, caplog):
    import logging
    import re

    controller._flow_log.seen.clear()  # earlier tests ran these steps (unlogged)
    with caplog.at_level(logging.INFO, logger="verl.dataflow"):
        out = controller.step(
            role="critic", method="score", inputs={"responses": ["x" * 100] * 1000}, outputs=["scores"]
        )
        out.wait()
    (message,) = [r.getMessage() for r in caplog.records if r.name == "verl.dataflow"]
    match = re.search(r"\((\d+\.\d+) s: (\d+\.\d+) s in the workers, (\d+\.\d+) s moving data\)", message)
    assert match, message
    total, worker, _ = (float(g) for g in match.groups())
    assert 1.0 <= worker <= total  # the scorer sleeps 1 s in its process
