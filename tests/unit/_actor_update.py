"""A tiny actor's update on a hand-made GRPO batch, recording the gradient the optimizer is given and every
micro-batch loss call (tests of the zero-advantage skip and of rollout correction)."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import OmegaConf

from verl.config.schema import ActorConfig
from verl.models import load_hf_model
from verl.protocol import DataProto
from verl.workers.actor import Actor
from verl.workers.engine import update_loop
from verl.workers.engine.optim import build_optimizer

ROWS, PROMPT, RESPONSE = 8, 4, 6
_CLIP_AND_STEP = update_loop.clip_and_step
"""the real step, taken once: a test that updates twice patches over its own first patch, and a recorder
that called the patched function would write the second update's gradient into the first one's record"""


def batch(vocab: int, zero_groups: tuple[int, ...], off_policy: bool) -> DataProto:
    """Two GRPO groups of 4 samples over one prompt each; the groups in ``zero_groups`` have equal rewards
    (advantage 0 on every token). Response lengths differ (right padding)."""
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, vocab, (2, PROMPT), generator=g).repeat_interleave(4, dim=0)
    lengths = torch.tensor([6, 3, 5, 2, 4, 6, 1, 5])
    mask = (torch.arange(RESPONSE)[None] < lengths[:, None]).long()
    responses = torch.randint(3, vocab, (ROWS, RESPONSE), generator=g) * mask
    attention = torch.cat([torch.ones(ROWS, PROMPT, dtype=torch.long), mask], dim=1)
    advantages = torch.tensor([1.2, -0.4, -0.4, -0.4, 0.9, -0.3, -0.3, -0.3])[:, None] * mask
    for group in zero_groups:
        advantages[4 * group : 4 * group + 4] = 0.0
    tensors = {
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp_min(0),
        "responses": responses,
        "response_mask": mask,
        "advantages": advantages.float(),
    }
    if off_policy:
        tensors["old_log_probs"] = -2.0 + 0.1 * torch.randn(ROWS, RESPONSE, generator=g) * mask
    return DataProto.from_dict(tensors)


def update(
    monkeypatch,
    model_dir,
    data: DataProto,
    skip: bool,
    micro: int | None,
    measure_entropy: bool,
    bypass_correction: Any = None,
    **keys,
):
    torch.manual_seed(0)
    model = load_hf_model(model_dir, attn_implementation="eager")
    cfg = OmegaConf.merge(
        OmegaConf.structured(ActorConfig),
        {"skip_zero_advantage": skip, "shuffle": False, "optim": {"lr": 1e-2, "lr_warmup_steps": 0}, **keys},
    )
    actor = Actor(model, cfg, build_optimizer(model.parameters(), cfg.optim), seed=0)
    calls: list[tuple[int, bool]] = []
    loss = actor.micro_batch_loss

    def counting(micro, *args, **kwargs):
        calls.append((len(micro), torch.is_grad_enabled()))
        return loss(micro, *args, **kwargs)

    actor.micro_batch_loss = counting
    grads: dict[str, torch.Tensor] = {}

    def recording(trained, optimizer, grad_clip):  # the gradient the optimizer is given
        grads.update(
            {n: p.grad.detach().clone() for n, p in trained.named_parameters() if p.grad is not None}
        )
        return _CLIP_AND_STEP(trained, optimizer, grad_clip)

    monkeypatch.setattr(update_loop, "clip_and_step", recording)
    metrics = actor.update_policy(
        data,
        mini_batch_size=ROWS,
        micro_batch_size=micro,
        temperature=1.0,
        measure_entropy=measure_entropy,
        bypass_correction=bypass_correction,
    )
    return grads, metrics, calls
