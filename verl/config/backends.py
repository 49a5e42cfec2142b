"""Keys that only some backends read.

Every key of the schema either changes what the selected backend does or, set to anything but its default
(or a value verl's own configs use that means the same thing here), is reported: a key that only tunes
speed or memory of another backend (an inference server's KV-cache share) is accepted with a notice naming
the backend that reads it, or, for an engine key that acts only on a GPU, why the rollout runs without one
(:func:`backend_notices`); one whose value would change what is learned if
ignored is a ConfigError (:func:`backend_errors`). Backends that verl has and this repository does not build
yet (vLLM / SGLang rollout, FSDP / Megatron training) are named as such.

Kept free of torch and of the worker packages: the engines that exist are listed here, and
``tests/unit/test_config.py`` checks the list against the rollout registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl.config.errors import as_written, short_repr
from verl.config.schema_trainer import TrainerSection
from verl.config.schema_workers import FSDPConfig, RolloutConfig

BUILT_ROLLOUTS = ("fast", "vllm", "sglang", "hf", "dummy")
"""``actor_rollout_ref.rollout.name`` values registered by ``verl.workers.rollout``"""
NOT_BUILT_ROLLOUTS: tuple[str, ...] = ()
"""verl's inference-server engines not built in this repository yet"""
BUILT_STRATEGIES = ("fsdp2", "fsdp", "dp")
"""``actor_rollout_ref.actor.strategy`` values: fsdp2 (fsdp its alias) shards over the ranks, dp replicates
(one process, or DDP over trainer.backend=ray workers)"""
NOT_BUILT_STRATEGIES = ("megatron",)
"""verl's training backends not built in this repository"""
FSDP_SECTIONS = (
    "actor_rollout_ref.actor.fsdp_config",
    "actor_rollout_ref.ref.fsdp_config",
    "critic.model.fsdp_config",
)
"""the fsdp_config section of each role FSDP2 shards"""
COMPUTE_DTYPE_LEAF = "mixed_precision.param_dtype"
"""the fsdp_config key every strategy reads: the dtype a role computes in (`verl.utils.precision`)"""
DTYPE_NAMES = ("fp32", "float32", "bf16", "bfloat16", "fp16", "float16")
"""dtype names a config accepts (verl's short ones and torch's; verl.models.loading.DTYPES)"""
REWARD_MANAGERS_WITHOUT_OVERLONG = ("naive", "batch", "limited")
"""built-in reward managers that do not apply ``reward_model.overlong_buffer`` (only ``dapo`` does)"""

ROLLOUT = "actor_rollout_ref.rollout"


@dataclass(frozen=True)
class RolloutKey:
    """A ``rollout`` key that only some engines read."""

    name: str
    """leaf name under actor_rollout_ref.rollout"""
    accepted: tuple[Any, ...]
    """values accepted by every engine: the schema default first, then verl's defaults that mean the same here"""
    read_by: tuple[str, ...]
    """engines that honour any value"""
    what: str
    """what the key does, completing "it ..." in the message"""
    read_in_async: bool = False
    """read by every engine in rollout.mode=async (the server's batches)"""


ROLLOUT_KEYS = (
    RolloutKey(
        "tensor_model_parallel_size",
        (1,),
        ("vllm",),
        "shards an inference engine's weights over that many actor ranks (here each sglang engine runs whole, "
        "and the other engines generate with the actor's own module)",
    ),
    RolloutKey(
        "gpu_memory_utilization",
        (0.5,),
        ("vllm", "sglang"),
        "sizes vLLM's / SGLang's KV cache as a fraction of GPU memory",
    ),
    RolloutKey(
        "max_num_seqs",
        (256, 1024),
        ("vllm", "sglang"),
        "caps the sequences an inference server batches at once (the other engines take the whole batch, or "
        "rollout.micro_batch_size prompts at a time; in rollout.mode=async it caps the requests per engine call)",
        read_in_async=True,
    ),
    RolloutKey(
        "max_model_len",
        (None,),
        ("vllm", "sglang"),
        "caps an inference server's prompt + response length",
    ),
    RolloutKey(
        "dtype",
        (None,),
        ("vllm", "sglang"),
        "sets an inference server's dtype (the other engines generate in the actor's own dtype)",
    ),
    RolloutKey(
        "free_cache_engine",
        (True,),
        ("vllm", "sglang"),
        "puts an inference server to sleep between generates on a GPU",
    ),
    RolloutKey("enforce_eager", (None,), ("vllm",), "turns vLLM's CUDA graphs / torch.compile off"),
    RolloutKey("enable_chunked_prefill", (True,), ("vllm",), "lets vLLM split long prefills"),
    RolloutKey("enable_prefix_caching", (True,), ("vllm",), "lets vLLM reuse shared prompt prefixes' KV"),
    RolloutKey("max_num_batched_tokens", (8192,), ("vllm",), "caps the tokens of one vLLM scheduler step"),
    RolloutKey(
        "micro_batch_size",
        (None,),
        ("fast", "hf", "dummy"),
        "splits generation into chunks of prompts (vllm and sglang schedule the whole batch themselves)",
    ),
)
"""inference-server tuning: with another engine these change nothing, and are reported"""

