"""Typed configuration of ``verl sft`` (supervised fine-tuning, the warm start before RL)."""

# ruff: noqa: UP007, UP045

from dataclasses import dataclass, field
from typing import Any, Optional

from verl.config.schema import CompatSection, OptimConfig


@dataclass
class SFTDataConfig:
    """``data`` of the SFT config: prompt/response pairs."""

    train_files: Any = None
    """training parquet / jsonl file(s): a path or a list of paths (required; checked before the model loads)"""
    val_files: Any = None
    """validation parquet file(s): not built yet (verl sft has no validation pass), so only None is accepted"""
    prompt_key: str = "prompt"
    """column holding the prompt (a chat message list or a string); dots index into nested row fields
    (extra_info.question)"""
    response_key: str = "reward_model.ground_truth"
    """column holding the target response; dots index into nested row fields"""
    messages_key: Optional[str] = None
    """column holding a whole chat (a list of {role, content} messages, verl's multi-turn SFT); when set,
    every assistant turn is a training target and prompt_key/response_key are not read"""
    tools_key: Optional[str] = "tools"
    """with messages_key: a column holding the row's tool schemas, passed to the chat template as ``tools`` (as
    verl's multi-turn SFT does); a row without it renders without tools"""
    enable_thinking_key: Optional[str] = "enable_thinking"
    """with messages_key: a column holding the row's ``enable_thinking`` for the chat template, as in verl"""
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """extra keyword arguments for tokenizer.apply_chat_template when rendering prompts (e.g.
    enable_thinking: false), as in verl"""
    max_length: int = 128
    """maximum prompt + response length in tokens"""
    train_batch_size: int = 64
    """sequences per optimizer step"""
    truncation: str = "error"
    """what to do with longer sequences: error | left | right"""
    train_max_samples: int = -1
    """train on only the first N rows of train_files (a demonstration budget); -1 = all"""


@dataclass
class SFTModelConfig:
    """``model`` of the SFT config."""

    path: str = ""
    """model directory or hub id (required; checked at load)"""
    tokenizer_path: Optional[str] = None
    """tokenizer directory or hub id; None = same as path"""
    torch_dtype: str = "float32"
    """parameter dtype: float32 | bfloat16 | float16"""
    attn_implementation: str = "sdpa"
    """transformers attention backend: sdpa | eager | flash_attention_2"""
    trust_remote_code: bool = False
    """allow custom modelling code shipped with the checkpoint"""
    override_config: dict[str, Any] = field(default_factory=dict)
    """overrides applied to the HuggingFace config before the weights load (e.g. max_position_embeddings), as
    in verl; an unknown name is an error"""
    lora_rank: int = 0
    """LoRA rank of the adapters trained instead of the full weights (peft); 0 = off, train every weight.
    The saved model has the adapters merged into its weights (a plain transformers model)"""
    lora_alpha: int = 16
    """LoRA scaling numerator: the adapter's update is scaled by lora_alpha / lora_rank"""
    target_modules: Any = "all-linear"
    """modules that get adapters: all-linear (every linear layer but the LM head), a list of module names
    (e.g. [q_proj, v_proj]), or one regular expression matched against the full module names"""
    exclude_modules: Optional[Any] = None
    """modules to leave without adapters even when target_modules matches them: a list of names or a
    regular expression; None = none"""


@dataclass
class SFTOptimConfig(OptimConfig):
    """``optim`` of the SFT config: OptimConfig plus gradient clipping (verl's SFT keeps clipping in optim)."""

    lr: float = 1e-5
    """peak learning rate"""
    grad_clip: float = 1.0
    """max global gradient norm"""


@dataclass
class SFTTrainerSection:
    """``trainer`` of the SFT config."""

    total_training_steps: Optional[int] = None
    """optimizer steps to run; None = total_epochs worth of steps"""
    total_epochs: int = 1
    """passes over the training set (ignored when total_training_steps is set)"""
    seed: int = 1
    """random seed"""
    project_name: str = "verl"
    """project name (as in verl: it names the output directory of verl's SFT defaults)"""
    experiment_name: str = "sft"
    """experiment name (as in verl: it names the output directory of verl's SFT defaults)"""
    default_local_dir: str = "outputs/sft"
    """output directory for the fine-tuned model and logs"""
    on_existing_run: str = "refuse"
    """default_local_dir is not empty (an earlier model or run): refuse (stop with an error) | move_aside
    (move its files to <dir>.moved-<time>; nothing is deleted)"""
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    """metric sinks: console | jsonl (or file) | csv | tensorboard | wandb | mlflow, as trainer.logger of verl run"""
    test_freq: int = -1
    """validate every this many steps: not built yet (no validation pass), so only -1 (never) is accepted"""
    torch_threads: Optional[Any] = "auto"
    """torch intra-op CPU threads: a number, null (torch's default: one per core), or auto (each computing
    process's share of the usable cores; one thread for a model under 2M parameters), logged at start"""


@dataclass
class SFTConfig:
    """Top-level config of ``verl sft`` (supervised fine-tuning, also the warm start of the default recipe)."""

    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    """prompt/response data"""
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    """model to fine-tune"""
    optim: SFTOptimConfig = field(default_factory=SFTOptimConfig)
    """optimizer, schedule and gradient clipping"""
    trainer: SFTTrainerSection = field(default_factory=SFTTrainerSection)
    """loop, logging and output"""
    compat: CompatSection = field(default_factory=CompatSection)
    """how verl's own SFT settings were read (ours, written by the loader)"""
