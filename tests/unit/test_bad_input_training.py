"""Bad input, handled, in training: a non-finite gradient skips the optimizer step, and an out-of-memory
error names the config knobs that would make the step fit.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from verl.single_controller.worker import registered_methods
from verl.workers.engine.optim import clip_and_step
from verl.workers.errors import ACTOR_UPDATE_KNOBS, explain_oom, oom_message

# ============================================================================ non-finite gradients


@pytest.mark.parametrize("poison", [math.nan, math.inf])
def test_non_finite_gradient_skips_the_step(poison):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.ones(1, 3)).sum() * poison
    loss.backward()
    grad_norm, stepped = clip_and_step(model, optimizer, grad_clip=1.0)
    assert not stepped and not math.isfinite(grad_norm)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())
    model(torch.ones(1, 3)).sum().backward()  # the next finite step is taken
    assert clip_and_step(model, optimizer, grad_clip=1.0)[1]


# ============================================================================ out of memory


class _Worker:
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "actor": {"ppo_micro_batch_size_per_gpu": 8},
                "model": {"enable_gradient_checkpointing": False},
            },
            "data": {"max_response_length": 512},
        }
    )

    def __init__(self, error: BaseException) -> None:
        self.error = error

    @explain_oom(*ACTOR_UPDATE_KNOBS)
    def update_actor(self, data: Any) -> Any:
        raise self.error


@pytest.mark.parametrize(
    "error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB\nmore"), MemoryError()]
)
def test_oom_names_the_knobs(error):
    with pytest.raises(type(error)) as info:
        _Worker(error).update_actor(None)
    message = str(info.value)
    assert message.startswith("_Worker.update_actor ran out of memory. To fit: ")
    assert "lower actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (now 8)" in message
    assert "set actor_rollout_ref.model.enable_gradient_checkpointing=true" in message
    assert "lower data.max_response_length (now 512)" in message
    assert "\n" not in message  # the one line a WorkerError keeps
    assert info.value.__cause__ is error


def test_oom_other_errors_pass_through_and_knobs_already_set_are_left_out():
    with pytest.raises(ValueError, match="^plain$"):
        _Worker(ValueError("plain")).update_actor(None)
    config = OmegaConf.create({"actor_rollout_ref": {"model": {"enable_gradient_checkpointing": True}}})
    message = oom_message("w", MemoryError(), ACTOR_UPDATE_KNOBS, config)
    assert "gradient_checkpointing" not in message  # already on
    # Settings the config does not hold are named without a value.
    assert (
        "To fit: lower actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu; lower "
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu; lower actor_rollout_ref.model.log_prob_chunk_size; "
        "lower data.max_response_length." in message
    )


def test_role_methods_keep_their_dispatch_and_explain_oom():
    from verl.workers.critic_worker import CriticWorker
    from verl.workers.roles import ActorRolloutRefWorker

    methods = {**registered_methods(ActorRolloutRefWorker), **registered_methods(CriticWorker)}
    for name in (
        "generate_sequences",
        "compute_log_prob",
        "compute_ref_log_prob",
        "update_actor",
        "compute_values",
        "update_critic",
    ):
        assert name in methods
        owner = ActorRolloutRefWorker if hasattr(ActorRolloutRefWorker, name) else CriticWorker
        assert getattr(owner, name).__code__.co_filename.endswith("errors.py"), name