CALCULATE_LOG_PROBS = RolloutKey(
    "calculate_log_probs",
    (None, False),
    ("fast", "hf", "vllm", "sglang"),
    "returns the engine's log-probs with each response (rollout_log_probs), which fast, vllm and sglang always "
    "do (hf: from the logits generate returns)",
)
"""refused with an engine that cannot return log-probs (dummy, which has no model): a step that reads them
would find none"""
IGNORE_EOS = RolloutKey(
    "ignore_eos",
    (False,),
    ("fast", "hf", "vllm", "sglang"),
    "generates past the end-of-sequence token",
)
"""refused with an engine that stops at EOS regardless: the responses would not be what was asked"""
LOGPROBS_MODE = RolloutKey(
    "logprobs_mode",
    ("processed_logprobs",),
    ("vllm",),
    "chooses which log-probs vLLM returns (the fast engine returns log softmax(logits / temperature))",
)


@dataclass(frozen=True)
class GpuOnlyKey:
    """A ``rollout`` key an engine reads only when it generates on a GPU."""

    name: str
    """leaf name under actor_rollout_ref.rollout"""
    engines: tuple[str, ...]
    """engines that read it on a GPU (the others get :data:`ROLLOUT_KEYS`' notice instead)"""
    inert: tuple[Any, ...]
    """values that change nothing on a CPU: the key is reported only when set to one of them (empty: to any value
    but the schema default)"""
    why: str
    """what the key does on a GPU and what the engine does on a CPU instead"""


GPU_ONLY_KEYS = (
    GpuOnlyKey(
        "gpu_memory_utilization",
        ("vllm",),
        (),  # on a CPU vLLM sizes its cache by kv_cache_memory_bytes, which the engine always sets there
        "it sizes vLLM's KV cache as a fraction of GPU memory; on a CPU the KV cache is sized to the run "
        "(max_num_seqs x max_model_len, or engine_kwargs.vllm.kv_cache_memory_bytes)",
    ),
    GpuOnlyKey(
        "free_cache_engine",
        ("vllm", "sglang"),
        (False,),
        "it lets the engine sleep between generates on a GPU; on a CPU the engine never sleeps",
    ),
    GpuOnlyKey(
        "enforce_eager",
        ("vllm",),
        (True,),
        "vLLM runs eagerly on a CPU already (null means true there); false would turn torch.compile on",
    ),
)
"""keys of the inference engines that act only on a GPU; the others (chunked prefill, prefix caching, batch
and length caps, dtype, tensor parallelism) act on a CPU too"""


def rollout_without_gpu(cfg: DictConfig) -> str | None:
    """Why the rollout engine generates on a CPU (``trainer.device``; ``auto`` with no CUDA device), or None
    when it generates on a GPU. The engine runs on the device the actor's workers resolve."""
    device = cfg.trainer.device
    if device == "cpu":
        return "trainer.device=cpu: the workers, and the engine with them, compute on the CPU"
    if device == "auto":
        import torch  # here only: the rest of the config package stays free of torch

        if not torch.cuda.is_available():
            return "trainer.device=auto and no CUDA device is visible: torch.cuda.is_available() is False"
    return None


def _gpu_only_notices(cfg: DictConfig) -> list[str]:
    rollout = cfg.actor_rollout_ref.rollout
    engine = rollout.name
    keys = [key for key in GPU_ONLY_KEYS if engine in key.engines]
    if not keys:
        return []
    default = OmegaConf.structured(RolloutConfig)
    changed = [
        key
        for key in keys
        if rollout[key.name] != default[key.name] and (not key.inert or rollout[key.name] in key.inert)
    ]
    if engine == "vllm" and _vllm_kwargs(rollout).get("kv_cache_memory_bytes", 0) is None:
        # kv_cache_memory_bytes=null asks vLLM to size its CPU KV cache from gpu_memory_utilization after all
        changed = [key for key in changed if key.name != "gpu_memory_utilization"]
    if not changed:
        return []
    where = rollout_without_gpu(cfg)  # only now: resolving trainer.device=auto imports torch
    if where is None:
        return []
    return [
        f"{ROLLOUT}.{key.name}={as_written(rollout[key.name])} has no effect with rollout.name={engine} "
        f"without a GPU ({where}): {key.why}"
        for key in changed
    ]


