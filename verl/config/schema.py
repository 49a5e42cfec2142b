"""Typed configuration schema: OmegaConf structured configs built from dataclasses.

Section and key names follow verl (``data``, ``actor_rollout_ref.actor.optim.lr``, ``algorithm.kl_ctrl``, ...)
so verl recipes and command lines translate one to one. Every field carries a one-line docstring.

Batch sizes follow verl's units: ``data.train_batch_size`` and ``actor.ppo_mini_batch_size`` count *prompts*;
``ppo_micro_batch_size_per_gpu`` and ``log_prob_micro_batch_size_per_gpu`` count *samples* (responses).
Sizes derived from these live in :func:`verl.config.sizes.derive_sizes` and are never written back.

``Optional[...]`` is kept (rather than ``X | None``) because older OmegaConf releases cannot read PEP 604 unions.
"""

# ruff: noqa: UP007, UP045

from dataclasses import dataclass, field
from typing import Any, Optional


# --------------------------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------------------------
@dataclass
class DataConfig:
    """``data``: where prompts come from and how they are shaped."""

    tokenizer: Optional[str] = None
    """tokenizer name or path; None = use the model's tokenizer"""
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


# --------------------------------------------------------------------------------------------------------------
# actor_rollout_ref
# --------------------------------------------------------------------------------------------------------------
@dataclass
class ModelConfig:
    """``actor_rollout_ref.model``: the policy (and reference) model."""

    path: str = ""
    """model directory or hub id (required; checked at load)"""
    tokenizer_path: Optional[str] = None
    """tokenizer directory or hub id; None = same as path"""
    trust_remote_code: bool = False
    """allow custom modelling code shipped with the checkpoint"""
    torch_dtype: str = "float32"
    """parameter dtype: float32 | bfloat16 | float16"""
    attn_implementation: str = "sdpa"
    """transformers attention backend: sdpa | eager | flash_attention_2"""
    enable_gradient_checkpointing: bool = False
    """recompute activations in the backward pass to save memory"""
    use_remove_padding: bool = False
    """padding-free forward passes: each micro-batch's real tokens packed into one sequence, attention
    kept within each sequence (flash-attn varlen on GPU, per-row SDPA otherwise)"""
    share_prompts: bool = True
    """log-prob and update passes: run each distinct prompt of a micro-batch once and let its responses
    (the rollout.n samples of a group) attend to its cached keys/values: same results, the prompt
    computed once per group instead of once per sample. Padded passes only (use_remove_padding takes
    precedence); off by itself under gradient checkpointing and for models whose logits are scaled"""
    log_prob_chunk_size: int = 1024
    """response tokens per pass through the LM head when computing log-probs: full-vocabulary logits
    exist for at most this many tokens at once (recomputed in backward); 0 = all at once"""
    override_config: dict[str, Any] = field(default_factory=dict)
    """free-form overrides applied to the transformers model config"""


