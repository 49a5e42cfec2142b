"""Storage faults: a checkpoint damaged after its save is never loaded (a resume passes over it to the one
before and the run still matches an uninterrupted one), and a save that fills the disk stops the run with a
storage error, leaves nothing half-written, and the same command resumes once there is space. The full disk
is real: a small tmpfs (skipped where this process may not mount one)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid

import pytest
from test_resume import TOTAL_STEPS, metrics_by_step, overrides, reference, run_cli  # noqa: F401

from verl.utils.checkpoint import LATEST, checkpoint_damage

pytestmark = pytest.mark.slow


def test_a_truncated_latest_checkpoint_is_passed_over_and_the_run_still_matches(
    reference,  # noqa: F811
    tiny_model_dir,
    arithmetic_files,
    tmp_path,
):
    _, reward, expected, _ = reference
    args = overrides(tiny_model_dir, arithmetic_files, tmp_path, reward)
    code, _ = run_cli(args, kill_after_step=3)
    assert code == -signal.SIGKILL
    latest = int((tmp_path / LATEST).read_text())
    weights = tmp_path / f"global_step_{latest}" / "actor" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # the tail lost after the save
    code, stderr = run_cli(args)
    assert code == 0, stderr[-3000:]
    assert f"checkpoint {tmp_path / f'global_step_{latest}'} is damaged" in stderr
    assert f"{weights} has" in stderr and "truncated or rewritten" in stderr
    assert f"resumed from {tmp_path / f'global_step_{latest - 1}'}" in stderr
    assert (tmp_path / f"global_step_{latest}.damaged" / "actor" / "model.safetensors").is_file()
    resumed = metrics_by_step(tmp_path)
    for step in range(1, TOTAL_STEPS + 1):
        assert resumed[step] == expected[step], f"step {step} differs after passing over step {latest}"


def test_resuming_an_altered_checkpoint_by_name_is_refused(
    reference,  # noqa: F811
    tiny_model_dir,
    arithmetic_files,
    tmp_path,
):
    out, reward, _, _ = reference
    saved = tmp_path / "saved"
    shutil.copytree(out / "global_step_2", saved)
    optim = saved / "actor" / "optim.pt"
    data = bytearray(optim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte flipped: same size
    optim.write_bytes(bytes(data))
    args = overrides(
        tiny_model_dir, arithmetic_files, tmp_path / "run", reward, f"trainer.resume_mode={saved}"
    )
    code, stderr = run_cli(args)
    assert code == 3, stderr[-3000:]
    assert f"{optim} was altered after the save" in stderr and "nothing was loaded" in stderr
    assert "Traceback" not in stderr


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of a given size under tmp_path; grow(size) remounts it bigger, keeping its files."""
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    mounted = []

    def mount_with(size: int) -> None:
        options = f"{'remount,' if mounted else ''}size={size}"
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], capture_output=True
        )
        if result.returncode != 0:
            pytest.skip(
                f"cannot mount a tmpfs here ({result.stderr.decode().strip()}): a real full disk needs one"
            )
        mounted.append(size)

    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a real full disk needs a tmpfs, mounted as root")
    yield mount, mount_with
    if mounted:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.parametrize("async_save", [False, True], ids=["sync-save", "async-save"])
def test_a_full_disk_during_a_save_stops_cleanly_and_resumes_once_there_is_space(
    reference,  # noqa: F811
    tiny_model_dir,
    arithmetic_files,
    small_disk,
    async_save,
):
    out, reward, expected, _ = reference
    one = sum(p.stat().st_size for p in (out / "global_step_1").rglob("*") if p.is_file())
    disk, mount_with = small_disk
    mount_with(int(1.5 * one) + 256 * 1024)  # the first checkpoint fits, the second does not
    args = overrides(
        tiny_model_dir,
        arithmetic_files,
        disk / "run",
        reward,
        f"trainer.async_save={str(async_save).lower()}",
    )
    code, stderr = run_cli(args)
    assert code == 5, stderr[-3000:]
    assert "storage error: the checkpoint of step 2 could not be written" in stderr
    assert "No space left on device" in stderr and "Traceback" not in stderr
    assert f"the last complete checkpoint, {disk / 'run' / 'global_step_1'}, is intact" in stderr
    assert sorted(p.name for p in (disk / "run").glob("global_step_*")) == ["global_step_1"]  # no .tmp left
    assert checkpoint_damage(disk / "run" / "global_step_1") is None

    mount_with(4 * TOTAL_STEPS * one + 1024 * 1024)  # space made: the same command resumes
    code, stderr = run_cli(args)
    assert code == 0, stderr[-3000:]
    assert f"resumed from {disk / 'run' / 'global_step_1'}" in stderr
    resumed = metrics_by_step(disk / "run")
    for step in range(1, TOTAL_STEPS + 1):
        assert resumed[step] == expected[step], f"step {step} differs after the full disk"
