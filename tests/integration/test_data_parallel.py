"""Data parallelism: one global batch trained on 1 process and on 2 (gloo, CPU) gives the same update,
with DDP (strategy dp) and with FSDP2 (strategy fsdp2: weights, gradients and optimizer state sharded).

Each of the 2 ranks gets its contiguous half of the batch, as the controller's DP_COMPUTE_PROTO
dispatch does. The updated weights must match the 1-process update within float tolerance (only the
order of floating-point sums differs), and the metrics must match too, identically on both ranks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch
import torch.multiprocessing as mp
from _ports import free_port
from _weights import assert_same_adam_update
from omegaconf import OmegaConf

from verl.config.schema import ActorConfig, CriticConfig, FSDPConfig
from verl.models import load_hf_model, load_value_model
from verl.protocol import DataProto
from verl.workers.actor import Actor
from verl.workers.critic import Critic
from verl.workers.engine.distributed import destroy_distributed, init_distributed
from verl.workers.engine.optim import build_lr_scheduler, build_optimizer

pytestmark = pytest.mark.slow

WORLD_SIZE = 2
BATCH, PROMPT_LEN, RESPONSE_LEN = 8, 4, 5


@dataclass(frozen=True)
class Case:
    """One update: ``mini_batch_size`` is global, ``micro_batch_size`` per rank (verl's convention)."""

    name: str
    role: str  # "actor" or "critic"
    mini_batch_size: int
    micro_batch_size: int
    overrides: tuple[str, ...] = ()


CASES = [
    # one mini-batch of 8: 2 ranks x 2 micro-batches of 2 (gradient accumulation under no_sync)
    Case("actor-one-mini", "actor", 8, 2),
    # two mini-batches of 4 (2 optimizer steps), per-sequence loss normalisation (global_num_seqs)
    Case("actor-two-minis", "actor", 4, 1, ("loss_agg_mode=seq-mean-token-mean",)),
    Case("critic-one-mini", "critic", 8, 2),
    Case("critic-two-minis-two-epochs", "critic", 4, 1, ("ppo_epochs=2",)),
]


def actor_config(overrides: tuple[str, ...]):
    base = [
        "use_kl_loss=true",
        "kl_loss_coef=0.1",
        "entropy_coeff=0.01",
        "shuffle=false",
        "optim.lr=1e-3",
        "optim.lr_warmup_steps=0",
    ]
    return OmegaConf.merge(OmegaConf.structured(ActorConfig), OmegaConf.from_dotlist(base + list(overrides)))


def critic_config(overrides: tuple[str, ...]):
    base = ["shuffle=false", "optim.lr=1e-3", "optim.lr_warmup_steps=0"]
    return OmegaConf.merge(OmegaConf.structured(CriticConfig), OmegaConf.from_dotlist(base + list(overrides)))


def reference_order(num_rows: int, world_size: int, mini_batch_size: int) -> list[int]:
    """Rows of the batch in the order 1 process must see them to form the same global mini-batches.

    Without shuffling, rank r's i-th mini-batch is the i-th block of ``mini_batch_size // world_size``
    rows of ITS OWN half; the global mini-batch i is those blocks of every rank together. So the
    1-process batch interleaves the ranks' blocks: with 8 rows, 2 ranks and mini-batches of 4 it is
    [0, 1, 4, 5, 2, 3, 6, 7] (global mini-batches {0, 1, 4, 5} and {2, 3, 6, 7}).
    """
    shard, local_mini = num_rows // world_size, mini_batch_size // world_size
    return [
        rank * shard + start + j
        for start in range(0, shard, local_mini)
        for rank in range(world_size)
        for j in range(local_mini)
    ]


def synthetic_batch(model_dir) -> dict[str, torch.Tensor]:
    """Prompts + responses of different lengths, with advantages, old / reference log-probs near the
    model's own (so ratios are not all clipped), and values / returns for the critic."""
    g = torch.Generator().manual_seed(0)
    model = load_hf_model(model_dir)
    vocab = model.config.vocab_size
    input_ids = torch.randint(3, vocab, (BATCH, PROMPT_LEN + RESPONSE_LEN), generator=g)
    response_lengths = torch.tensor([5, 1, 3, 5, 2, 4, 5, 1])  # ranks and mini-batches hold unequal tokens
    response_mask = (torch.arange(RESPONSE_LEN) < response_lengths[:, None]).float()
    attention_mask = torch.cat([torch.ones(BATCH, PROMPT_LEN), response_mask], dim=1).long()
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp_min(0),
        "responses": input_ids[:, PROMPT_LEN:],
        "response_mask": response_mask,
        "advantages": torch.randn(BATCH, RESPONSE_LEN, generator=g) * response_mask,
        "returns": torch.randn(BATCH, RESPONSE_LEN, generator=g) * response_mask,
        "values": 0.3 * torch.randn(BATCH, RESPONSE_LEN, generator=g) * response_mask,
    }
    log_probs, _ = Actor(model, actor_config(())).compute_log_prob(
        DataProto.from_dict(tensors=tensors), None, temperature=1.0
    )
    tensors["old_log_probs"] = log_probs + 0.3 * torch.randn(log_probs.shape, generator=g)
    tensors["ref_log_prob"] = log_probs + 0.2 * torch.randn(log_probs.shape, generator=g)
    return tensors


