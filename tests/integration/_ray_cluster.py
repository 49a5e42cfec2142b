"""A two-node Ray cluster on this machine, started with ``ray start`` as an operator would: a head and a
worker node, each with a resource of its own (``verl_head`` / ``verl_worker``) so a test can tell them apart.

Each node runs in its own session (so a test can kill one node's processes and nothing else) under a temp
dir of its own: ``ray.init()`` elsewhere on the machine does not find this cluster, and ``ray stop`` (which
stops every Ray process on the machine) is never needed. Ray 2.60 turns token authentication on when a head
starts; every process that talks to the cluster gets ``RAY_AUTH_MODE=token``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HEALTH_CHECK = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "5"}
"""Ray declares a silent node dead after failure_threshold x period (defaults 5 x 3 s); shorter here so a
node-loss test does not wait, and long enough that a node busy beside the other tests of a parallel run
(pytest -n 2) is not taken for dead. A real cluster keeps Ray's defaults."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalRayCluster:
    """``start()`` the head and the worker node; ``env()`` is what a client needs; ``stop()`` kills both."""

    def __init__(self, cpus_per_node: int = 2) -> None:
        # A short path: Ray's unix sockets live under it, and a socket path may not exceed 107 bytes.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="verl-ray-", dir="/tmp"))
        self.port = _free_port()
        self.dashboard_port = _free_port()
        self.cpus_per_node = cpus_per_node
        self.sessions: dict[str, int] = {}  # node name -> the process group of its Ray processes

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a process that joins the cluster (``RAY_ADDRESS`` included)."""
        return {**os.environ, "RAY_AUTH_MODE": "token", "RAY_ADDRESS": self.address, **HEALTH_CHECK, **extra}

    def _ray_start(self, name: str, *args: str) -> int:
        """``ray start`` in a session of its own; its daemons stay in that session, whose id (the pid of
        ``ray start``) is returned: what names this node's processes, whatever else runs on the machine."""
        env = self.env()
        env.pop("RAY_ADDRESS")
        for _attempt in range(2):
            command = [
                sys.executable, "-m", "ray.scripts.scripts", "start", "--node-ip-address=127.0.0.1",
                f"--num-cpus={self.cpus_per_node}", f"--resources={json.dumps({f'verl_{name}': 1})}",
                f"--temp-dir={self.temp_dir}", "--object-store-memory=300000000", "--disable-usage-stats",
                # ports of their own: Ray's fixed defaults (52365 for the job agent...) may be held by another
                # Ray instance on this machine, and then the node runs without the agent that runs jobs
                f"--dashboard-agent-listen-port={_free_port()}", f"--dashboard-agent-grpc-port={_free_port()}",
                f"--metrics-export-port={_free_port()}", f"--runtime-env-agent-port={_free_port()}", *args,
            ]  # fmt: skip
            process = subprocess.Popen(
                command,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            try:
                stdout, stderr = process.communicate(timeout=180)
            except subprocess.TimeoutExpired:
                process.kill()
                stdout, stderr = process.communicate()
            if process.returncode == 0:
                return process.pid
            self._kill_session(process.pid)  # whatever daemons it started: none is left behind
            # Ray waits a fixed 30 s for a new raylet to register: on a loaded 2-core machine that can pass
            # (seen in CI with another job running), and the node is started once more.
            if "timed out during startup" not in stdout + stderr:
                break
        raise RuntimeError(f"ray start ({name}) failed:\n{stdout}\n{stderr}")

    def start(self) -> LocalRayCluster:
        self.start_node("head")
        self.start_node("worker")
        self.wait_for_job_server()
        return self

    def wait_for_job_server(self, timeout: float = 180) -> None:
        """Until a job runs: the head's job agent registers some seconds after `ray start` returns, and a
        job submitted before that is refused ("No available agent to submit job")."""
        command = [sys.executable, "-m", "ray.scripts.scripts", "job", "submit", f"--address={self.dashboard}",
                   "--", "python", "-c", "pass"]  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            job = subprocess.run(command, env=self.env(), capture_output=True, text=True, timeout=timeout)
            if job.returncode == 0:
                return
            if "No available agent" not in job.stdout + job.stderr or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the job server does not run jobs:\n{job.stdout[-2000:]}\n{job.stderr[-2000:]}"
                )
            time.sleep(2)

    def start_node(self, name: str) -> None:
        """Start the head (``name="head"``) or a worker node joining it."""
        if name == "head":
            session = self._ray_start(
                name, "--head", f"--port={self.port}", "--dashboard-host=127.0.0.1",
                f"--dashboard-port={self.dashboard_port}", f"--ray-client-server-port={_free_port()}",
            )  # fmt: skip
        else:
            session = self._ray_start(name, f"--address={self.address}")
        # (not "the raylet that is new": another test's Ray instance may start at the same time)
        assert session in _session_ids(), f"no raylet of the {name} node runs in its session {session}"
        self.sessions[name] = session
        self.wait_for_nodes(len(self.sessions))

    def kill_node(self, name: str) -> None:
        """SIGKILL every process of one node (its daemons and its workers), as a machine that loses power."""
        self._kill_session(self.sessions.pop(name))

    @staticmethod
    def _kill_session(session: int, timeout: float = 30) -> None:
        """SIGKILL every process of a session, and wait until none is left (their ports free again)."""
        # By session, not process group: Ray puts each worker process in a process group of its own.
        deadline = time.monotonic() + timeout
        while pids := _pids_where(lambda pid: os.getsid(pid) == session and not _is_zombie(pid)):
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)

    def client_json(self, expression: str, imports: str = "") -> Any:
        """``expression`` evaluated by a client of the cluster (a process of its own), as JSON."""
        code = f"import json, ray; {imports}ray.init(logging_level='ERROR'); print(json.dumps({expression}))"
        out = subprocess.run(
            [sys.executable, "-c", code],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return json.loads(out.stdout.strip().splitlines()[-1])

    def nodes(self) -> list[dict]:
        """``ray.nodes()`` as seen by a client of the cluster."""
        return self.client_json("ray.nodes()")

    def node_id(self, name: str) -> str:
        """The id of the alive node that holds resource ``verl_<name>``."""
        (node,) = [n for n in self.nodes() if n["Alive"] and f"verl_{name}" in n["Resources"]]
        return node["NodeID"]

    def wait_for_nodes(self, count: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while sum(node["Alive"] for node in self.nodes()) != count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster did not reach {count} alive nodes in {timeout} s")
            time.sleep(1)

    def stop(self) -> None:
        for name in list(self.sessions):
            self.kill_node(name)


def _pids_where(test) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and test(int(entry.name)):
                pids.append(int(entry.name))
        except OSError:  # the process ended meanwhile
            pass
    return pids


def _is_zombie(pid: int) -> bool:
    """Ended, not yet reaped by its parent: it holds no port any more."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def _is_raylet(pid: int) -> bool:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"/raylet/raylet")


def _session_ids() -> set[int]:
    """Session ids of the Ray node daemons (raylets) running now."""
    return {os.getsid(pid) for pid in _pids_where(_is_raylet)}