def _vllm_kwargs(rollout: DictConfig) -> dict[str, Any]:
    extra = rollout.engine_kwargs.get("vllm") if rollout.engine_kwargs else None
    return dict(extra) if extra else {}


SGLANG_UNTESTED = (
    f"{ROLLOUT}.name=sglang: the SGLang engine is checked only against a stand-in of SGLang's Engine API (SGLang "
    "does not run on the CPU machines it was built on); rollout.name=vllm is the tested inference engine"
)


def _engines(names: tuple[str, ...]) -> str:
    built = [n for n in names if n in BUILT_ROLLOUTS]
    not_built = [n for n in names if n not in BUILT_ROLLOUTS]
    parts = [f"rollout.name={' or '.join(built)}"] if built else []
    if not_built:
        parts.append(f"rollout.name={' or '.join(not_built)}, not built yet")
    return "; ".join(parts)


def _rollout_errors(cfg: DictConfig) -> list[str]:
    rollout = cfg.actor_rollout_ref.rollout
    engine = rollout.name
    errors: list[str] = []
    if engine in NOT_BUILT_ROLLOUTS:
        errors.append(f"{ROLLOUT}.name={engine}: not built yet; available: {', '.join(BUILT_ROLLOUTS)}")
        return errors
    errors.extend(
        f"{line}; leave it at false" for line in _unread([CALCULATE_LOG_PROBS, IGNORE_EOS], rollout)
    )
    tp, ranks = int(rollout.tensor_model_parallel_size), _ranks(cfg)
    if engine == "vllm" and tp > 1:
        if ranks % tp:
            errors.append(
                f"{ROLLOUT}.tensor_model_parallel_size={tp}: the {ranks} actor rank(s) (trainer.nnodes x "
                "n_gpus_per_node with trainer.backend=ray) do not split into engines of that many; use a divisor"
            )
        if rollout.mode == "async":
            errors.append(
                f"{ROLLOUT}.tensor_model_parallel_size={tp} with rollout.mode=async: a tensor-parallel engine's "
                "ranks must send the same requests in the same order, which the server's batching does not "
                "guarantee (not built); use mode=sync"
            )
    model = cfg.actor_rollout_ref.model
    if engine == "sglang" and (model.lora_rank or model.lora_adapter_path is not None):
        which = (
            f"lora_rank={model.lora_rank}"
            if model.lora_rank
            else f"lora_adapter_path={model.lora_adapter_path}"
        )
        errors.append(
            f"{ROLLOUT}.name=sglang with actor_rollout_ref.model.{which}: LoRA is not built for the "
            "SGLang engine; use rollout.name=vllm (its adapters are synchronised alone) or fast"
        )
    return errors


def _unread(keys: list[RolloutKey], rollout: DictConfig) -> list[str]:
    engine = rollout.name

    # agent loops always go through the server, as rollout.mode=async does
    served = (
        rollout.mode == "async"
        or rollout.multi_turn.enable
        or rollout.agent.default_agent_loop != "single_turn_agent"
    )

    def readers(key: RolloutKey) -> tuple[str, ...]:
        return BUILT_ROLLOUTS if key.read_in_async and served else key.read_by

    return [
        f"{ROLLOUT}.{key.name}={as_written(rollout[key.name])} has no effect with rollout.name={engine} "
        f"(it {key.what}{'; read by ' + _engines(key.read_by) if key.read_by else ''})"
        for key in keys
        if engine not in readers(key) and rollout[key.name] not in key.accepted
    ]


def training_strategy(cfg: DictConfig) -> str:
    """The strategy the actor, reference and critic train with: fsdp2 or dp. Unset, FSDP2 when more than
    one rank trains (verl's default strategy), DDP-free dp for one."""
    asked = cfg.actor_rollout_ref.actor.strategy
    if asked is None:
        return "fsdp2" if _ranks(cfg) > 1 else "dp"
    return "fsdp2" if asked == "fsdp" else str(asked)


