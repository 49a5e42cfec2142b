"""The critic role worker: :class:`CriticWorker`, PPO's value model (`verl.workers.critic.Critic`) for one
data-parallel rank. Re-exported by `verl.workers.roles`, beside the other role workers.
"""

from __future__ import annotations

from typing import Any

from verl.config import derive_sizes
from verl.config.backends import training_strategy
from verl.models import load_value_model
from verl.protocol import DataProto
from verl.single_controller import Dispatch, Worker, register
from verl.utils.precision import model_dtype, role_compute_dtype
from verl.workers.critic import Critic
from verl.workers.engine.update_loop import run_update
from verl.workers.errors import CRITIC_UPDATE_KNOBS, VALUES_KNOBS, explain_oom
from verl.workers.requests import UpdateRequest
from verl.workers.role_files import load_contents, save_role_checkpoint
from verl.workers.worker_setup import (
    attention_for,
    on_device,
    prepare_for_training,
    setup_process,
    trainer_config,
)


class CriticWorker(Worker):
    """The value model of PPO, built from ``critic.model`` (by default the actor's model directory).

    ``value_model`` is the HF token-classification model being trained, ``critic`` its `Critic`.
    """

    def __init__(self, config: Any, total_training_steps: int | None = None) -> None:
        config = trainer_config(config)
        self.config = config
        self.device = setup_process(config, self.rank)
        if total_training_steps is None:
            total_training_steps = config.trainer.total_training_steps or 1
        critic_cfg = config.critic
        model_cfg = critic_cfg.model
        path = model_cfg.path or config.actor_rollout_ref.model.path
        remove_padding = model_cfg.use_remove_padding
        if remove_padding is None:
            remove_padding = config.actor_rollout_ref.model.use_remove_padding
        self.sizes = derive_sizes(config)
        self.value_model = load_value_model(
            path,
            torch_dtype=model_cfg.torch_dtype,
            attn_implementation=attention_for(model_cfg.attn_implementation, remove_padding),
            trust_remote_code=model_cfg.trust_remote_code,
            key="critic.model.path" if model_cfg.path else "actor_rollout_ref.model.path",
            override_config=model_cfg.override_config,
            override_key="critic.model.override_config",
        ).to(self.device)
        optimizer, lr_scheduler = prepare_for_training(
            self.value_model, model_cfg, critic_cfg.optim, total_training_steps
        )
        sharded = training_strategy(config) == "fsdp2"
        compute = role_compute_dtype(
            model_cfg.fsdp_config,
            device=self.device,
            weights_dtype=model_dtype(self.value_model),
            sharded=sharded,
            key="critic.model.fsdp_config",
        )
        self.critic = Critic(
            self.value_model,
            critic_cfg,
            optimizer,
            lr_scheduler,
            seed=config.trainer.seed,
            remove_padding=remove_padding,
            compute_dtype=compute.dtype,
            fsdp_config=model_cfg.fsdp_config if sharded else None,
            fsdp_key="critic.model.fsdp_config",
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @explain_oom(*VALUES_KNOBS)
    @on_device
    def compute_values(self, data: DataProto) -> DataProto:
        values = self.critic.compute_values(
            data, self.config.critic.forward_micro_batch_size_per_gpu, self.sizes.critic_forward_max_tokens
        )
        return DataProto.from_dict(tensors={"values": values})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRICS)
    @explain_oom(*CRITIC_UPDATE_KNOBS)
    @on_device
    def update_critic(self, data: DataProto, request: UpdateRequest) -> dict[str, float]:
        """One value-model update on ``data`` (with returns); the ``critic/*`` metrics, the same on every rank."""
        sizes = request.sizes
        update = self.critic.plan_update(
            data,
            mini_batch_size=sizes.critic_mini_batch_samples,
            micro_batch_size=sizes.critic_micro_batch_samples,
            epochs=sizes.critic_ppo_epochs,
            max_tokens=sizes.critic_max_tokens,
        )
        return run_update(self.critic, update)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str, background: bool = False) -> None:
        self._save_thread = save_role_checkpoint(
            self.critic, self.config.critic.checkpoint, None, self.rank, path, background
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self.critic.load_checkpoint(path, self.rank, load_contents(self.config.critic.checkpoint))

    def get_state(self) -> dict[str, Any] | None:
        return self.critic.training_state() if self.critic.sharded or self.rank == 0 else None

    def set_state(self, state: dict[str, Any]) -> None:
        self.critic.load_training_state(state)
