"""The examples of docs/control_flow.md run as written.

Which blocks run is decided by an HTML comment on the line(s) just before a fenced block:

* ``<!-- runnable -->`` before a ```python block: executed, in document order, in ONE namespace shared by
  all blocks of the document (later examples use what earlier ones defined, e.g. ``model_dir``);
* ``<!-- runnable -->`` before a ```bash block: run with ``bash -e`` (``verl`` is the installed command);
* ``<!-- file: NAME -->`` before any block: its text is written to ``NAME`` when its turn comes (a recipe
  or a module the later examples import).

Unmarked blocks are illustrations and are not run (the ``--trace`` and Ray commands: the trace page and
the Ray backend have tests of their own). Everything runs in one fresh temporary directory; each block
must finish within ``BUDGET_S`` seconds.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[2] / "docs" / "control_flow.md"
BUDGET_S = 300  # a guard against a hang, not a speed target (a loaded 2-core machine is slow)

MARKER = re.compile(r"^<!--\s*(runnable|file:\s*(?P<name>\S+))\s*-->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    lang: str
    action: str  # "run" or "file"
    code: str
    filename: str | None = None

    @property
    def id(self) -> str:
        target = self.filename or self.lang
        return f"L{self.line}-{self.action}-{target}"


def marked_blocks(text: str) -> list[Block]:
    """Fenced blocks preceded (blank lines allowed) by a runnable / file marker, in document order."""
    blocks, marker, lines, i = [], None, text.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        fence = FENCE.match(line)
        if fence:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            if marker is not None:
                action, name = marker
                code = "\n".join(lines[i + 1 : end]) + "\n"
                blocks.append(Block(i + 1, fence.group(1), action, code, name))
            marker, i = None, end + 1
            continue
        found = MARKER.match(line.strip())
        if found:
            marker = ("file", found.group("name")) if found.group("name") else ("run", None)
        elif line.strip():
            marker = None  # a marker only applies to the block right after it
        i += 1
    return blocks


BLOCKS = marked_blocks(DOC.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """One directory and one namespace for the whole document, as a reader following it would have."""
    return tmp_path_factory.mktemp("control-flow-doc"), {"__name__": "__docs_example__"}


def test_the_document_has_runnable_examples():
    langs = {(b.action, b.lang) for b in BLOCKS}
    assert {("run", "python"), ("run", "bash"), ("file", "yaml"), ("file", "python")} <= langs


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.id)
def test_example(block: Block, workspace, monkeypatch):
    directory, namespace = workspace
    monkeypatch.chdir(directory)
    monkeypatch.syspath_prepend(str(directory))
    start = time.perf_counter()
    if block.action == "file":
        (directory / block.filename).write_text(block.code, encoding="utf-8")
    elif block.lang == "python":
        with time_limit(BUDGET_S, block):
            exec(compile(block.code, f"{DOC}:{block.line}", "exec"), namespace)
    elif block.lang == "bash":
        run_shell(block, directory)
    else:
        pytest.fail(f"{block.id}: don't know how to run a {block.lang!r} block")
    assert time.perf_counter() - start < BUDGET_S


def run_shell(block: Block, directory: Path) -> None:
    """``bash -e`` with the ``verl`` command of this interpreter first on PATH."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    try:
        result = subprocess.run(
            ["bash", "-e", "-c", block.code],
            cwd=directory,
            env=env,
            capture_output=True,
            text=True,
            timeout=BUDGET_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.id} ran past {BUDGET_S} s")
    assert result.returncode == 0, f"{block.id} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


class time_limit:
    """Interrupt a block that runs past its budget (SIGALRM: the main thread, Unix)."""

    def __init__(self, seconds: int, block: Block) -> None:
        self.seconds, self.block = seconds, block

    def _expire(self, signum, frame):
        raise TimeoutError(f"{self.block.id} ran past {self.seconds} s")

    def __enter__(self):
        self.previous = signal.signal(signal.SIGALRM, self._expire)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.previous)
