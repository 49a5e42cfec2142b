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
