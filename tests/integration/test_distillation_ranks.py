"""On-policy distillation over 2 FSDP2 ranks (gloo, CPU): sharded teachers score each rank's half of a batch as
one unsharded process scores the whole, even when a rank has no sample for one of the teachers (it makes a pass
it drops, so the other rank's gathers are answered), and a distillation update's metrics, min and max included,
are the one-process update's."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from _ports import free_port
from omegaconf import OmegaConf

from verl.algorithms.distillation import DistillationLossOptions
from verl.config.schema import ActorConfig, FSDPConfig
from verl.models import load_hf_model, make_tiny_model
from verl.models.loading import load_tokenizer
from verl.protocol import DataProto
from verl.workers.actor import Actor
from verl.workers.engine.distributed import destroy_distributed, init_distributed
from verl.workers.engine.optim import build_optimizer
from verl.workers.teacher import Teacher, Teachers, TeacherSpec

pytestmark = pytest.mark.slow

WORLD_SIZE, ROWS, PROMPT, RESPONSE = 2, 8, 4, 5
SOURCES = np.array(["a", "a", "a", "a", "a", "b", "b", "a"], dtype=object)  # rank 0's half: no "b"
FP32 = {"mixed_precision": {"param_dtype": "fp32"}}


def synthetic_batch(vocab: int) -> DataProto:
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 3, 4, 2, 5, 1, 4, 3])
    mask = (torch.arange(RESPONSE)[None] < lengths[:, None]).long()
    input_ids = torch.randint(3, vocab, (ROWS, PROMPT + RESPONSE), generator=g)
    input_ids[:, PROMPT:] *= mask
    attention = torch.cat([torch.ones(ROWS, PROMPT, dtype=torch.long), mask], dim=1)
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp_min(0),
        "responses": input_ids[:, PROMPT:],
        "response_mask": mask,
        "advantages": torch.zeros(ROWS, RESPONSE),
    }
    return DataProto.from_dict(tensors=tensors, non_tensors={"data_source": SOURCES})


def teachers(model_dir, other_dir, sharded: bool) -> Teachers:
    tokenizer = load_tokenizer(str(model_dir))
    fsdp = OmegaConf.merge(OmegaConf.structured(FSDPConfig), FP32)
    built = {}
    for key, path in (("a", model_dir), ("b", other_dir)):
        teacher = Teacher(TeacherSpec(key, key, str(path)), tokenizer, attn_implementation="eager")
        teacher.place_like_reference(
            fsdp, torch.device("cpu"), sharded=sharded, key="actor_rollout_ref.ref.fsdp_config"
        )
        built[key] = teacher
    return Teachers(built)


def update(model_dir, data: DataProto, sharded: bool) -> dict[str, float]:
    torch.manual_seed(0)
    model = load_hf_model(model_dir, attn_implementation="eager")
    cfg = OmegaConf.merge(OmegaConf.structured(ActorConfig), {"shuffle": False, "optim": {"lr": 1e-3}})
    fsdp = {"fsdp_config": OmegaConf.merge(OmegaConf.structured(FSDPConfig), FP32)} if sharded else {}
    options = DistillationLossOptions.of(
        {"loss_mode": "forward_kl_topk", "topk": 4, "use_task_rewards": False}
    )
    actor = Actor(
        model, cfg, build_optimizer(model.parameters(), cfg.optim), seed=0, distillation=options, **fsdp
    )
    return actor.update_policy(data, mini_batch_size=ROWS, micro_batch_size=2, temperature=1.0)


def _rank(rank: int, port: int, model_dir, other_dir, data: DataProto, out_dir: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE)
    )
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ["VERL_COLLECTIVE_TIMEOUT_S"] = "120"  # a rank left waiting for a pass fails, not hangs
    torch.set_num_threads(1)
    assert init_distributed("gloo")
    try:
        half = data.select_idxs(np.arange(rank * ROWS // 2, (rank + 1) * ROWS // 2))
        scores = teachers(model_dir, other_dir, sharded=True).score(half.select(), topk=4)
        metrics = update(model_dir, half, sharded=True)
        torch.save(
            {"scores": dict(scores.batch), "metrics": metrics}, os.path.join(out_dir, f"rank{rank}.pt")
        )
    finally:
        destroy_distributed()


def test_sharded_teachers_and_update_over_two_ranks_match_one_process(tiny_model_dir, tmp_path):
    other = make_tiny_model(
        tmp_path / "other", seed=7, hidden_size=64, num_hidden_layers=2, intermediate_size=128
    )
    data = synthetic_batch(load_hf_model(tiny_model_dir).config.vocab_size)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        whole = teachers(tiny_model_dir, other, sharded=False).score(data, topk=4)
        data = data.union(whole)
        single = update(tiny_model_dir, data, sharded=False)
    finally:
        torch.set_num_threads(threads)
    mp.spawn(_rank, args=(free_port(), tiny_model_dir, other, data, str(tmp_path)), nprocs=WORLD_SIZE)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD_SIZE)]
    for name in ("teacher_logprobs", "teacher_ids"):
        sharded = torch.cat([r["scores"][name] for r in ranks])
        torch.testing.assert_close(sharded.float(), whole.batch[name].float(), atol=1e-5, rtol=0, msg=name)
    assert ranks[0]["metrics"] == ranks[1]["metrics"]
    keys = [k for k in single if k.startswith("actor/distillation/")]
    assert {"actor/distillation/loss_min", "actor/distillation/teacher_mass_max"} <= set(keys)
    for key in keys:
        assert ranks[0]["metrics"][key] == pytest.approx(single[key], rel=1e-5, abs=1e-6), key
