"""Sizes derived from a TrainerConfig (samples per step, gradient accumulation, ...), never written back."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from verl.config.backends import training_strategy
from verl.config.errors import ConfigError


@dataclass(frozen=True)
class DerivedSizes:
    """Batch arithmetic of one RL step, derived once from a TrainerConfig and never written back into it."""

    prompts_per_step: int
    """data.train_batch_size"""
    samples_per_step: int
    """prompts_per_step * rollout.n"""
    mini_batch_samples: int
    """samples per optimizer step: ppo_mini_batch_size * rollout.n"""
    micro_batch_samples: int
    """samples per forward/backward pass: ppo_micro_batch_size_per_gpu, or the whole mini-batch"""
    grad_accum_steps: int
    """micro-batches per optimizer step on each data-parallel worker: its share of the mini-batch
    (mini_batch_samples // dp_size) over micro_batch_samples, rounded up (ppo_micro_batch_size_per_gpu is per
    worker, as in verl)"""
    optimizer_steps_per_rl_step: int
    """ppo_epochs * train_batch_size // ppo_mini_batch_size"""
    critic_mini_batch_samples: int = 0
    """samples per critic optimizer step: critic.ppo_mini_batch_size (or the actor's) * rollout.n"""
    critic_micro_batch_samples: int = 0
    """samples per critic forward/backward pass"""
    critic_ppo_epochs: int = 0
    """critic passes over the batch per RL step (critic.ppo_epochs, or the actor's)"""
    dp_size: int = 1
    """data-parallel workers of the actor and critic: trainer.nnodes * trainer.n_gpus_per_node"""
    strategy: str = "dp"
    """how they hold the model: fsdp2 (sharded) or dp (each the whole model)"""
    actor_max_tokens: int | None = None
    """real tokens per actor update micro-batch (use_dynamic_bsz), or None: micro_batch_samples rows"""
    log_prob_max_tokens: int | None = None
    """real tokens per micro-batch of the old log-prob pass, or None (rows)"""
    ref_max_tokens: int | None = None
    """real tokens per micro-batch of the reference log-prob pass, or None (rows)"""
    critic_max_tokens: int | None = None
    """real tokens per critic update micro-batch, or None (rows)"""
    critic_forward_max_tokens: int | None = None
    """real tokens per micro-batch of the value pass, or None (rows)"""

    def describe(self) -> str:
        """Readable multi-line summary for logs."""
        n = self.samples_per_step // self.prompts_per_step
        mini_batches = self.samples_per_step // self.mini_batch_samples
        epochs = self.optimizer_steps_per_rl_step // mini_batches

        def plural(count: int, word: str, suffix: str = "s") -> str:
            return f"{count} {word}{'' if count == 1 else suffix}"

        return "\n".join(
            [
                "batch sizes per RL step:",
                f"  prompts per step:            {self.prompts_per_step}",
                f"  samples per step:            {self.samples_per_step} ({self.prompts_per_step} prompts x {n})",
                f"  mini-batch:                  {self.mini_batch_samples} samples"
                f" ({plural(mini_batches, 'mini-batch', 'es')} per epoch)",
                (
                    f"  micro-batch:                 up to {self.actor_max_tokens} tokens (use_dynamic_bsz)"
                    if self.actor_max_tokens
                    else f"  micro-batch:                 {self.micro_batch_samples} samples"
                    f" ({plural(self.grad_accum_steps, 'gradient-accumulation step')} per mini-batch"
                    + (" on each worker)" if self.dp_size > 1 else ")")
                ),
                f"  optimizer steps per RL step: {self.optimizer_steps_per_rl_step}"
                f" ({plural(epochs, 'epoch')} x {plural(mini_batches, 'mini-batch', 'es')})",
                f"  data-parallel workers:       {self.dp_size}"
                + (f" ({self.samples_per_step // self.dp_size} samples each)" if self.dp_size > 1 else ""),
                f"  training strategy:           {self.strategy}"
                + (" (weights, gradients and optimizer state sharded)" if self.strategy == "fsdp2" else ""),
            ]
        )


def _mini_and_micro(
    prompts: int, n: int, mini_prompts: int, micro_cfg: int | None, section: str
) -> tuple[int, int]:
    """Samples per mini-batch and per micro-batch of one trained role, with the divisibility checks."""
    if mini_prompts < 1:
        raise ConfigError(f"{section}.ppo_mini_batch_size must be >= 1, got {mini_prompts}")
    if prompts % mini_prompts:
        raise ConfigError(
            f"data.train_batch_size ({prompts}) must be divisible by {section}.ppo_mini_batch_size ({mini_prompts})"
        )
    mini = mini_prompts * n
    micro = mini if micro_cfg is None else int(micro_cfg)
    if micro < 1 or mini % micro:
        raise ConfigError(
            f"{section}.ppo_micro_batch_size_per_gpu ({micro}) must divide the mini-batch of "
            f"{mini} samples (ppo_mini_batch_size {mini_prompts} x rollout.n {n})"
        )
    return mini, micro


