"""Checkpoints carry the size and SHA-256 of their files (verl.utils.checkpoint_integrity); a file truncated,
altered or removed after the save is named and the checkpoint is not loaded: ``resume_mode=auto`` passes over
it to the newest whole one (moved aside, never deleted), an explicit resume is refused. A save the file system
refuses (a full disk) leaves nothing half-written (verl.trainer.checkpointing)."""

from __future__ import annotations

import errno
import json
import os

import pytest
from test_run_dir import _config, digest, fake_run

from verl.errors import InputError, RunDirError, StorageError, describe_error
from verl.single_controller.errors import WorkerError
from verl.trainer.checkpointing import _storage_cause
from verl.trainer.run_dir import RunDirectory, plan_run
from verl.utils.checkpoint import CHECKPOINT_INFO, LATEST, checkpoint_damage


def test_a_checkpoint_records_every_file_and_is_whole_as_saved(tmp_path):
    fake_run(tmp_path, [1])
    ckpt = tmp_path / "global_step_1"
    files = json.loads((ckpt / CHECKPOINT_INFO).read_text())["files"]
    assert sorted(files) == ["actor/model.safetensors", "trainer_state.pt"]
    assert files["trainer_state.pt"]["bytes"] == len(b"state 1")
    assert checkpoint_damage(ckpt) is None


@pytest.mark.parametrize(
    "harm, said",
    [
        (lambda f: f.write_bytes(f.read_bytes()[:10]), "has 10 bytes, 64 when saved"),
        (
            lambda f: f.write_bytes(bytes([f.read_bytes()[0] ^ 1]) + f.read_bytes()[1:]),
            "was altered after the save",
        ),
        (lambda f: f.unlink(), "is missing"),
    ],
    ids=["truncated", "one-bit-flipped", "removed"],
)
def test_damage_names_the_file(tmp_path, harm, said):
    fake_run(tmp_path, [1])
    weights = tmp_path / "global_step_1" / "actor" / "model.safetensors"
    harm(weights)
    damage = checkpoint_damage(tmp_path / "global_step_1")
    assert str(weights) in damage and said in damage


def test_a_checkpoint_without_a_manifest_loads_unverified_and_a_broken_record_does_not(tmp_path):
    fake_run(tmp_path, [1])
    info = tmp_path / "global_step_1" / CHECKPOINT_INFO
    info.write_text(json.dumps({"run_id": "old", "step": 1}))  # written before checksums
    assert checkpoint_damage(tmp_path / "global_step_1") is None
    info.write_text('{"run_id": "x", "fi')  # cut short
    assert "cannot be read" in checkpoint_damage(tmp_path / "global_step_1")


def test_auto_resume_passes_over_damaged_checkpoints_and_moves_them_aside(tmp_path):
    root = tmp_path / "run"
    fake_run(root, [1, 2, 3])
    (root / "global_step_3" / "trainer_state.pt").write_bytes(b"state 3 but longer")
    (root / "global_step_2" / "actor" / "model.safetensors").write_bytes(b"")
    plan = plan_run(_config(root))
    assert plan.resume_from == root / "global_step_1"
    assert sorted(p.name for p in plan.damaged) == ["global_step_2", "global_step_3"]
    before = digest(root)
    run_dir = RunDirectory(root)
    run_dir.claim(_config(root))
    run_dir.release()
    # Nothing deleted: the damaged ones are beside, under another name, and the marker points at step 1.
    after = {name.replace(".damaged", ""): h for name, h in digest(root).items()}
    written = (LATEST, "run.json")
    assert {k: v for k, v in after.items() if k not in written} == {
        k: v for k, v in before.items() if k not in written
    }
    assert (root / "global_step_3.damaged").is_dir() and not (root / "global_step_3").exists()
    assert (root / LATEST).read_text().strip() == "1"
    assert plan_run(_config(root)).resume_from == root / "global_step_1"


def test_no_whole_checkpoint_is_an_error_naming_each_damage(tmp_path):
    root = tmp_path / "run"
    fake_run(root, [1])
    (root / "global_step_1" / "actor" / "model.safetensors").unlink()
    with pytest.raises(
        RunDirError, match=r"no checkpoint there is whole \(global_step_1: .*model.safetensors is missing"
    ):
        plan_run(_config(root))


def test_an_explicit_damaged_checkpoint_is_refused(tmp_path):
    fake_run(tmp_path / "a", [1])
    (tmp_path / "a" / "global_step_1" / "trainer_state.pt").write_bytes(b"state 9")  # same size, new bytes
    with pytest.raises(InputError, match=r"is damaged, .*trainer_state.pt was altered after the save"):
        plan_run(_config(tmp_path / "b", f"trainer.resume_mode={tmp_path / 'a' / 'global_step_1'}"))


def test_storage_causes_are_found_in_chains_and_in_worker_reports():
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/ckpt/optim.pt")
    assert _storage_cause(full) == "[Errno 28] No space left on device: /ckpt/optim.pt"
    wrapped = WorkerError("actor_rollout", 0, "save_checkpoint", describe_error(full), "exception", 123)
    assert _storage_cause(wrapped).startswith("[Errno 28] No space left on device")
    background = RuntimeError("actor rank 0: OSError: [Errno 28] No space left on device")
    assert _storage_cause(background) == "[Errno 28] No space left on device"
    rust = RuntimeError(
        "SafetensorError: Error while serializing: I/O error: No space left on device (os error 28)"
    )
    assert _storage_cause(rust) == "[Errno 28] No space left on device"
    assert _storage_cause(RuntimeError("[Errno 2] No such file")) is None  # not the file system's fault
    assert _storage_cause(ValueError("bad")) is None
    assert issubclass(StorageError, Exception) and StorageError.exit_code == 5