STRATEGIES = ("dp", "fsdp2")


def run_case(
    case: Case, model_dir, batch: dict[str, torch.Tensor], rank: int, world_size: int, strategy: str = "dp"
) -> dict:
    """Build the role, update it from this rank's contiguous part of the batch; weights and metrics
    (the full weights, gathered from the shards with fsdp2), and the role's log-probs / values of this
    rank's rows after the update."""
    if world_size == 1:
        batch = {k: v[reference_order(BATCH, WORLD_SIZE, case.mini_batch_size)] for k, v in batch.items()}
    shard = BATCH // world_size
    data = DataProto.from_dict(tensors={k: v[rank * shard : (rank + 1) * shard] for k, v in batch.items()})
    torch.manual_seed(0)  # the value head is freshly initialised: the same on every process
    if case.role == "actor":
        cfg = actor_config(case.overrides)
        model = load_hf_model(model_dir)
    else:
        cfg = critic_config(case.overrides)
        model = load_value_model(model_dir)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    optimizer = build_optimizer(model.parameters(), cfg.optim)
    scheduler = build_lr_scheduler(optimizer, cfg.optim, total_steps=1)
    # fp32 pinned: unset, FSDP2 computes in bf16 on a CPU with bf16 instructions, and the comparison is exact
    fp32 = {"mixed_precision": {"param_dtype": "fp32"}}
    fsdp = (
        {"fsdp_config": OmegaConf.merge(OmegaConf.structured(FSDPConfig), fp32)}
        if strategy == "fsdp2"
        else {}
    )
    if case.role == "actor":
        role = Actor(model, cfg, optimizer, scheduler, seed=0, **fsdp)
        metrics = role.update_policy(data, case.mini_batch_size, case.micro_batch_size, temperature=1.0)
        after = role.compute_log_prob(data, 1, temperature=1.0)[0]
    else:
        role = Critic(model, cfg, optimizer, scheduler, seed=0, **fsdp)
        metrics = role.update_critic(data, case.mini_batch_size, case.micro_batch_size, cfg.ppo_epochs or 1)
        after = role.compute_values(data, 1)
    weights = {k: full(v).detach().clone() for k, v in role.hf_model.state_dict().items()}
    moved = max((weights[k] - v).abs().max().item() for k, v in initial.items())
    return {"weights": weights, "metrics": metrics, "moved": moved, "after": after}


