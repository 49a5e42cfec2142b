"""What a rule for one of the original verl's config keys is (:class:`Rule`, and a constructor per kind:
rename, no effect, accepted only at some values, read after merging), and the reasons shared by many keys of
verl's PPO and SFT configs. Pure data, like the rule lists built from it (:mod:`verl.config.verl_rules`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rule:
    """What one verl key (or a glob of keys: ``*`` also matches dots) does here."""

    pattern: str
    """the key, or an fnmatch glob"""
    kind: str
    """rename | no_effect | only | deferred"""
    why: str = ""
    """no_effect: why it changes nothing here; only: what other values would do and what would honour them"""
    target: str | None = None
    """rename: our key (a trailing ``*`` takes the rest of the matched key)"""
    honoured: tuple[Any, ...] = ()
    """only: the values accepted (they mean what this repository does)"""
    deprecated: bool = False
    """rename: verl's old spelling, reported with the new one"""


def _no(pattern: str, why: str) -> Rule:
    return Rule(pattern, "no_effect", why)


def _only(pattern: str, honoured: tuple[Any, ...], why: str) -> Rule:
    return Rule(pattern, "only", why, honoured=honoured)


def _rename(pattern: str, target: str, deprecated: bool = False) -> Rule:
    return Rule(pattern, "rename", target=target, deprecated=deprecated)


def _deferred(pattern: str, why: str) -> Rule:
    """Read after all sources are merged, because its meaning depends on other keys (see ``apply_deferred``)."""
    return Rule(pattern, "deferred", why)


# Why each group of keys changes nothing here.
FSDP = (
    "a setting of verl's GPU engines with no counterpart in the FSDP2 engine here (actor.strategy=fsdp2: "
    "fsdp_config.fsdp_size, reshard_after_forward, param_offload, optimizer_offload, offload_policy, "
    "mixed_precision and wrap_policy are read)"
)
FSDP_KEYS = (
    "param_offload",
    "optimizer_offload",
    "offload_policy",
    "reshard_after_forward",
    "fsdp_size",
    "mixed_precision.*",
    "wrap_policy.*",
)
"""the fsdp_config keys the FSDP2 engine reads (verl.config.schema_workers.FSDPConfig)"""
COMPUTE_DTYPE = (
    "the compute dtype of verl's newer engine; FSDP2 here computes in fsdp_config.mixed_precision.param_dtype "
    "(unset: bf16 on a GPU, the weights' dtype on a CPU)"
)
PROFILER = (
    "profiler hooks (nsys / torch / NPU): none is attached here; trainer.trace=true writes a per-step trace"
)
SERVER = (
    "a setting of verl's inference-server plumbing (vLLM / SGLang) that the vllm engine here does not read: it "
    "runs in the worker's own process, its weights handed over in memory"
)
KERNELS = "a kernel or memory optimisation of verl's GPU workers: the same results, computed without it here"
ULYSSES = "Ulysses sequence parallelism splits sequences over GPUs; every worker here holds whole sequences"
CHECKPOINT = (
    "how verl's engines load a checkpoint (strict key matching, Megatron bridges): loading here always checks "
    "every key; checkpoint.save_contents / load_contents are read"
)
TARGET = "names the dataclass verl builds this section into; there is nothing to choose here"
DERIVED = "an interpolation of other keys in verl; the same value comes from those keys here"
RAY = "Ray start-up options: trainer.backend=ray starts Ray (or joins RAY_ADDRESS) with this machine's resources"
MEDIA = "images / video / audio inputs: prompts here are text"
LOADER = "data-loader workers and shared memory: the dataset is read in the trainer process here"
LOGGING = "an output verl writes besides its metrics (generations, rollout dumps): not written here"
STRATEGY = "the critic and reference follow actor_rollout_ref.actor.strategy here"
SEED = "a second seed verl keeps for one component: every random stream here derives from trainer.seed"
REWARD_MODEL = (
    "a setting of verl's reward-model workers (FSDP / Megatron sharding, dynamic batch sizes): a discriminative "
    "reward model here (reward_model.enable) runs in the reward workers' processes, "
    "reward_model.micro_batch_size_per_gpu samples per forward pass; a generative one is served per "
    "reward_model.rollout"
)
GENRM_PLACEMENT = (
    "where verl places its reward-model servers and how it splits them over GPUs (a pool of their own or the "
    "actor's; tensor / data / pipeline / expert parallel replicas): here one server runs in the trainer's process "
    "on trainer.device, the whole model in one engine (the same replies)"
)
GENRM_SERVER = (
    "a setting of verl's vLLM / SGLang reward-model server that the engine serving the reward model here does not "
    "read (the same replies)"
)
ROLLOUT_IS_V06 = (
    "verl 0.6.0's flat rollout-IS keys (metrics under mismatch/): verl 0.7 moved them to "
    "algorithm.rollout_correction.* (rollout_is=token|sequence, rollout_is_threshold, rollout_rs, bypass_mode), "
    "which are read here"
)
HYDRA = "Hydra's own settings (its output directory, logging, search path): Hydra is not used here"
ASYNC = (
    "trainer.v1.trainer_mode=separate_async here is a rollout role that generates num_warmup_batches batches ahead "
    "with weights copied in after every step, streaming from a pool of generations (partial rollouts) with "
    "async_training.staleness_threshold > 0, as colocate_async does on the actor's workers; verl's pluggable "
    "replay-buffer samplers and hybrid switching are not built"
)
WEIGHT_SYNC = (
    "keyword arguments of verl's checkpoint-engine backend classes (nixl / mooncake / nccl transports): the weight "
    "sync here reads checkpoint_engine.backend and update_weights_bucket_megabytes only"
)
ROUTER = (
    "verl 0.9.1's pluggable load balancer choosing which inference-server replica serves a request (e.g. by prompt "
    "prefix): here each rollout worker generates its own share of the batch; the samples are the same"
)
CONCURRENCY = (
    "the limited reward manager's cap on reward calls in flight: each reward worker here makes its calls one at a "
    "time, within any cap (reward_model.max_rpm / max_tpm pace them)"
)
TEACHER_PLACEMENT = (
    "where verl places its distillation teachers (a GPU pool of their own, replicas of an inference server): each "
    "teacher here runs in the actor's worker processes next to the reference, sharded and offloaded like it under "
    "FSDP2"
)
TEACHER_SERVER = (
    "a setting of verl's vLLM / SGLang teacher server: each teacher here is a transformers model scoring in the "
    "actor's worker processes (actor_rollout_ref.model's padding removal, prompt sharing and log_prob_chunk_size; "
    "at temperature 1, as verl's server)"
)
CHUNKED_TOPK = (
    "verl (after 0.9.1) streams forward_kl_topk's log-softmax in chunks to save memory: here the student's log-probs "
    "at the teacher's top-k ids are always taken chunk by chunk inside the LM head, "
    "actor_rollout_ref.model.log_prob_chunk_size positions at a time (0 = all at once), recomputed in the backward "
    "pass"
)