def _ranks(cfg: DictConfig) -> int:
    """Ranks the actor trains on: trainer.nnodes x n_gpus_per_node Ray workers, one process otherwise."""
    trainer = cfg.trainer
    return int(trainer.nnodes) * int(trainer.n_gpus_per_node) if trainer.backend == "ray" else 1


def _fsdp_sections(cfg: DictConfig) -> list[tuple[str, DictConfig]]:
    return [(key, OmegaConf.select(cfg, key)) for key in FSDP_SECTIONS]


def _fsdp_notices(cfg: DictConfig) -> list[str]:
    lines = []
    if cfg.actor_rollout_ref.actor.strategy == "fsdp":
        lines.append(
            "actor_rollout_ref.actor.strategy=fsdp trains with FSDP2 (torch's fully_shard), the successor of "
            "verl's FSDP1 engine: weights, gradients and optimizer state sharded over the ranks alike"
        )
    strategy = training_strategy(cfg)
    default = OmegaConf.structured(FSDPConfig)
    for key, section in _fsdp_sections(cfg):
        changed = _changed_leaves(section, default)
        if strategy != "fsdp2":
            lines.extend(
                f"{key}.{leaf}={as_written(value)} has no effect with strategy={strategy} (it configures FSDP2: "
                "set actor_rollout_ref.actor.strategy=fsdp2)"
                for leaf, value in changed
                if leaf != COMPUTE_DTYPE_LEAF
            )
            continue
        if section.mixed_precision.buffer_dtype not in ("fp32", "float32"):
            lines.append(
                f"{key}.mixed_precision.buffer_dtype={section.mixed_precision.buffer_dtype} has no effect: FSDP2 "
                "leaves buffers (rotary tables) in the model's dtype"
            )
        if section.wrap_policy.min_num_params:
            lines.append(
                f"{key}.wrap_policy.min_num_params={section.wrap_policy.min_num_params} has no effect: FSDP2 "
                "shards one unit per decoder layer (wrap_policy.transformer_layer_cls_to_wrap) and the root"
            )
    return lines


