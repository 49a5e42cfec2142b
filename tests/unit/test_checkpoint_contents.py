"""verl's checkpoint.save_contents / load_contents: a checkpoint part holds what is asked, a resume reads
what is asked, and asking for a part the checkpoint lacks is a clear error."""

from __future__ import annotations

import pytest
import torch

from verl.config import load_config
from verl.errors import InputError
from verl.workers.engine.trained import checkpoint_contents
from verl.workers.roles import ActorRolloutRefWorker

ACTOR = "actor_rollout_ref.actor"


def worker(model_dir, *overrides: str) -> ActorRolloutRefWorker:
    config = load_config("grpo", [f"actor_rollout_ref.model.path={model_dir}", *overrides])
    return ActorRolloutRefWorker(config, need_ref=False)


def test_a_checkpoint_holds_what_save_contents_names(tiny_model_dir, tmp_path):
    full = worker(tiny_model_dir, f"{ACTOR}.checkpoint.save_contents=[model,optimizer,extra,hf_model]")
    full.save_checkpoint(str(tmp_path / "full"))
    assert checkpoint_contents(tmp_path / "full") == ["model", "optimizer", "extra"]
    hf = tmp_path / "full" / "huggingface"
    assert (hf / "model.safetensors").is_file() and (hf / "config.json").is_file()

    weights_only = worker(tiny_model_dir, f"{ACTOR}.checkpoint.save_contents=[model]")
    weights_only.save_checkpoint(str(tmp_path / "model"))
    part = tmp_path / "model"
    assert checkpoint_contents(part) == ["model"]
    assert not (part / "optim.pt").exists() and not (part / "rng_rank0.pt").exists()
    assert not (part / "huggingface" / "model.safetensors").exists()  # hf_model was not asked for

    # A resume that asks for the optimizer of a weights-only checkpoint is told what the checkpoint holds.
    with pytest.raises(InputError, match=r"holds model but not optimizer, extra"):
        worker(tiny_model_dir).load_checkpoint(str(part))
    reader = worker(tiny_model_dir, f"{ACTOR}.checkpoint.load_contents=[model]")
    with torch.no_grad():
        for p in reader.actor_model.parameters():
            p.add_(1.0)
    reader.load_checkpoint(str(part))
    saved = weights_only.actor_model.state_dict()
    assert all(torch.equal(v, saved[k]) for k, v in reader.actor_model.state_dict().items())


def test_unknown_contents_are_refused_with_the_key():
    from verl.config import ConfigError

    with pytest.raises(ConfigError, match=rf"{ACTOR}.checkpoint.save_contents=.*weights is not a part"):
        load_config("grpo", [f"{ACTOR}.checkpoint.save_contents=[model,weights]"])


def test_a_sharded_hf_model_is_written_in_the_weights_dtype_and_leaves_the_live_model_alone(
    tiny_model_dir, tmp_path
):
    """fsdp2 (one rank, a one-process group): the whole model is gathered from the shards into a fresh model
    built without a second initialisation, in the trained weights' dtype, with the live generation config."""
    from safetensors.torch import load_file

    sharded = worker(
        tiny_model_dir,
        f"{ACTOR}.strategy=fsdp2",
        "actor_rollout_ref.model.torch_dtype=bfloat16",
        f"{ACTOR}.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
    )
    sharded.actor_model.generation_config.update(do_sample=True, temperature=0.5)
    sharded.save_checkpoint(str(tmp_path / "ckpt"))
    hf = tmp_path / "ckpt" / "huggingface"
    weights = load_file(hf / "model.safetensors")
    assert weights and all(t.dtype == torch.bfloat16 for t in weights.values())
    assert '"dtype": "bfloat16"' in (hf / "config.json").read_text()
    assert '"temperature": 0.5' in (hf / "generation_config.json").read_text()
    assert str(sharded.actor_model.config.dtype).endswith("bfloat16")
    full = {k: v.full_tensor() for k, v in sharded.actor_model.state_dict().items()}
    assert all(torch.equal(weights[k], full[k]) for k in weights)


def test_a_failed_background_write_fails_the_save_instead_of_waiting_forever(tmp_path):
    import errno
    import os
    from concurrent.futures import Future
    from types import SimpleNamespace

    from verl.errors import StorageError
    from verl.trainer.checkpointing import Checkpointer
    from verl.workers.engine.trained import _write_part_or_fail

    shards: Future = Future()
    shards.set_exception(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    part = tmp_path / "global_step_3.tmp" / "actor"
    _write_part_or_fail(part, 1, {"shards": shards})
    assert not (part / "done_rank1").exists()
    _write_part_or_fail(part, 0, {})  # rank 0's part was written
    checkpointer = SimpleNamespace(root=tmp_path, run_id="run", keep=None, error=None)
    for method in ("_discard", "_storage_error"):  # the Checkpointer methods _finish reaches
        setattr(checkpointer, method, getattr(Checkpointer, method).__get__(checkpointer))
    Checkpointer._finish(checkpointer, 3, [part / "done_rank0", part / "done_rank1"])
    # A full disk: a storage error naming the step and the cause, and the unfinished checkpoint gone.
    assert isinstance(checkpointer.error, StorageError)
    assert "step 3" in str(checkpointer.error) and "[Errno 28] No space left on device" in str(
        checkpointer.error
    )
    assert "there is no earlier checkpoint" in str(checkpointer.error)
    assert not (tmp_path / "global_step_3.tmp").exists()


def test_a_failed_save_waits_for_the_background_writers_before_removing_its_directory(tmp_path, monkeypatch):
    """The driver's own write fails while a worker still writes its part in the background: the unfinished
    directory is removed only once that writer ended, or the writer recreates it (a ``.tmp`` left behind)."""
    import errno
    import os
    import threading
    import time
    from concurrent.futures import Future
    from types import SimpleNamespace

    from verl.errors import StorageError
    from verl.trainer.checkpointing import Checkpointer
    from verl.workers.engine.trained import _write_part_or_fail

    tmp = tmp_path / "global_step_2.tmp"

    class SlowGroup:
        world_size = 1

        def save_checkpoint(self, path, background):
            shards: Future = Future()

            def write_late():
                time.sleep(0.5)
                shards.set_exception(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))

            threading.Thread(target=write_late).start()
            threading.Thread(target=_write_part_or_fail, args=(tmp / "actor", 0, {"shards": shards})).start()

    config = SimpleNamespace(
        trainer=SimpleNamespace(
            default_local_dir=str(tmp_path),
            async_save=True,
            max_actor_ckpt_to_keep=None,
            max_critic_ckpt_to_keep=None,
        )
    )
    checkpointer = Checkpointer(config, {"actor_rollout": SlowGroup()}, run_id="run")

    def no_space(*args, **kwargs):  # the driver's own write (trainer_state.pt) finds the disk full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("verl.trainer.checkpointing.save_data", no_space)
    with pytest.raises(StorageError, match="step 2"):
        checkpointer.save(2, {"step": 2})
    assert not tmp.exists(), sorted(str(p) for p in tmp.rglob("*"))
