"""Issue 41: files handed to the user (a `verl export`, metrics, the checkpoint marker) are as readable as any
file they write: 0o666 less the umask, not mkstemp's / safetensors' 0600."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from verl.trainer.checkpointing import drop_metrics_after, export_hf
from verl.utils.checkpoint import (
    LATEST,
    atomic_write_bytes,
    current_umask,
    finalize_checkpoint,
    make_readable,
    readable_file_mode,
    tmp_step_dir,
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask() -> Iterator[Callable[[int], int]]:
    """Set the process umask for the test; the previous one is restored after."""
    before = os.umask(0o022)
    yield os.umask
    os.umask(before)


def test_the_umask_is_read_without_changing_it(umask) -> None:
    umask(0o027)
    assert current_umask() == 0o027 and current_umask() == 0o027
    assert readable_file_mode() == 0o640


def test_readable_atomic_writes_follow_the_umask(tmp_path, umask) -> None:
    atomic_write_bytes(tmp_path / "page.html", b"x", readable=True)
    assert mode(tmp_path / "page.html") == 0o644
    umask(0o077)
    atomic_write_bytes(tmp_path / "mine.html", b"x", readable=True)
    assert mode(tmp_path / "mine.html") == 0o600
    atomic_write_bytes(tmp_path / "private.yaml", b"x")  # not readable: private whatever the umask
    umask(0o022)
    atomic_write_bytes(tmp_path / "private2.yaml", b"x")
    assert mode(tmp_path / "private2.yaml") == 0o600


def test_make_readable_opens_files_and_directories_and_leaves_links(tmp_path, umask) -> None:
    (tmp_path / "d").mkdir(mode=0o700)
    (tmp_path / "d" / "w.safetensors").write_bytes(b"x")
    os.chmod(tmp_path / "d" / "w.safetensors", 0o600)
    target = tmp_path / "elsewhere"
    target.write_bytes(b"x")
    os.chmod(target, 0o600)
    (tmp_path / "d" / "link").symlink_to(target)
    make_readable(tmp_path / "d")
    assert mode(tmp_path / "d") == 0o755 and mode(tmp_path / "d" / "w.safetensors") == 0o644
    assert mode(target) == 0o600  # not the export's to change


def _checkpoint(root: Path, model_dir: Path) -> Path:
    """A minimal ``global_step_1`` with the actor's weights as a run writes them (safetensors, 0600)."""
    from safetensors.torch import save_model

    from verl.models import load_hf_model

    checkpoint = root / "global_step_1"
    (checkpoint / "actor").mkdir(parents=True)
    save_model(load_hf_model(model_dir), str(checkpoint / "actor" / "model.safetensors"))
    shutil.copytree(
        model_dir, checkpoint / "actor" / "huggingface", ignore=shutil.ignore_patterns("*.safetensors")
    )
    torch.save({"global_step": 1}, checkpoint / "trainer_state.pt")
    return checkpoint


def test_exported_weights_are_0644_under_umask_022(tiny_model_dir, tmp_path, umask) -> None:
    checkpoint = _checkpoint(tmp_path / "run", Path(tiny_model_dir))
    out = export_hf(checkpoint, tmp_path / "exported")
    weights = out / "model.safetensors"
    assert weights.is_file()
    assert mode(weights) == 0o644, oct(mode(weights))
    assert {p.name: mode(p) for p in out.iterdir()} == {p.name: 0o644 for p in out.iterdir()}
    # under a stricter umask the export is as private as the user's other files
    umask(0o077)
    out = export_hf(checkpoint, tmp_path / "exported2")
    assert mode(out / "model.safetensors") == 0o600


def test_the_marker_and_rewritten_metrics_are_readable(tmp_path, umask) -> None:
    tmp_step_dir(tmp_path, 3).mkdir()
    finalize_checkpoint(tmp_path, 3)
    assert (tmp_path / LATEST).read_text() == "3\n" and mode(tmp_path / LATEST) == 0o644
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n{"step": 4}\n')
    aside = drop_metrics_after(metrics, 3)
    assert metrics.read_text() == '{"step": 1}\n' and mode(metrics) == 0o644
    assert aside is not None and mode(aside) == 0o644