@dataclass
class OptimConfig:
    """``actor_rollout_ref.actor.optim``: AdamW and its learning-rate schedule."""

    lr: float = 1e-6
    """peak learning rate"""
    weight_decay: float = 0.01
    """AdamW weight decay"""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW (beta1, beta2)"""
    lr_warmup_steps: int = -1
    """linear warmup length in optimizer steps; -1 = use lr_warmup_steps_ratio"""
    lr_warmup_steps_ratio: float = 0.0
    """warmup length as a fraction of total optimizer steps (used when lr_warmup_steps is -1)"""
    lr_scheduler_type: str = "constant"
    """schedule after warmup: constant | cosine"""
    min_lr_ratio: float = 0.0
    """cosine schedule floor as a fraction of lr"""


@dataclass
class PolicyLossConfig:
    """``actor_rollout_ref.actor.policy_loss``: which policy-gradient loss to use."""

    loss_mode: str = "vanilla"
    """policy loss: vanilla (PPO clip + dual clip) | gspo | sapo | gpg | clip_cov | kl_cov | geo_mean | cispo"""
    clip_cov_ratio: float = 2e-4
    """clip_cov: fraction of tokens whose gradient is removed"""
    clip_cov_lb: float = 1.0
    """clip_cov: lower bound of the covariance band of candidate tokens"""
    clip_cov_ub: float = 5.0
    """clip_cov: upper bound of the covariance band of candidate tokens"""
    kl_cov_ratio: float = 2e-4
    """kl_cov: fraction of tokens (highest covariance) that get the |log-ratio| penalty"""
    ppo_kl_coef: float = 1.0
    """kl_cov: coefficient of the |log-ratio| penalty"""
    tau_pos: float = 1.0
    """sapo: gate temperature for positive advantages"""
    tau_neg: float = 1.05
    """sapo: gate temperature for negative advantages"""


@dataclass
class ActorConfig:
    """``actor_rollout_ref.actor``: the policy update."""

    strategy: str = "dp"
    """training backend: dp (single process / data parallel)"""
    ppo_mini_batch_size: int = 256
    """prompts per optimizer step (times rollout.n samples), as in verl"""
    ppo_micro_batch_size_per_gpu: Optional[int] = None
    """samples per forward/backward pass; None = the whole mini-batch (no gradient accumulation)"""
    use_dynamic_bsz: bool = False
    """form micro-batches by real-token count (ppo_max_token_len_per_gpu) instead of sample count; the
    log-prob passes follow unless rollout/ref.log_prob_use_dynamic_bsz say otherwise"""
    ppo_max_token_len_per_gpu: int = 16384
    """real tokens (prompt + response) per micro-batch when use_dynamic_bsz is on"""
    ppo_epochs: int = 1
    """passes over each RL batch"""
    shuffle: bool = False
    """shuffle samples between PPO epochs"""
    clip_ratio: float = 0.2
    """PPO clip range epsilon (used for both sides unless clip_ratio_low/high are set)"""
    clip_ratio_low: Optional[float] = None
    """lower clip range; None = clip_ratio"""
    clip_ratio_high: Optional[float] = None
    """upper clip range (DAPO clip-higher); None = clip_ratio"""
    clip_ratio_final: Optional[float] = None
    """clip-ratio schedule: anneal clip_ratio to this value by the last step (None = constant); an explicit
    clip_ratio_low/high is scaled by the same factor"""
    clip_ratio_schedule: str = "linear"
    """shape of the clip-ratio annealing when clip_ratio_final is set: linear | cosine"""
    clip_ratio_c: float = 3.0
    """dual-clip constant c for negative advantages"""
    grad_clip: float = 1.0
    """max global gradient norm"""
    loss_agg_mode: str = "token-mean"
    """loss aggregation: token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm"""
    loss_scale_factor: Optional[float] = None
    """constant divisor for seq-mean-token-sum-norm; None = max_response_length"""
    entropy_coeff: float = 0.0
    """entropy bonus coefficient"""
    use_kl_loss: bool = False
    """add a KL(actor || ref) term to the loss (GRPO style)"""
    kl_loss_coef: float = 0.001
    """coefficient of the KL loss term"""
    kl_loss_type: str = "low_var_kl"
    """KL estimator for the loss: kl (k1) | abs | mse (k2) | low_var_kl (k3), or with "+" (k3+: value of k3, gradient of k2)"""
    recompute_old_log_prob: Optional[bool] = None
    """run the old_log_prob pass; None = only when needed: it is skipped when every RL step makes
    exactly one optimizer step (the policy that sampled is the one being updated, so the detached
    current log-probs are the old ones) and no KL-in-reward needs them"""
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    """policy-loss variant"""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """optimizer and learning-rate schedule"""


@dataclass
class SamplingConfig:
    """``actor_rollout_ref.rollout.val_kwargs``: sampling used for validation."""

    n: int = 1
    """responses per validation prompt"""
    temperature: float = 0.0
    """sampling temperature (0 = greedy)"""
    top_p: float = 1.0
    """nucleus sampling threshold"""
    top_k: int = -1
    """top-k sampling; -1 = off"""
    do_sample: bool = False
    """sample (True) or decode greedily (False)"""


@dataclass
class RolloutConfig:
    """``actor_rollout_ref.rollout``: response generation."""

    name: str = "fast"
    """generation engine: fast (KV-cached decoding, finished rows dropped, returns log-probs) | hf
    (transformers' generate) | dummy (random tokens, for tests)"""
    n: int = 1
    """responses sampled per prompt (the GRPO group size)"""
    temperature: float = 1.0
    """sampling temperature"""
    top_p: float = 1.0
    """nucleus sampling threshold"""
    top_k: int = -1
    """top-k sampling; -1 = off"""
    do_sample: bool = True
    """sample (True) or decode greedily (False)"""
    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    """samples per forward pass when recomputing old log-probs; None = whole batch"""
    log_prob_use_dynamic_bsz: Optional[bool] = None
    """old log-prob pass: micro-batches by token count; None = actor.use_dynamic_bsz"""
    log_prob_max_token_len_per_gpu: Optional[int] = None
    """old log-prob pass: real tokens per micro-batch; None = actor.ppo_max_token_len_per_gpu"""
    calculate_log_probs: bool = False
    """return the engine's own log-probs with each response"""
    micro_batch_size: Optional[int] = None
    """generation chunk size in prompts; None = the whole batch at once"""
    tensor_model_parallel_size: int = 1
    """tensor parallel size of the inference engine"""
    gpu_memory_utilization: float = 0.5
    """fraction of GPU memory the inference engine may take"""
    max_num_seqs: int = 256
    """maximum concurrent sequences in the inference engine"""
    val_kwargs: SamplingConfig = field(default_factory=SamplingConfig)
    """sampling used for validation"""


@dataclass
class RefConfig:
    """``actor_rollout_ref.ref``: the frozen reference policy."""

    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    """samples per forward pass when computing reference log-probs; None = whole batch"""
    log_prob_use_dynamic_bsz: Optional[bool] = None
    """reference pass: micro-batches by token count; None = actor.use_dynamic_bsz"""
    log_prob_max_token_len_per_gpu: Optional[int] = None
    """reference pass: real tokens per micro-batch; None = actor.ppo_max_token_len_per_gpu"""


@dataclass
class ActorRolloutRefConfig:
    """``actor_rollout_ref``: the hybrid worker holding actor, rollout and reference."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """model shared by actor, rollout and reference"""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """policy update"""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """response generation"""
    ref: RefConfig = field(default_factory=RefConfig)
    """reference policy"""


@dataclass
class CriticModelConfig:
    """``critic.model``: the value model, a causal LM backbone with a scalar head per token."""

    path: Optional[str] = None
    """model directory; None = the actor's model.path"""
    tokenizer_path: Optional[str] = None
    """tokenizer directory; None = the actor's tokenizer"""
    trust_remote_code: bool = False
    """allow custom modelling code from the model directory"""
    torch_dtype: str = "float32"
    """parameter dtype: float32 | bfloat16 | float16"""
    attn_implementation: str = "sdpa"
    """attention kernel: sdpa | eager | flash_attention_2"""
    enable_gradient_checkpointing: bool = False
    """recompute activations in backward to save memory"""
    use_remove_padding: Optional[bool] = None
    """padding-free forward passes (see actor_rollout_ref.model); None = the actor's setting"""


@dataclass
class CriticConfig:
    """``critic``: the value function of PPO (GAE needs it; GRPO-family estimators do not)."""

    enable: Optional[bool] = None
    """build a critic; None = only when the advantage estimator needs values (gae)"""
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    """value model"""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    """optimizer and learning-rate schedule of the critic"""
    ppo_mini_batch_size: Optional[int] = None
    """prompts per critic optimizer step; None = the actor's ppo_mini_batch_size"""
    ppo_micro_batch_size_per_gpu: Optional[int] = None
    """samples per forward/backward pass; None = the whole mini-batch"""
    ppo_epochs: Optional[int] = None
    """passes over the batch per RL step; None = the actor's ppo_epochs"""
    shuffle: bool = False
    """shuffle samples between critic mini-batches"""
    cliprange_value: float = 0.5
    """value clipping: predictions move at most this far from the old values"""
    loss_agg_mode: str = "token-mean"
    """aggregation of the value loss (same modes as the actor)"""
    grad_clip: float = 1.0
    """max global gradient norm"""
    forward_micro_batch_size_per_gpu: Optional[int] = None
    """samples per forward pass when computing values; None = whole batch"""
    use_dynamic_bsz: Optional[bool] = None
    """micro-batches by token count; None = actor.use_dynamic_bsz"""
    ppo_max_token_len_per_gpu: Optional[int] = None
    """update: real tokens per micro-batch; None = actor.ppo_max_token_len_per_gpu"""
    forward_max_token_len_per_gpu: Optional[int] = None
    """value pass: real tokens per micro-batch; None = ppo_max_token_len_per_gpu"""


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
class AlgorithmConfig:
    """``algorithm``: advantage estimation and reward shaping."""

    adv_estimator: str = "grpo"
    """advantage estimator: grpo | gae | rloo | reinforce_plus_plus | remax | ..."""
    gamma: float = 1.0
    """discount factor"""
    lam: float = 1.0
    """GAE lambda"""
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


@dataclass
class CustomRewardFunctionConfig:
    """``custom_reward_function``: a user-supplied scoring function."""

    path: Optional[str] = None
    """python file defining the function; None = built-in scorers chosen by data_source"""
    name: str = "compute_score"
    """function name inside that file"""


@dataclass
class OverlongBufferConfig:
    """``reward_model.overlong_buffer`` (DAPO's soft overlong punishment, used by the ``dapo`` manager)."""

    enable: bool = False
    """penalise responses that run into the last ``len`` tokens of max_response_length"""
    len: int = 4
    """length of the penalty ramp at the end of the response budget, in tokens"""
    penalty_factor: float = 1.0
    """penalty at the full response length (linear ramp from 0 at max_response_length - len)"""


@dataclass
class RewardModelConfig:
    """``reward_model``: how rewards are computed."""

    reward_manager: str = "naive"
    """reward manager: naive | dapo (naive + overlong reward shaping)"""
    num_examine: int = 0
    """decoded samples per batch to print for inspection"""
    num_workers: int = 1
    """reward workers (each batch is split across them); with trainer.backend=ray each is its own process"""
    error_policy: str = "fail"
    """a reward function that raises, times out or returns NaN / inf / a non-number for a sample: fail (stop,
    naming the sample) | zero (log the sample, score it 0, flag it in the reward_error field: reward/errors)"""
    timeout_s: Optional[float] = None
    """seconds one reward call may run (per sample; per batch for reward_manager=batch); None = no limit.
    The call runs on a helper thread; a timed-out one is abandoned (Python cannot kill a thread)"""
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    """DAPO overlong reward shaping (reward_manager=dapo)"""


# --------------------------------------------------------------------------------------------------------------
# trainer, prepare
# --------------------------------------------------------------------------------------------------------------
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
    (a global_step_<N> directory)"""
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
    """metric sinks: console | jsonl | tensorboard | wandb"""
    seed: int = 1
    """global random seed"""
    val_before_train: bool = True
    """validate once before the first RL step"""
    val_only: bool = False
    """validate and exit without training"""
    nnodes: int = 1
    """number of nodes"""
    n_gpus_per_node: int = 1
    """data-parallel workers per node for the actor (and critic): one per GPU, or CPU processes without GPUs"""
    backend: str = "local"
    """where role workers run: local (in this process, the default) | ray (one Ray actor process per worker;
    needed for more than one data-parallel worker)"""
    controller: str = "RLTrainer"
    """the Controller class that runs the loop: a built-in name (RLTrainer, GRPOController) or module:Class"""
    trace: bool = False
    """write an HTML trace of every step's DAG (timings, waits, bytes moved) to trace_path"""
    trace_path: Optional[str] = None
    """where the trace goes; None = <default_local_dir>/trace.html"""
    on_worker_failure: str = "fail"
    """when a worker dies or raises: fail (stop with an error naming the role, rank and cause) | restart
    (start fresh workers, restore the actor/critic state kept on the driver, retry the step)"""
    max_worker_restarts: int = 3
    """restarts allowed per role over the whole run before giving up (on_worker_failure=restart)"""
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
    torch_threads: Optional[int] = None
    """torch intra-op CPU threads; None = torch default"""


@dataclass
class PrepareConfig:
    """``prepare`` (not in verl): how ``verl run`` creates missing inputs for the default recipe."""

    enable: bool = True
    """create missing data files and model before training"""
    task: Optional[str] = None
    """built-in task (e.g. arithmetic) that writes data.train_files/val_files when they are missing"""
    task_kwargs: dict[str, Any] = field(default_factory=dict)
    """free-form keyword arguments for the task builder"""
    tiny_model: dict[str, Any] = field(default_factory=dict)
    """free-form keyword arguments for the tiny-model factory, used when model.path is missing"""
    sft: dict[str, Any] = field(default_factory=dict)
    """free-form SFT settings for the warm start (leaf names or dotted SFTConfig keys, see ``sft_overrides``)"""


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
    prepare: PrepareConfig = field(default_factory=PrepareConfig)
    """creation of missing inputs (ours, not verl)"""
