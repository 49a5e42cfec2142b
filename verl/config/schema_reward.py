"""Typed configuration schema of the reward sections: ``custom_reward_function`` and ``reward_model`` (the
manager, the reward workers, the reward model, the weighted reward terms and DAPO's overlong buffer). Part of
:mod:`verl.config.schema` (which re-exports every class here); the conventions are described there.
"""

# ruff: noqa: UP007, UP045

from dataclasses import dataclass, field
from typing import Any, Optional


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
    """directory (or hub id) of the reward model and its tokenizer, required with reward_model.enable=true: an
    AutoModelForSequenceClassification checkpoint with one label (a trained score head), or a causal LM when it
    is generative (custom_reward_function.path set)"""
    input_tokenizer: Optional[str] = None
    """tokenizer directory that decodes the policy's responses before the reward model's chat template re-encodes
    them; null = the policy's own tokenizer (verl's default, ${actor_rollout_ref.model.path}). The chat template
    is always the reward model's (verl's null feeds the policy's token ids unchanged instead)"""
    trust_remote_code: bool = False
    """allow model code shipped in the reward model's directory"""


@dataclass
class RewardModelRolloutConfig:
    """``reward_model.rollout``: how a generative reward model is served (verl's ``reward.reward_model.rollout``).

    Read only when the reward model is generative: ``reward_model.enable=true`` with
    ``custom_reward_function.path`` set (verl's rule; see docs/rewards.md). The sampling keys are the defaults of
    a request that does not give its own, as verl's inference server takes them."""

    name: str = "fast"
    """engine generating the reward model's replies: fast | hf | vllm | sglang | dummy (verl's vllm / sglang
    where their package is not installed, and its trtllm, generate with fast)"""
    dtype: Optional[str] = None
    """dtype the reward model generates in; null = bfloat16 on a GPU, float32 on a CPU"""
    temperature: float = 1.0
    """temperature of a request that gives none (0 = greedy)"""
    top_p: float = 1.0
    """top_p of a request that gives none, in (0, 1]"""
    top_k: int = -1
    """top_k of a request that gives none (-1 or 0 = off)"""
    do_sample: bool = True
    """false: a request that gives no temperature is decoded greedily"""
    response_length: int = 2048
    """max_tokens of a request that gives none (verl's max_new_tokens default of its reward-model server)"""
    max_model_len: Optional[int] = None
    """longest prompt + reply the server accepts (a request past it is refused with HTTP 400); null = the
    model's max_position_embeddings, as verl's vLLM server"""
    max_num_seqs: int = 1024
    """requests answered together in one engine call at most (the server batches what is waiting)"""
    gpu_memory_utilization: float = 0.5
    """vllm / sglang: share of the GPU's memory the engine may take"""
    enforce_eager: Optional[bool] = True
    """vllm: no CUDA graphs / torch.compile (verl's default for the reward model)"""
    free_cache_engine: bool = True
    """vllm / sglang on a GPU: sleep between engine calls (KV cache freed) so training keeps the memory"""
    enable_chunked_prefill: bool = True
    """vllm: split long prefills into chunks"""
    enable_prefix_caching: bool = True
    """vllm: reuse the KV of shared prompt prefixes (a judge prompt's fixed instructions)"""
    max_num_batched_tokens: Optional[int] = 8192
    """vllm: tokens per scheduler step (raised to max_model_len if lower); null = vLLM's default"""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """extra engine arguments by engine name: {vllm: {...}, sglang: {...}}"""


@dataclass
class RewardModelConfig:
    """``reward_model``: how rewards are computed."""

    enable: bool = False
    """use the reward model at reward_model.model.path (verl's reward_model.enable). Without
    custom_reward_function.path it is discriminative: its score replaces the rule score, as in verl, unless
    reward_fns names terms (then the reward_model term weighs it in), logged as the reward field rm_score. With
    custom_reward_function.path it is generative (verl's rule): served over HTTP (reward_model.rollout) for that
    function to call with reward_router_address"""
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    """the reward model (read with enable=true)"""
    rollout: RewardModelRolloutConfig = field(default_factory=RewardModelRolloutConfig)
    """how a generative reward model is served (enable=true with custom_reward_function.path)"""
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
    """reward manager: naive | batch (one call per batch) | dapo (naive + overlong reward shaping) | limited
    (verl's rate-limited manager: calls paced by max_rpm / max_tpm, a failed or timed-out call scored 0 and
    flagged, whatever error_policy says; verl's reward.reward_manager.name)"""
    manager_kwargs: dict[str, Any] = field(default_factory=dict)
    """keyword arguments of a reward manager written for verl (verl's reward.reward_kwargs, read here under this
    name): a classic manager gets them in its constructor, a reward-loop manager reads them from
    config.reward.reward_kwargs, as in verl; the built-in managers take none (DAPO's overlong_buffer_cfg and
    max_resp_len map onto overlong_buffer and data.max_response_length)"""
    num_examine: int = 0
    """decoded samples per batch to print for inspection"""
    num_workers: int = 1
    """reward workers (each batch is split across them); with trainer.backend=ray each is its own process
    (verl's reward.num_workers)"""
    error_policy: str = "fail"
    """a reward function that raises, times out or returns NaN / inf / a non-number for a sample: fail (stop,
    naming the sample) | zero (log the sample, score it 0, flag it in the reward_error field: reward/errors)"""
    timeout_s: Optional[float] = 60.0
    """seconds one reward call may run (per sample; per batch for reward_manager=batch); a call that runs longer
    is a reward error naming the sample (handled per error_policy). null = no limit (a hung reward function then
    hangs the run). The call runs on a helper thread; a timed-out one is abandoned (Python cannot kill a
    thread), and a scorer that needs the main thread (signal-based timeouts) needs null. verl's reward.timeout
    (its limited manager's limit, 300 s there by default)"""
    max_rpm: Optional[int] = None
    """reward_manager=limited: at most this many reward calls a minute per reward worker (verl's reward.max_rpm);
    null = no limit"""
    max_tpm: Optional[int] = None
    """reward_manager=limited: at most this many tokens a minute per reward worker, each call counted as
    estimated_tokens_per_request tokens (verl's reward.max_tpm); null = no limit"""
    estimated_tokens_per_request: int = 2000
    """reward_manager=limited: the tokens one reward call is counted as against max_tpm"""
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    """DAPO overlong reward shaping (reward_manager=dapo)"""