def full(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded parameter's whole value (a collective); a plain tensor as it is."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def unequal_shards_error(model_dir, batch: dict[str, torch.Tensor], rank: int) -> str:
    """The error an update raises on this rank when rank 0 holds 4 rows and rank 1 holds 2."""
    rows = 4 if rank == 0 else 2
    cfg = actor_config(())
    model = load_hf_model(model_dir)
    actor = Actor(model, cfg, build_optimizer(model.parameters(), cfg.optim))
    data = DataProto.from_dict(tensors={k: v[:rows] for k, v in batch.items()})
    try:
        actor.update_policy(data, mini_batch_size=4, micro_batch_size=2, temperature=1.0)
    except ValueError as error:
        return str(error)
    return "no error"


def _worker(rank: int, world_size: int, port: int, model_dir, batch, out_dir) -> None:
    """One spawned rank: join the gloo group, run every case, save what it got."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size)
    )
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)  # CPU kernels are reproducible only for a fixed thread count
    assert init_distributed("gloo")
    try:
        results = {
            (case.name, strategy): run_case(case, model_dir, batch, rank, world_size, strategy)
            for case in CASES
            for strategy in STRATEGIES
        }
        results["unequal-shards"] = unequal_shards_error(model_dir, batch, rank)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        destroy_distributed()


@pytest.fixture(scope="module")
def results(tiny_model_dir, tmp_path_factory):
    """{case: (1-process result, [rank 0 result, rank 1 result])}, all cases trained in one spawn;
    "unequal-shards": the error message of each rank."""
    batch = synthetic_batch(tiny_model_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = {case.name: run_case(case, tiny_model_dir, batch, 0, 1) for case in CASES}
    finally:
        torch.set_num_threads(threads)
    out_dir = tmp_path_factory.mktemp("dp")
    mp.spawn(_worker, args=(WORLD_SIZE, free_port(), tiny_model_dir, batch, str(out_dir)), nprocs=WORLD_SIZE)
    ranks = [torch.load(out_dir / f"rank{r}.pt") for r in range(WORLD_SIZE)]
    merged = {
        (case.name, strategy): (single[case.name], [r[case.name, strategy] for r in ranks])
        for case in CASES
        for strategy in STRATEGIES
    }
    merged["unequal-shards"] = [r["unequal-shards"] for r in ranks]
    return merged


def test_reference_order_interleaves_the_ranks_blocks():
    assert reference_order(8, 2, 8) == list(range(8))
    assert reference_order(8, 2, 4) == [0, 1, 4, 5, 2, 3, 6, 7]


def metric_atol(key: str) -> float:
    """Float tolerance. (The value clip fraction used to count last-bit ties inside the clip range and
    needed more; compute_value_loss now counts only tokens whose prediction was really clipped.)"""
    return 1e-6


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_two_processes_update_like_one(results, case, strategy):
    single, (rank0, rank1) = results[case.name, strategy]
    # Two ranks sum the gradients in another order than one process: rounding-level differences.
    assert_same_adam_update(single["weights"], rank0["weights"], lr=1e-3, optimizer_steps=2, close=1e-6)
    for key in single["weights"]:
        assert torch.equal(rank0["weights"][key], rank1["weights"][key]), f"ranks disagree on {key}"
    assert rank0["metrics"] == rank1["metrics"]
    assert rank0["metrics"].keys() == single["metrics"].keys()
    for key, expected in single["metrics"].items():
        assert rank0["metrics"][key] == pytest.approx(expected, rel=1e-5, abs=metric_atol(key)), key
    assert single["moved"] > 1e-4  # the update did change the weights
    # After the update, each rank's forward passes over its own rows (one row per pass) give the
    # 1-process values of those rows.
    order = reference_order(BATCH, WORLD_SIZE, case.mini_batch_size)
    shard = BATCH // WORLD_SIZE
    for rank, result in enumerate((rank0, rank1)):
        rows = [order.index(i) for i in range(rank * shard, (rank + 1) * shard)]
        torch.testing.assert_close(result["after"], single["after"][rows], atol=1e-4, rtol=1e-4)
    if case.role == "actor":  # the metric paths of the KL loss and the entropy bonus were taken
        assert single["metrics"]["actor/kl_loss"] > 0 and single["metrics"]["actor/entropy"] > 0
        assert single["metrics"]["actor/pg_clipfrac"] > 0


def test_unequal_shards_raise_on_every_rank(results):
    """A rank with more rows would run more optimizer steps and hang the others: all ranks raise instead."""
    for rank in range(WORLD_SIZE):
        assert "different sizes" in results["unequal-shards"][rank]


def test_mini_batch_must_divide_the_shard(tiny_model_dir):
    cfg = actor_config(())
    model = load_hf_model(tiny_model_dir)
    actor = Actor(model, cfg, build_optimizer(model.parameters(), cfg.optim))
    data = DataProto.from_dict(tensors=synthetic_batch(tiny_model_dir))
    with pytest.raises(ValueError, match="not divisible by its share of the mini-batch"):
        actor.update_policy(data, mini_batch_size=3, micro_batch_size=1, temperature=1.0)
