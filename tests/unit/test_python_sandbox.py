"""The python tool's OS isolation (verl.tools.isolation): what a model's code cannot do to the machine.

Every escape here runs with the in-process audit hook removed from the bootstrap, so what stops it is the OS
layer alone (namespaces, the read-only view, the seccomp filter, the limits). docs/agent_loop.md ("Security")
points at each test. Where the host cannot isolate, the tests skip, unless VERL_REQUIRE_SANDBOX=1 (CI) makes
that a failure."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from verl.tools import ToolError, isolation, python_sandbox
from verl.tools.python_sandbox import PythonTool


def _host_isolates() -> str | None:
    try:
        isolation.require()
    except isolation.IsolationUnavailable as error:
        return str(error)
    return None


_WHY_NOT = _host_isolates()
if _WHY_NOT and os.environ.get("VERL_REQUIRE_SANDBOX") == "1":
    raise RuntimeError(f"VERL_REQUIRE_SANDBOX=1 but this host cannot isolate: {_WHY_NOT}")
needs_isolation = pytest.mark.skipif(_WHY_NOT is not None, reason=f"no OS isolation here: {_WHY_NOT}")


def run(tool: PythonTool, code: str) -> str:
    """The tool's answer: its output, or the error message the model would see."""
    try:
        response, _, _ = asyncio.run(tool.execute("t", {"code": code}))
    except ToolError as error:
        return f"ERROR {error}"
    return response.text


@pytest.fixture
def bare(monkeypatch) -> PythonTool:
    """An isolated tool whose bootstrap installs no audit hook and leaves subprocess alone."""
    bootstrap = python_sandbox._BOOTSTRAP
    assert "sys.addaudithook(" in bootstrap and "_posixsubprocess.fork_exec = fork_exec" in bootstrap
    bootstrap = bootstrap.replace("sys.addaudithook(", "(lambda hook: None)(")
    bootstrap = bootstrap.replace("_posixsubprocess.fork_exec = fork_exec", "")
    monkeypatch.setattr(python_sandbox, "_BOOTSTRAP", bootstrap)
    return PythonTool({"wall_time_s": 10})


@needs_isolation
def test_no_root_and_no_capabilities(bare):
    code = textwrap.dedent(
        """
        import os, socket
        print(os.getresuid(), os.getresgid(), os.getgroups(), os.getpid())  # no supplementary groups
        for name, attempt in [
            ('setuid 0', lambda: os.setuid(0)),
            ('raw socket', lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)),
            ('chroot', lambda: os.chroot('.')),
        ]:
            try:
                attempt()
                print(name, 'DONE')
            except OSError as error:
                print(name, error.errno)
        """
    )
    # uid/gid 65534 (nobody) and pid 2 (bubblewrap's init is 1): nothing else of the machine runs in there
    assert run(bare, code).splitlines() == [
        "(65534, 65534, 65534) (65534, 65534, 65534) [] 2",
        "setuid 0 22",  # EINVAL: there is no uid 0 in the sandbox's user namespace
        "raw socket 1",
        "chroot 1",
    ]


@needs_isolation
def test_the_trainer_cannot_be_signalled_reniced_or_pinned(bare):
    trainer = os.getpid()
    affinity = os.sched_getaffinity(0)
    niceness = os.getpriority(os.PRIO_PROCESS, trainer)
    code = textwrap.dedent(
        f"""
        import os, signal
        for name, attempt in [
            ('kill', lambda: os.kill({trainer}, signal.SIGKILL)),
            ('pidfd', lambda: os.pidfd_open({trainer})),
            ('pidfd self', lambda: os.pidfd_open(os.getpid())),
            ('renice', lambda: os.setpriority(os.PRIO_PROCESS, {trainer}, 19)),
            ('renice self', lambda: os.setpriority(os.PRIO_PROCESS, 0, 19)),
            ('renice all', lambda: os.setpriority(os.PRIO_USER, 0, 19)),
            ('pin', lambda: os.sched_setaffinity({trainer}, {{0}})),
            ('pin self', lambda: os.sched_setaffinity(0, {{0}})),
        ]:
            try:
                attempt()
                print(name, 'DONE')
            except OSError as error:
                print(name, error.errno)
        """
    )
    lines = run(bare, code).splitlines()
    # ESRCH (3): no such process in the sandbox's PID namespace; EPERM (1): refused by the seccomp filter
    assert lines == [
        "kill 3",
        "pidfd 1",
        "pidfd self 1",
        "renice 1",
        "renice self 1",
        "renice all 1",
        "pin 1",
        "pin self 1",
    ]
    assert os.sched_getaffinity(0) == affinity and os.getpriority(os.PRIO_PROCESS, trainer) == niceness


@needs_isolation
def test_no_device_nodes_fifos_or_new_processes(bare):
    code = textwrap.dedent(
        """
        import os, stat, subprocess
        for name, attempt in [
            ('block device', lambda: os.mknod('disk', 0o600 | stat.S_IFBLK, os.makedev(8, 0))),
            ('char device', lambda: os.mknod('mem', 0o600 | stat.S_IFCHR, os.makedev(1, 1))),
            ('fifo', lambda: os.mkfifo('pipe')),
            ('fork', os.fork),
            ('subprocess', lambda: subprocess.Popen(['/bin/true'])),
        ]:
            try:
                attempt()
                print(name, 'DONE')
            except OSError as error:
                print(name, error.errno)
        import threading
        t = threading.Thread(target=lambda: print('threads work'))
        t.start(); t.join()
        print(sorted(os.listdir('.')))
        """
    )
    assert run(bare, code).splitlines() == [
        "block device 1",
        "char device 1",
        "fifo 1",
        "fork 1",
        "subprocess 1",
        "threads work",
        "[]",
    ]


