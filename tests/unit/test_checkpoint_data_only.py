"""Checkpoints are data, never code (verl.utils.checkpoint): every file a resume or an export reads is read
as tensors and plain containers, so a planted pickle (a payload calling ``os.system``) is refused with one
line naming the file, and never runs, even with its checksums rewritten to match. Older checkpoints (numpy
arrays pickled whole) still load. A checkpoint directory that is not what its place says (renamed into
another step's name, or copied in from another run) is refused, naming it."""

from __future__ import annotations

import json
import os
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from test_run_dir import _config, fake_run

from verl.errors import InputError, RunDirError
from verl.protocol import DataProto
from verl.trainer.checkpointing import Checkpointer
from verl.trainer.run_dir import plan_run
from verl.utils.checkpoint import (
    CHECKPOINT_INFO,
    checkpoint_damage,
    load_trainer_state,
    rng_state,
    save_data,
    set_rng_state,
    write_checkpoint_info,
)
from verl.utils.checkpoint_data import check_sharded_files, load_data, to_data
from verl.utils.checkpoint_integrity import MANIFEST_KEY, manifest_of


class Payload:
    """Unpickled, it creates ``marker``: what a planted checkpoint file carries."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))


class NumpyLoad:
    """Unpickled, it calls ``numpy.load(npy, allow_pickle=True)``: numpy, but not an array to rebuild."""

    def __init__(self, npy: Path) -> None:
        self.npy = str(npy)

    def __reduce__(self):
        return (np.load, (self.npy, None, True))


def plant(path: Path, marker: Path) -> None:
    """``path`` replaced by a torch file whose pickle runs ``touch marker``, and its checkpoint's checksums
    rewritten to match (as whoever plants it would)."""
    torch.save({"global_step": 2, "rng": Payload(marker)}, path)
    for ckpt in (path.parent, path.parent.parent):
        info = ckpt / CHECKPOINT_INFO
        if info.is_file():
            record = json.loads(info.read_text())
            record[MANIFEST_KEY] = manifest_of(ckpt, skip=(CHECKPOINT_INFO,))
            info.write_text(json.dumps(record))


def test_the_planted_payload_is_live(tmp_path):
    """The payload used below does run when unpickled in full (what ``weights_only=False`` did)."""
    marker = tmp_path / "MARKER"
    plant(tmp_path / "trainer_state.pt", marker)
    torch.load(tmp_path / "trainer_state.pt", weights_only=False)
    assert marker.exists()


# ---------------------------------------------------------------- the format: data that loads without code


def sample_state() -> dict:
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    batch = DataProto(
        batch={"ids": torch.arange(6).reshape(2, 3)},
        non_tensor_batch={
            "uid": np.array(["a", "b"], dtype=object),
            "info": np.array([{"i": 1, "tags": ["x"]}, None], dtype=object),
            "score": np.array([0.5, 1.5], dtype=np.float32),
        },
        meta_info={"temperature": 1.0, "n": np.int64(8)},
    )
    return {
        "global_step": 4,
        "rng": rng_state(),
        "sampler": {"epoch": 1, "position": 2},
        "kl_ctrl": {"value": 0.1},
        "restarts": {"actor_rollout": 1},
        "batch_source": {"pending": [batch], "queued": [], "pool": {"rows": {"u": [{"tokens": [1, 2]}]}}},
        "grid": np.arange(12, dtype=np.uint32).reshape(3, 4),
        "pair": (1, "two", 3.0),
        "seen": {"a", "b"},
    }


def test_the_new_format_loads_with_plain_weights_only_and_round_trips(tmp_path):
    state = sample_state()
    save_data(state, tmp_path / "trainer_state.pt")
    torch.load(tmp_path / "trainer_state.pt", weights_only=True)  # no allowlist needed: data only
    loaded = load_data(tmp_path / "trainer_state.pt")
    assert loaded["global_step"] == 4 and loaded["pair"] == (1, "two", 3.0) and loaded["seen"] == {"a", "b"}
    assert loaded["grid"].dtype == np.uint32 and np.array_equal(loaded["grid"], state["grid"])
    batch = loaded["batch_source"]["pending"][0]
    assert isinstance(batch, DataProto) and torch.equal(batch.batch["ids"], torch.arange(6).reshape(2, 3))
    assert (
        batch.non_tensor_batch["info"][0] == {"i": 1, "tags": ["x"]}
        and batch.non_tensor_batch["info"][1] is None
    )
    assert batch.non_tensor_batch["score"].dtype == np.float32
    assert batch.meta_info["n"] == 8 and isinstance(batch.meta_info["n"], np.int64)
    # the RNG states restore exactly: the same draws as right after the save
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(loaded["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_a_state_that_would_need_code_is_refused_when_saved(tmp_path):
    with pytest.raises(TypeError, match=r"state\['kl_ctrl'\]\['fn'\] is a .*Payload"):
        to_data({"kl_ctrl": {"fn": Payload(tmp_path / "x")}})


def test_an_old_format_file_with_numpy_loads(tmp_path):
    """Before this format, trainer_state.pt and rng_rank<r>.pt held numpy's RNG state pickled whole."""
    old = {
        "global_step": 2,
        "rng": rng_state(),
        "lr": np.float64(0.5),
        "batch": sample_state()["batch_source"],
    }
    torch.save(old, tmp_path / "trainer_state.pt")
    loaded = load_trainer_state(tmp_path)
    assert isinstance(loaded["rng"]["numpy"][1], np.ndarray) and loaded["lr"] == 0.5
    assert isinstance(loaded["batch"]["pending"][0], DataProto)
    set_rng_state(loaded["rng"])