def derive_sizes(cfg: DictConfig) -> DerivedSizes:
    """Compute the batch arithmetic of a TrainerConfig (see :class:`DerivedSizes`); raises ConfigError."""
    data, actor, rollout = cfg.data, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    prompts = int(data.train_batch_size)
    n = int(rollout.n)
    mini_prompts = int(actor.ppo_mini_batch_size)
    if prompts < 1 or n < 1 or mini_prompts < 1:
        raise ConfigError(
            "data.train_batch_size, actor_rollout_ref.rollout.n and actor_rollout_ref.actor.ppo_mini_batch_size "
            f"must be >= 1; got {prompts}, {n}, {mini_prompts}"
        )
    mini, micro = _mini_and_micro(
        prompts, n, mini_prompts, actor.ppo_micro_batch_size_per_gpu, "actor_rollout_ref.actor"
    )
    trainer = cfg.get("trainer")
    dp = int(trainer.nnodes * trainer.n_gpus_per_node) if trainer is not None else 1
    # Every worker must get the same number of whole mini-batches, so the batches split evenly.
    for what, samples in (("samples per step", prompts * n), ("actor mini-batch samples", mini)):
        if samples % dp:
            raise ConfigError(
                f"{what} ({samples}) must be divisible by the {dp} data-parallel workers "
                "(trainer.nnodes x trainer.n_gpus_per_node)"
            )
    critic = cfg.get("critic")
    critic_mini = critic_micro = critic_epochs = 0
    if critic is not None:
        critic_mini_prompts = int(critic.ppo_mini_batch_size or mini_prompts)
        critic_mini, critic_micro = _mini_and_micro(
            prompts, n, critic_mini_prompts, critic.ppo_micro_batch_size_per_gpu, "critic"
        )
        critic_epochs = int(critic.ppo_epochs or actor.ppo_epochs)
    budgets = token_budgets(cfg)
    return DerivedSizes(
        prompts_per_step=prompts,
        samples_per_step=prompts * n,
        mini_batch_samples=mini,
        micro_batch_samples=micro,
        grad_accum_steps=-(-(mini // dp) // min(micro, mini // dp)),  # each rank's share of the mini-batch
        optimizer_steps_per_rl_step=int(actor.ppo_epochs) * prompts // mini_prompts,
        critic_mini_batch_samples=critic_mini,
        critic_micro_batch_samples=critic_micro,
        critic_ppo_epochs=critic_epochs,
        dp_size=dp,
        strategy=training_strategy(cfg) if trainer is not None else "dp",
        **budgets,
    )


# The setting behind each budget (unset ones fall back to the actor's ppo_max_token_len_per_gpu).
TOKEN_BUDGET_KEYS = {
    "actor_max_tokens": "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "log_prob_max_tokens": "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
    "ref_max_tokens": "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
    "critic_max_tokens": "critic.ppo_max_token_len_per_gpu",
    "critic_forward_max_tokens": "critic.forward_max_token_len_per_gpu",
}


def token_budgets(cfg: DictConfig) -> dict[str, int | None]:
    """Token budget per micro-batch of each pass (verl's dynamic batch size), None where a pass counts
    rows. Unset rollout / ref / critic settings follow the actor's use_dynamic_bsz and
    ppo_max_token_len_per_gpu; the critic's value pass follows its update."""
    arr = cfg.actor_rollout_ref
    actor = arr.actor

    def budget(use: bool | None, tokens: int | None, default_tokens: int | None) -> int | None:
        on = actor.use_dynamic_bsz if use is None else use
        return int(tokens if tokens is not None else default_tokens) if on else None

    max_len = actor.ppo_max_token_len_per_gpu
    budgets = {
        "actor_max_tokens": budget(None, None, max_len),
        "log_prob_max_tokens": budget(
            arr.rollout.log_prob_use_dynamic_bsz, arr.rollout.log_prob_max_token_len_per_gpu, max_len
        ),
        "ref_max_tokens": budget(
            arr.ref.log_prob_use_dynamic_bsz, arr.ref.log_prob_max_token_len_per_gpu, max_len
        ),
    }
    critic = cfg.get("critic")
    if critic is not None:
        critic_len = critic.ppo_max_token_len_per_gpu or max_len
        budgets["critic_max_tokens"] = budget(critic.use_dynamic_bsz, critic_len, max_len)
        budgets["critic_forward_max_tokens"] = budget(
            critic.use_dynamic_bsz, critic.forward_max_token_len_per_gpu, critic_len
        )
    return budgets