def _changed_leaves(section: DictConfig, default: DictConfig, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for name, value in section.items():
        if isinstance(value, DictConfig):
            out.extend(_changed_leaves(value, default[name], f"{prefix}{name}."))
        elif value != default[name]:
            out.append((f"{prefix}{name}", value))
    return out


def _fsdp_errors(cfg: DictConfig) -> list[str]:
    sharded = training_strategy(cfg) == "fsdp2"
    errors = []
    ranks = _ranks(cfg)
    for key, section in _fsdp_sections(cfg):
        # param_dtype is the compute dtype of the plain strategy too (autocast); the rest is FSDP2's alone.
        for name in ("param_dtype", "reduce_dtype") if sharded else ("param_dtype",):
            value = section.mixed_precision[name]
            if value is not None and value not in DTYPE_NAMES:
                errors.append(
                    f"{key}.mixed_precision.{name}={as_written(value)}: not a dtype; use one of {', '.join(DTYPE_NAMES)}"
                )
        if not sharded:
            continue
        size = section.fsdp_size
        if size == 0 or size < -1:
            errors.append(f"{key}.fsdp_size={size}: give -1 (all ranks) or a number of ranks >= 1")
        elif 0 < size < ranks and ranks % size:
            errors.append(
                f"{key}.fsdp_size={size} must divide the {ranks} ranks (trainer.nnodes x trainer.n_gpus_per_node): "
                "each group of fsdp_size ranks shards one replica"
            )
    return errors


CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")
"""what a role's checkpoint part can hold (verl's checkpoint.save_contents values)"""
CHECKPOINT_SECTIONS = ("actor_rollout_ref.actor.checkpoint", "critic.checkpoint")


def _checkpoint_errors(cfg: DictConfig) -> list[str]:
    errors = []
    for key in CHECKPOINT_SECTIONS:
        section = OmegaConf.select(cfg, key)
        for name in ("save_contents", "load_contents"):
            contents = section[name]
            unknown = [c for c in (contents or ()) if c not in CHECKPOINT_CONTENTS]
            if unknown:
                errors.append(
                    f"{key}.{name}={as_written(contents)}: {', '.join(map(str, unknown))} is not a part of a "
                    f"checkpoint; use some of {', '.join(CHECKPOINT_CONTENTS)}"
                )
    return errors


def _checkpoint_notices(cfg: DictConfig) -> list[str]:
    lines = []
    for key in CHECKPOINT_SECTIONS:
        saved = OmegaConf.select(cfg, key).save_contents
        left_out = [c for c in ("model", "optimizer", "extra") if c not in saved]
        if left_out:
            lines.append(
                f"{key}.save_contents={as_written(saved)}: checkpoints leave out {', '.join(left_out)}, so a "
                "resumed run does not continue exactly (model: the weights; optimizer: AdamW's moments; extra: "
                "the LR schedule, RNG states and shuffles)"
            )
    return lines


RAY_WATCHDOG_KEYS = ("worker_timeout_s", "heartbeat_timeout_s")
"""trainer keys only the Ray backend reads: the deadline of a call to a worker process, and its heartbeats"""


def _watchdog_notices(cfg: DictConfig) -> list[str]:
    if cfg.trainer.backend == "ray":
        return []
    default = OmegaConf.structured(TrainerSection)
    return [
        f"trainer.{key}={as_written(cfg.trainer[key])} has no effect with trainer.backend={cfg.trainer.backend} "
        "(the workers run in this process's threads, which nothing can stop from outside; it bounds the calls "
        "to worker processes with trainer.backend=ray)"
        for key in RAY_WATCHDOG_KEYS
        if cfg.trainer[key] != default[key]
    ]


def backend_notices(cfg: DictConfig) -> list[str]:
    """Keys of a TrainerConfig set to a value that only another backend, or only a GPU, reads: accepted, and
    reported."""
    return (
        _unread([*ROLLOUT_KEYS, LOGPROBS_MODE], cfg.actor_rollout_ref.rollout)
        + _gpu_only_notices(cfg)
        + ([SGLANG_UNTESTED] if cfg.actor_rollout_ref.rollout.name == "sglang" else [])
        + _fsdp_notices(cfg)
        + _checkpoint_notices(cfg)
        + _watchdog_notices(cfg)
    )


def _tokenizer_errors(cfg: DictConfig) -> list[str]:
    """The policy's tokenizer is the only one: prompts, rollouts, critic and reward all use its ids."""
    model = cfg.actor_rollout_ref.model
    policy = (None, model.path, model.tokenizer_path)
    where = "actor_rollout_ref.model.tokenizer_path (None = actor_rollout_ref.model.path)"
    errors = []
    if cfg.data.tokenizer not in policy:
        errors.append(
            f"data.tokenizer={cfg.data.tokenizer} has no effect: prompts are tokenized with the policy's "
            f"tokenizer, {where}; set that instead"
        )
    if cfg.critic.model.tokenizer_path not in policy:
        errors.append(
            f"critic.model.tokenizer_path={cfg.critic.model.tokenizer_path} has no effect: the critic scores "
            f"the policy's token ids, so it shares the policy's tokenizer, {where}"
        )
    return errors


def backend_errors(cfg: DictConfig) -> list[str]:
    """One message per key of a TrainerConfig that the selected backends would silently ignore."""
    errors = _rollout_errors(cfg)
    arr = cfg.actor_rollout_ref
    strategy = arr.actor.strategy
    if strategy is not None and strategy not in BUILT_STRATEGIES:
        status = "not built" if strategy in NOT_BUILT_STRATEGIES else "unknown strategy"
        errors.append(
            f"actor_rollout_ref.actor.strategy={strategy}: {status}; available: {', '.join(BUILT_STRATEGIES)} "
            "(or unset: fsdp2 when trainer.backend=ray and trainer.nnodes x n_gpus_per_node > 1, else dp)"
        )
    errors.extend(_fsdp_errors(cfg))
    errors.extend(_checkpoint_errors(cfg))
    errors.extend(_tokenizer_errors(cfg))
    reward = cfg.reward_model
    if reward.overlong_buffer.enable and reward.reward_manager in REWARD_MANAGERS_WITHOUT_OVERLONG:
        errors.append(
            f"reward_model.overlong_buffer.enable=true has no effect with reward_model.reward_manager="
            f"{reward.reward_manager} (the overlong penalty is applied by reward_model.reward_manager=dapo)"
        )
    return errors


def sft_backend_notices(cfg: DictConfig) -> list[str]:
    """Keys of an SFTConfig that ``verl sft`` accepts without reading them yet: there is no validation pass."""
    lines = []
    if cfg.data.val_files is not None:
        lines.append(
            f"data.val_files={short_repr(cfg.data.val_files)} has no effect: verl sft has no validation pass"
        )
    if cfg.trainer.test_freq != -1:
        lines.append(
            f"trainer.test_freq={cfg.trainer.test_freq} has no effect: verl sft has no validation pass"
        )
    return lines