# ---------------------------------------------------------------- payloads are refused and never run


def test_a_payload_in_trainer_state_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "MARKER"
    plant(tmp_path / "trainer_state.pt", marker)
    with pytest.raises(
        InputError, match=r"trainer_state\.pt holds a pickle that could run code .*posix\.system"
    ):
        load_trainer_state(tmp_path)
    assert not marker.exists()


def test_a_payload_dressed_as_numpy_is_refused(tmp_path):
    marker, npy = tmp_path / "MARKER", tmp_path / "innocent.npy"
    np.save(npy, np.array([Payload(marker)], dtype=object), allow_pickle=True)
    torch.save({"rng": NumpyLoad(npy)}, tmp_path / "rng_rank0.pt")
    with pytest.raises(InputError, match=r"rng_rank0\.pt .*could run code .*numpy\.load"):
        load_data(tmp_path / "rng_rank0.pt")
    assert not marker.exists()


def test_a_non_zip_file_is_refused_without_unpickling(tmp_path):
    """torch's pre-1.6 format (not a zip), which verl never wrote, or anything else put in a file's place."""
    marker = tmp_path / "MARKER"
    torch.save({"x": Payload(marker)}, tmp_path / "optim.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(InputError, match=r"optim\.pt is not a whole checkpoint file"):
        load_data(tmp_path / "optim.pt")
    assert not marker.exists()
    (tmp_path / "optim.pt").write_bytes(b"\0" * 4096)
    with pytest.raises(InputError, match=r"optim\.pt is not a whole checkpoint file"):
        load_data(tmp_path / "optim.pt")


def test_a_dataproto_file_with_a_payload_is_refused(tmp_path):
    marker = tmp_path / "MARKER"
    torch.save(DataProto(meta_info={"x": Payload(marker)}), tmp_path / "batch.pt")
    with pytest.raises(InputError, match="could run code"):
        DataProto.load_from_disk(str(tmp_path / "batch.pt"))
    assert not marker.exists()


def test_unreadable_files_are_one_line_input_errors(tmp_path):
    save_data({"global_step": 1}, tmp_path / "trainer_state.pt")
    data = (tmp_path / "trainer_state.pt").read_bytes()
    (tmp_path / "trainer_state.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"trainer_state\.pt is not a whole checkpoint file") as info:
        load_trainer_state(tmp_path)
    assert "\n" not in str(info.value)
    with pytest.raises(InputError, match=r"trainer_state\.pt is missing"):
        load_trainer_state(tmp_path / "nowhere")
    save_data([1, 2], tmp_path / "trainer_state.pt")
    with pytest.raises(InputError, match="holds no trainer state"):
        load_trainer_state(tmp_path)


@pytest.mark.parametrize("name", ["optim.pt", "rng_rank0.pt"])
def test_a_payload_in_a_role_part_is_refused_on_resume_and_never_runs(tiny_model_dir, tmp_path, name):
    from verl.config import load_config
    from verl.workers.engine.trained import checkpoint_contents
    from verl.workers.roles import ActorRolloutRefWorker

    config = load_config("grpo", [f"actor_rollout_ref.model.path={tiny_model_dir}"])
    worker = ActorRolloutRefWorker(config, need_ref=False)
    part = tmp_path / "actor"
    worker.save_checkpoint(str(part))
    worker.load_checkpoint(str(part))  # the new format loads back
    marker = tmp_path / "MARKER"
    plant(part / name, marker)
    with pytest.raises(InputError, match=rf"{name} holds a pickle that could run code"):
        worker.load_checkpoint(str(part))
    if name == "optim.pt":
        with pytest.raises(InputError, match="could run code"):
            checkpoint_contents(part)
    assert not marker.exists()


# ---------------------------------------------------------------- the sharded layout (DCP)


def dcp_part(part: Path, lr) -> None:
    import torch.distributed.checkpoint as dcp

    model = torch.nn.Linear(3, 2)
    state = {"model": model.state_dict(), "optim": {"param_groups": [{"lr": lr, "params": ["weight"]}]}}
    dcp.save(state, checkpoint_id=str(part / "model_optim"), no_dist=True)


def test_a_whole_sharded_part_passes(tmp_path):
    dcp_part(tmp_path, 0.1)
    check_sharded_files(tmp_path)
    check_sharded_files(tmp_path / "elsewhere")  # no sharded files: nothing to check


def test_a_payload_as_the_sharded_index_is_refused(tmp_path):
    marker = tmp_path / "MARKER"
    (tmp_path / "model_optim").mkdir()
    (tmp_path / "model_optim" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(InputError, match=r"\.metadata holds a pickle that could run code .*posix\.system"):
        check_sharded_files(tmp_path)
    assert not marker.exists()


def test_a_payload_as_a_sharded_value_is_refused(tmp_path):
    marker = tmp_path / "MARKER"
    dcp_part(tmp_path, Payload(marker))
    assert not marker.exists()
    with pytest.raises(InputError, match=r"\.distcp holds a pickle that could run code"):
        check_sharded_files(tmp_path)
    assert not marker.exists()


# ---------------------------------------------------------------- checkpoints that are not what their place says


def test_swapped_step_directories_are_refused_naming_the_directory(tmp_path):
    root = tmp_path / "run"
    fake_run(root, [1, 2])
    one, two = root / "global_step_1", root / "global_step_2"
    one.rename(root / "swap")
    two.rename(one)
    (root / "swap").rename(two)
    with pytest.raises(InputError, match=r"global_step_2 holds step 1, not step 2 as its name says"):
        plan_run(_config(root))
    with pytest.raises(InputError, match=r"global_step_1 holds step 2"):
        plan_run(_config(tmp_path / "new", f"trainer.resume_mode={one}"))


def test_a_trainer_state_of_another_step_is_refused_on_resume(tmp_path):
    """A checkpoint without checkpoint.json (older) is checked by the step its trainer_state.pt records."""
    ckpt = tmp_path / "global_step_4"
    ckpt.mkdir()
    save_data({"global_step": 2}, ckpt / "trainer_state.pt")
    checkpointer = Checkpointer(_config(tmp_path), {}, "run-a")
    with pytest.raises(InputError, match=r"global_step_4 holds step 2, not step 4"):
        checkpointer.resume(ckpt)
    (ckpt.rename(tmp_path / "global_step_2"))
    assert checkpointer.resume(tmp_path / "global_step_2")["global_step"] == 2


def test_a_checkpoint_copied_in_from_another_run_is_refused(tmp_path):
    root = tmp_path / "run"
    fake_run(root, [1, 2], run_id="run-a")
    (root / "run.json").write_text(json.dumps({"run_id": "run-a"}))
    assert plan_run(_config(root)).resume_from == root / "global_step_2"  # its own: resumed
    write_checkpoint_info(root / "global_step_2", "run-b", 2)
    with pytest.raises(RunDirError, match=r"global_step_2 was written by run run-b, not by run run-a"):
        plan_run(_config(root))
    # resumed from where it is, into a new directory, it starts a new run
    assert plan_run(_config(tmp_path / "new", f"trainer.resume_mode={root / 'global_step_2'}")).resume_from


def test_a_file_linked_outside_the_checkpoint_is_damage(tmp_path):
    root = tmp_path / "run"
    fake_run(root, [1])
    outside = tmp_path / "outside.pt"
    outside.write_bytes(b"state 1")  # the same bytes: the checksum alone would pass it
    state = root / "global_step_1" / "trainer_state.pt"
    state.unlink()
    state.symlink_to(outside)
    damage = checkpoint_damage(root / "global_step_1")
    assert str(state) in damage and "symbolic link" in damage and "outside the checkpoint" in damage
    with pytest.raises(InputError, match="symbolic link"):
        plan_run(_config(tmp_path / "new", f"trainer.resume_mode={root / 'global_step_1'}"))
