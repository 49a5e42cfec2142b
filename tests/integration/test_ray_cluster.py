"""verl on a real two-node Ray cluster (``ray start`` head + worker on this machine): a job submitted with
``ray job submit`` spreads its ranks over both nodes and learns; a driver joining ``RAY_ADDRESS`` survives
losing the worker node (``trainer.on_worker_failure=restart``) or stops naming what was lost (``fail``); a
cluster too small for ``trainer.nnodes`` is refused instead of waited on forever."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

from tests.integration._ray_cluster import LocalRayCluster  # noqa: E402
from verl.utils.checkpoint import LATEST  # noqa: E402

# One cluster for the module: under pytest-xdist (-n 2 --dist loadfile) a module's tests run in one process, in
# turn. (The group mark is for --dist loadgroup, which pytest 9.2 with xdist 3.8 no longer honours; conftest.py
# orders grouped modules first.)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray-cluster")]

EVEN_DIGITS = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """The share of the response's characters that are even digits: a random tiny model learns it in steps."""
    chars = [c for c in solution_str if not c.isspace()]
    return sum(c in "02468" for c in chars) / max(len(chars), 1)
'''


@pytest.fixture(scope="module")
def cluster():
    nodes = LocalRayCluster()
    try:
        yield nodes.start()
    finally:
        nodes.stop()


@pytest.fixture(scope="module")
def job_args(tiny_model_dir, arithmetic_files, tmp_path_factory) -> list[str]:
    """verl's command line for GRPO on 2 nodes x 1 rank, with a reward the tiny model learns in ~15 steps."""
    reward = tmp_path_factory.mktemp("reward") / "even_digits.py"
    reward.write_text(EVEN_DIGITS)
    train, test = arithmetic_files
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={train}",
        f"data.val_files={test}",
        "data.train_batch_size=8",
        "data.max_prompt_length=32",
        "data.max_response_length=8",
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        f"custom_reward_function.path={reward}",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.val_before_train=false",
        "trainer.logger=[console,jsonl]",
        "trainer.backend=ray",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=1",
    ]


def _trained(run_dir: Path) -> list[dict]:
    """The metrics lines of the training steps (those with a score), in the order they were logged."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "critic/score/mean" in r]


def _scores(run_dir: Path) -> list[float]:
    return [r["critic/score/mean"] for r in _trained(run_dir)]


def _placement(output: str, role: str) -> dict[int, str]:
    """``{rank: short node id}`` from the start-up line ``  <role>: rank 0 on node <id> (<ip>), ...``."""
    (line,) = [line for line in output.splitlines() if line.strip().startswith(f"{role}: ")]
    placed = {}
    for ranks, node in re.findall(r"(ranks? [\d,-]+) on node (\w+)", line):
        for part in ranks.split(" ", 1)[1].split(","):
            low, _, high = part.partition("-")
            for rank in range(int(low), int(high or low) + 1):
                placed[rank] = node
    return placed


def _host_nodes(cluster: LocalRayCluster) -> set[str]:
    """The nodes Ray's state API says verl's worker processes ran on (alive or finished)."""
    hosts = "[a.node_id for a in list_actors(filters=[('class_name', '=', 'WorkerHost')], limit=1000, detail=True)]"
    return set(cluster.client_json(hosts, imports="from ray.util.state import list_actors; "))


def test_job_submit_spreads_the_ranks_over_both_nodes_and_learns(cluster, job_args, tmp_path):
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "ray.scripts.scripts", "job", "submit", f"--address={cluster.dashboard}", "--",
        "python", "-m", "verl.trainer.main_ppo", *job_args, "trainer.total_training_steps=16",
        f"trainer.default_local_dir={run_dir}",
    ]  # fmt: skip
    job = subprocess.run(command, env=cluster.env(), capture_output=True, text=True, timeout=900)
    output = job.stdout + job.stderr
    assert job.returncode == 0, output[-4000:]

    head, worker = cluster.node_id("head"), cluster.node_id("worker")
    placed = _placement(output, "actor_rollout")
    assert sorted(placed) == [0, 1] and set(placed.values()) == {head[:8], worker[:8]}, placed  # one per node
    assert {head, worker} <= _host_nodes(cluster)  # Ray's own record agrees

    scores = _scores(run_dir)  # the two ranks' gradients meet in a gloo all-reduce across the nodes
    assert len(scores) == 16
    first, last = sum(scores[:3]) / 3, sum(scores[-3:]) / 3
    assert last > first + 0.4, f"the reward did not rise: {[round(s, 2) for s in scores]}"


class _Driver:
    """verl's launcher run here, joined to the cluster by RAY_ADDRESS; its output collected as it comes."""

    def __init__(self, cluster: LocalRayCluster, args: list[str], run_dir: Path) -> None:
        self.run_dir = run_dir
        self.process = subprocess.Popen(
            [sys.executable, "-m", "verl.trainer.main_ppo", *args, f"trainer.default_local_dir={run_dir}"],
            env=cluster.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True)
        self.reader.start()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for_step(self, step: int) -> None:
        metrics = self.run_dir / "metrics.jsonl"
        deadline = time.monotonic() + 600
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= step):
            assert self.process.poll() is None, self.output[-4000:]
            assert time.monotonic() < deadline, f"the run did not reach step {step}"
            time.sleep(0.5)

    def finish(self, timeout: float = 600) -> int:
        try:
            self.process.wait(timeout=timeout)
        finally:
            self.process.kill()
            self.reader.join(timeout=30)
        return self.process.returncode


def _start_and_lose_the_worker(cluster: LocalRayCluster, args: list[str], run_dir: Path, after_step: int):
    """Kill the worker node after ``after_step``; the exit code, the output, the node and how long it took."""
    # asked first: the question starts a Ray client, seconds in which the run goes on
    worker = cluster.node_id("worker")
    driver = _Driver(cluster, args, run_dir)
    driver.wait_for_step(after_step)
    cluster.kill_node("worker")
    killed = time.monotonic()
    assert driver.process.poll() is None, "the run ended before the node was lost: give it more steps"
    try:
        code = driver.finish()
    finally:
        cluster.start_node("worker")  # the next test gets two nodes again
    return code, driver.output, worker, time.monotonic() - killed


def test_losing_the_worker_node_restarts_its_ranks_on_the_head(cluster, job_args, tmp_path):
    args = [*job_args, "trainer.total_training_steps=16", "trainer.on_worker_failure=restart"]
    code, output, worker, _ = _start_and_lose_the_worker(cluster, args, tmp_path / "run", after_step=2)
    assert code == 0, output[-4000:]
    assert re.search(
        rf"node {worker[:8]} at [\d.]+ left the cluster, taking actor_rollout rank \d", output
    ), output[-4000:]
    assert "restarting role 'actor_rollout'" in output
    assert len(_scores(tmp_path / "run")) == 16  # every step trained, the lost ones again after the restart


def test_losing_the_worker_node_with_fail_names_what_was_lost_and_the_rerun_resumes_from_disk(
    cluster, job_args, tmp_path
):
    args = [
        *job_args,
        "trainer.total_training_steps=20",
        "trainer.on_worker_failure=fail",
        "trainer.save_freq=2",
    ]
    code, output, worker, seconds = _start_and_lose_the_worker(cluster, args, tmp_path / "run", after_step=3)
    assert code == 1, output[-4000:]
    failures = [line for line in output.splitlines() if line.startswith("run failed: ")]
    assert len(failures) == 1, output[-4000:]
    (failure,) = failures
    # the first call to meet the loss names its rank; the node's line names every rank that was on it
    assert re.search(rf"rank \d \(pid \d+, node {worker[:8]} at [\d.]+\) died in \w+", failure), failure
    assert re.search(
        rf"node {worker[:8]} at [\d.]+ left the cluster, taking actor_rollout rank \d", failure
    ), failure
    assert seconds < 120, f"the run took {seconds:.0f} s to stop after the node was lost"

    # the node is back (a new one, as after a reboot): the same command resumes from the newest checkpoint
    latest = int((tmp_path / "run" / LATEST).read_text())
    assert latest >= 2 and latest % 2 == 0
    rerun = _Driver(cluster, [*args, f"trainer.total_training_steps={latest + 2}"], tmp_path / "run")
    assert rerun.finish() == 0, rerun.output[-4000:]
    assert f"resumed from {tmp_path / 'run' / f'global_step_{latest}'}" in rerun.output, rerun.output[-4000:]
    assert sorted(set(_placement(rerun.output, "actor_rollout").values())) == sorted(
        {cluster.node_id("head")[:8], cluster.node_id("worker")[:8]}
    )  # on both nodes again
    assert [r["step"] for r in _trained(tmp_path / "run")][-2:] == [latest + 1, latest + 2]


def test_too_few_nodes_is_refused_with_what_the_cluster_has(cluster):
    code = (
        "from verl.single_controller.ray import RayWorkerGroup\n"
        "from verl.single_controller.ray_placement import Hosts\n"
        "from verl.single_controller.worker import Worker\n"
        "Hosts.placement_timeout_s = 3\n"
        "try:\n"
        "    RayWorkerGroup(Worker, 3, name='actor', nnodes=3)\n"
        "except Exception as error:\n"
        "    print(type(error).__name__, error)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=cluster.env(), capture_output=True, text=True, timeout=300
    )
    assert "ClusterError the Ray cluster cannot place 3 worker(s) on 3 different nodes" in out.stdout, out
    assert len(re.findall(r" at [\d.]+ with CPU 2", out.stdout)) == 2, (
        out.stdout
    )  # both alive nodes, described


def test_a_stopped_worker_is_named_with_its_stack_by_the_heartbeats(cluster, job_args, tmp_path):
    """SIGSTOP one actor rank mid-run: with trainer.heartbeat_timeout_s=15 the run stops (exit 1) long before
    the 1800 s call deadline, naming that rank, its node, its silence, and where its Python code was."""
    args = [*job_args, "trainer.total_training_steps=40", "trainer.heartbeat_timeout_s=15"]
    driver = _Driver(cluster, args, tmp_path / "run")
    stopped = None
    try:
        driver.wait_for_step(2)
        (line,) = [line for line in driver.lines if line.strip().startswith("actor_rollout: ")]
        pids = [int(pid) for group in re.findall(r"pids? ([\d,]+)\)", line) for pid in group.split(",")]
        stopped = pids[-1]  # the last rank's process
        os.kill(stopped, signal.SIGSTOP)
        start = time.monotonic()
        code = driver.finish(timeout=300)
        seconds = time.monotonic() - start
    finally:
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert code == 1, driver.output[-4000:]
    failures = [line for line in driver.lines if line.startswith("run failed: ")]
    assert len(failures) == 1, driver.output[-4000:]
    (failure,) = failures
    assert re.search(
        rf"role 'actor_rollout' rank 1 \(pid {stopped}, node \w+ at [\d.]+\) stopped responding", failure
    )
    assert "answered no heartbeat for 15 s (trainer.heartbeat_timeout_s)" in failure, failure
    stack = driver.output.split("Its Python stack (py-spy dump):", 1)[1]
    # the worker's thread, where it was stopped: inside a method (verl/workers/roles.py), or between calls
    assert re.search(r'Thread \d+ \(\w+\): "verl-actor_rollout_\d+"\n\s+\S', stack), stack[:3000]
    assert seconds < 15 + 90, f"{seconds:.0f} s from the stop to the exit"