@needs_isolation
def test_a_read_only_view_with_nothing_of_the_hosts_files(bare, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("do not read")
    # (/tmp itself may be there: the parent of a virtual environment in /tmp, the one thing of it bound)
    hidden = [str(secret), "/etc/passwd", "/proc/sys", "/proc/sysrq-trigger", "/sys/kernel"]
    hidden += [str(Path(__file__).resolve())]
    hidden += [str(p) for p in (Path.home() / ".cache", Path.home() / ".ssh") if p.exists()]
    code = textwrap.dedent(
        f"""
        import os
        for path in {hidden!r}:
            print(os.path.exists(path))
        for path in ['/usr/evil', '/proc/sys/vm/drop_caches', '/dev/evil', '/evil', {str(tmp_path / "evil")!r}]:
            try:
                open(path, 'w').write('x')
                print('wrote', path)
            except OSError as error:
                print('refused', error.errno in (1, 2, 13, 30))
        open('mine.txt', 'w').write('ok')
        print(os.getcwd(), open('mine.txt').read())
        """
    )
    lines = run(bare, code).splitlines()
    assert lines[: len(hidden)] == ["False"] * len(hidden), hidden  # not even visible
    lines = lines[len(hidden) :]
    assert lines == ["refused True"] * 5 + ["/sandbox ok"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.txt"]


@needs_isolation
def test_no_network_even_without_the_audit_hook(bare):
    code = textwrap.dedent(
        """
        import socket
        for address in [('127.0.0.1', 9), ('10.0.0.1', 80), ('8.8.8.8', 53)]:
            s = socket.socket()
            s.settimeout(2)
            try:
                s.connect(address)
                print('connected')
            except OSError as error:
                print(type(error).__name__)
        print(sorted(name for _, name in socket.if_nameindex()))
        """
    )
    lines = run(bare, code).splitlines()
    assert lines[:3] == [
        "ConnectionRefusedError",
        "OSError",
        "OSError",
    ]  # a loopback of its own, nothing else
    assert lines[3] == "['lo']"


@needs_isolation
def test_limits_hold_inside(bare):
    tool = PythonTool({"memory_mb": 256, "disk_mb": 8, "file_size_mb": 4, "cpu_time_s": 1, "wall_time_s": 10})
    assert "MemoryError" in run(tool, "x = bytearray(1 << 30)")
    assert "File too large" in run(tool, "open('f', 'wb').write(b'x' * (8 << 20))")
    # many files, each under the file-size limit, stop at the work directory's size
    code = "for i in range(10):\n    open(f'f{i}', 'wb').write(b'x' * (3 << 20))"
    assert "No space left on device" in run(tool, code)
    assert "CPU time limit" in run(tool, "while True:\n    pass")
    assert run(tool, "print('still fine')") == "still fine\n"


@needs_isolation
def test_a_call_leaves_nothing_behind(bare):
    assert run(bare, "open('note.txt', 'w').write('x')\nprint('written')") == "written\n"
    assert run(bare, "import os\nprint(os.listdir('.'))") == "[]\n"


@needs_isolation
def test_an_ordinary_user_gets_the_same_isolation(tmp_path):
    """The trainer as a user without privileges (uid 1000 in a user namespace of its own): the sandbox still
    starts and holds."""
    if not shutil.which("unshare"):
        pytest.skip("no unshare(1) to run the trainer as an ordinary user")
    script = tmp_path / "probe.py"
    script.write_text(
        textwrap.dedent(
            """
            import asyncio, os
            from verl.tools.python_sandbox import PythonTool
            tool = PythonTool()
            code = "import os\\ntry:\\n    os.mknod('n', 0o600 | 0o060000, os.makedev(8, 0))\\nexcept OSError as e:\\n    print(os.getuid(), e.errno)"
            print(os.getuid(), asyncio.run(tool.execute('t', {'code': code}))[0].text, end='')
            """
        )
    )
    probe = subprocess.run(
        ["unshare", "--user", "--map-user=1000", "--map-group=1000", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0 and "unshare failed" in probe.stderr:
        pytest.skip(f"no nested user namespaces here: {probe.stderr.strip()}")
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout == "1000 65534 1\n"


def test_a_host_without_isolation_is_refused_with_the_fix(monkeypatch):
    isolation.require.cache_clear()
    monkeypatch.setattr(isolation, "find_bwrap", lambda: None)
    try:
        with pytest.raises(ValueError) as refused:
            PythonTool()
    finally:
        isolation.require.cache_clear()
    message = str(refused.value)
    assert "no bubblewrap (bwrap) found" in message and "apt install bubblewrap" in message
    assert "isolation: none" in message


def test_opting_out_warns_and_still_limits(caplog):
    with caplog.at_level(logging.WARNING, logger="verl.tools.python_sandbox"):
        tool = PythonTool({"isolation": "none"})
    assert tool.sandbox is None and "WITHOUT OS isolation" in caplog.text
    assert "starting processes is disabled" in run(tool, "import os\nos.system('true')")
    with pytest.raises(ValueError, match="isolation must be one of bwrap, none"):
        PythonTool({"isolation": "docker"})


def test_doctor_fails_a_python_tool_config_on_a_host_without_isolation(monkeypatch, capsys, tmp_path):
    from verl.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VERL_BWRAP", str(tmp_path / "no-bwrap"))
    isolation.require.cache_clear()
    try:
        code = main(["doctor", "actor_rollout_ref.rollout.multi_turn.tool_config_path=python"])
    finally:
        isolation.require.cache_clear()
    out = capsys.readouterr()
    assert code == 1
    assert f"python tool: no OS sandbox on this host: VERL_BWRAP={tmp_path / 'no-bwrap'}" in out.out + out.err
