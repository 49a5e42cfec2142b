"""A generative reward model (GenRM), served like a rollout, as verl 0.9.1's reward loop serves one.

With ``reward_model.enable`` and ``custom_reward_function.path`` (the rule is :func:`verl.config.genrm.serves_genrm`)
the reward model is a causal LM that judges in text: the run serves it once, in the trainer's process, behind
an OpenAI-compatible HTTP endpoint, and the custom reward function, called with ``reward_router_address``
(``host:port``) and ``reward_model_tokenizer``, posts chat requests to
``http://{reward_router_address}/v1/chat/completions`` and turns the reply into a score.

The serving is the rollout's own: an engine of ``reward_model.rollout.name`` built over the reward model
(:func:`build_engine`), a :class:`~verl.workers.rollout.server.RolloutServer` whose thread puts the requests
waiting into one engine call, and :class:`~verl.workers.rollout.http_front.OpenAIFront` in front of it
(:class:`GenRMService`). Reward workers reach it in-process (``trainer.backend=local``) or from their own
processes (``ray``: on one node over 127.0.0.1, on several over this node's address).

Why in the trainer's process rather than a process of its own: the engines here generate in the process that
holds them (as the rollout does), a fresh process would load torch and the model again for nothing, and the
trainer is where the run starts and ends, so the server starts once and is closed with the run
(:meth:`GenRMService.close`, from ``RLTrainer.shutdown``).
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, fields
from typing import Any

import torch
from omegaconf import OmegaConf

from verl.config.genrm import GENRM_KWARGS, SECTION, serves_genrm
from verl.errors import InputError
from verl.models.loading import (
    check_model_dir,
    eos_token_ids,
    load_hf_model,
    load_tokenizer,
    max_positions,
    model_config_dict,
    resolve_dtype,
)
from verl.models.plumbing import resolve_device
from verl.workers.reward.loading import accepted_kwargs, load_custom_reward_function
from verl.workers.rollout import get_rollout_class
from verl.workers.rollout.base import RolloutEngine, package_version
from verl.workers.rollout.http_front import OpenAIFront
from verl.workers.rollout.openai_api import SamplingDefaults
from verl.workers.rollout.server import RolloutServer

logger = logging.getLogger(__name__)

PATH_KEY = "reward_model.model.path"

SEED_OFFSET = 7919
"""the reward model's sampling seed is trainer.seed + this: a stream of its own, apart from the policy's"""

CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
"""architecture names of models that generate text"""


# ------------------------------------------------------------------------------------------ start-up checks


def check_genrm_inputs(config: Any) -> None:
    """At start-up, before anything loads: the reward model's directory holds a causal LM with a tokenizer, the
    custom function takes the client's arguments, and aiohttp (the HTTP server) is installed. Each problem is
    an InputError naming its key."""
    source = check_model_dir(config.reward_model.model.path, PATH_KEY, need_tokenizer=True)
    model_config = model_config_dict(source)
    if model_config is not None:  # a local directory (a hub id is checked when it loads)
        _check_causal(model_config, source)
    section = config.custom_reward_function
    fn = load_custom_reward_function(section.path, section.name)
    if not accepted_kwargs(fn, dict.fromkeys(GENRM_KWARGS)):
        raise InputError(
            f"custom_reward_function {section.name} ({section.path}) takes neither reward_router_address nor "
            "reward_model_tokenizer: with reward_model.enable=true it is the generative reward model's client "
            "(verl's rule) and needs the address to call it; add the parameters (or **kwargs), or set "
            "reward_model.enable=false"
        )
    try:
        import aiohttp  # noqa: F401
    except ImportError as exc:
        raise InputError(
            "a generative reward model (reward_model.enable=true with custom_reward_function.path) is served over "
            "HTTP with aiohttp, which is not installed: pip install aiohttp"
        ) from exc


def _check_causal(model_config: dict[str, Any], source: str) -> None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    architectures = [str(a) for a in model_config.get("architectures") or []]
    if architectures:
        causal = any(a.endswith(CAUSAL_SUFFIXES) for a in architectures)
    else:
        causal = model_config.get("model_type") in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    if not causal:
        found = ", ".join(architectures) or f"model_type {model_config.get('model_type')!r}"
        raise InputError(
            f"{PATH_KEY}={source}: a generative reward model must be a causal LM (it writes its judgement); this "
            f"checkpoint is {found}. custom_reward_function.path is set, so the reward model is generative (verl's "
            "rule): for a discriminative one, unset custom_reward_function.path, or weigh it in with "
            "reward_model.reward_fns=[correctness,reward_model]"
        )


# ------------------------------------------------------------------------------------------ the engine


def _dtype(section: Any, device: torch.device) -> torch.dtype:
    if section.dtype:
        return resolve_dtype(section.dtype, f"{SECTION}.dtype")
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _max_model_len(section: Any, model: torch.nn.Module) -> int:
    if section.max_model_len:
        return int(section.max_model_len)
    limit = max_positions(model.config.to_dict())
    if limit is None:
        raise InputError(
            f"{PATH_KEY}: the model's config gives no max_position_embeddings; set {SECTION}.max_model_len"
        )
    return int(limit)


def _engine_section(section: Any, dtype: torch.dtype, max_len: int) -> Any:
    """The ``rollout`` section an inference engine with its own weights is built from: the rollout schema's
    defaults with the reward model's settings."""
    from verl.config.schema_workers import RolloutConfig

    keys = ("name", "max_num_seqs", "gpu_memory_utilization", "enforce_eager", "free_cache_engine")
    keys += ("enable_chunked_prefill", "enable_prefix_caching", "max_num_batched_tokens")
    settings = {key: section[key] for key in keys}
    settings.update(dtype=str(dtype).removeprefix("torch."), max_model_len=max_len)
    settings["engine_kwargs"] = OmegaConf.to_container(section.engine_kwargs, resolve=True)
    return OmegaConf.merge(OmegaConf.structured(RolloutConfig), settings)


@dataclass
class BuiltEngine:
    """The reward model's engine and what its server needs to know about the model."""

    engine: RolloutEngine
    tokenizer: Any
    stop_ids: list[int]
    max_model_len: int
    description: str


def build_engine(config: Any, device: torch.device) -> BuiltEngine:
    """The reward model loaded (``reward_model.model.path``) and its engine (``reward_model.rollout.name``) on
    ``device``. An engine computing with the module (fast, hf) draws from a generator of its own when it can
    (fast), seeded from trainer.seed; one with its own weights (vllm, sglang) takes them once, as version 0."""
    reward = config.reward_model
    section = reward.rollout
    trust = bool(reward.model.trust_remote_code)
    tokenizer = load_tokenizer(reward.model.path, trust, key=PATH_KEY)
    engine_cls = get_rollout_class(section.name)
    dtype = _dtype(section, device)
    # an engine with its own copy of the weights takes them from the CPU: the module never needs the device
    load_on = torch.device("cpu") if engine_cls.owns_weights else device
    model = load_hf_model(reward.model.path, torch_dtype=dtype, trust_remote_code=trust, key=PATH_KEY)
    _check_causal(model.config.to_dict(), str(reward.model.path))  # a hub id is only known once loaded
    model = model.to(load_on).eval().requires_grad_(False)
    stop_ids = eos_token_ids(tokenizer, model)
    max_len = _max_model_len(section, model)
    seed = int(config.trainer.seed) + SEED_OFFSET
    if engine_cls.owns_weights:
        try:
            engine = engine_cls(
                model,
                stop_ids,
                tokenizer.pad_token_id,
                None,
                config=_engine_section(section, dtype, max_len),
                max_model_len=max_len,
                seed=seed,
                device=device,
            )
        except ValueError as exc:  # the engine refuses the model (e.g. vLLM's CPU head sizes)
            raise InputError(f"{SECTION}.name={section.name} for {PATH_KEY}: {exc}") from exc
        engine.sync_weights(model, 0)
        del model  # the engine holds its own copy
    else:
        engine = engine_cls(model, stop_ids, tokenizer.pad_token_id)
        if hasattr(engine, "generator"):
            engine.generator = torch.Generator(device).manual_seed(seed)
    engine.calculate_log_probs = True  # the server's `logprobs` (hf computes them only when asked)
    label = f"{engine_cls.label}{package_version(engine_cls.package)}"
    return BuiltEngine(
        engine, tokenizer, stop_ids, max_len, f"{label} in {str(dtype).removeprefix('torch.')} on {device}"
    )


def sampling_defaults(section: Any, max_model_len: int) -> SamplingDefaults:
    """What a request that does not say gets: ``reward_model.rollout``'s sampling keys."""
    return SamplingDefaults(
        temperature=float(section.temperature),
        top_p=float(section.top_p),
        top_k=int(section.top_k),
        do_sample=bool(section.do_sample),
        max_tokens=int(section.response_length),
        max_model_len=max_model_len,
    )


# ------------------------------------------------------------------------------------------ the service


@dataclass(frozen=True)
class GenRMStats:
    """The service's counters at one moment; :meth:`metrics_since` turns two into a step's metrics."""

    requests: int = 0
    """HTTP requests answered with a reply"""
    engine_calls: int = 0
    """engine calls the requests were batched into"""
    prompt_tokens: int = 0
    generated_tokens: int = 0
    engine_seconds: float = 0.0
    """wall time the engine spent generating"""

    def metrics_since(self, before: GenRMStats) -> dict[str, float]:
        """``reward/genrm_requests``, ``reward/genrm_engine_calls``, ``reward/genrm_prompt_tokens``,
        ``reward/genrm_generated_tokens`` and ``timing_s/genrm`` between ``before`` and now."""
        delta = {f.name: getattr(self, f.name) - getattr(before, f.name) for f in fields(self)}
        metrics = {
            f"reward/genrm_{name}": float(value) for name, value in delta.items() if name != "engine_seconds"
        }
        metrics["timing_s/genrm"] = float(delta["engine_seconds"])
        return metrics


class GenRMService:
    """The reward model's engine, its server and the HTTP front, started together and closed together.

    ``address`` is the ``reward_router_address`` the reward function gets. ``close()`` stops the front (the
    requests in flight are answered first), then the server's thread; the port is free when it returns.
    """

    def __init__(
        self,
        built: BuiltEngine,
        defaults: SamplingDefaults,
        model_name: str,
        *,
        host: str = "127.0.0.1",
        max_num_seqs: int = 1024,
    ) -> None:
        self.built = built
        self.server = RolloutServer(built.engine, max_num_seqs)
        try:
            self.front = OpenAIFront(
                [self.server], built.tokenizer, defaults, built.stop_ids, model_name, host=host
            )
        except BaseException:
            self.server.close()
            raise
        self.address = self.front.address
        self.model_name = model_name
        self._finalizer = weakref.finalize(self, _close, self.front, self.server)

    @classmethod
    def from_config(cls, config: Any) -> GenRMService:
        """Load the reward model and start serving it on :func:`serving_host`, for a config that asks for a
        generative reward model (:func:`verl.config.genrm.serves_genrm`)."""
        if not serves_genrm(config):
            raise ValueError(
                "the config asks for no generative reward model (see verl.config.genrm.serves_genrm)"
            )
        section = config.reward_model.rollout
        built = build_engine(config, resolve_device(config.trainer.device))
        defaults = sampling_defaults(section, built.max_model_len)
        service = cls(
            built,
            defaults,
            str(config.reward_model.model.path),
            host=serving_host(config),
            max_num_seqs=int(section.max_num_seqs),
        )
        logger.info("generative reward model served at http://%s (%s)", service.address, service.describe())
        return service

    def describe(self) -> str:
        """The start-up line: the model, its engine, where it is served."""
        return (
            f"{self.model_name}, {self.built.description}, batches of at most {self.server.max_num_seqs}, served "
            f"at http://{self.address}/v1/chat/completions"
        )

    def stats(self) -> GenRMStats:
        front, server = self.front.stats, self.server
        return GenRMStats(
            requests=front.requests,
            engine_calls=server.engine_calls,
            prompt_tokens=front.prompt_tokens,
            generated_tokens=server.tokens_generated,
            engine_seconds=server.engine_seconds,
        )

    def close(self) -> None:
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive


def _close(front: OpenAIFront, server: RolloutServer) -> None:
    front.close()
    server.close()


def serving_host(config: Any) -> str:
    """Where the front listens: 127.0.0.1 when every reward worker runs on this machine (trainer.backend=local,
    or a Ray cluster of one node), else this node's address, which the workers on the other nodes reach."""
    if config.trainer.backend != "ray":
        return "127.0.0.1"
    import ray

    from verl.single_controller.ray import ensure_ray

    ensure_ray()
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    if len(nodes) <= 1 and int(config.trainer.nnodes) <= 1:
        return "127.0.0.1"
    return ray.util.get_node_ip_address()


# ------------------------------------------------------------------------------------------ the client side


def client_kwargs(config: Any, reward_router_address: str | None) -> dict[str, Any]:
    """What a reward worker binds to the custom function of a generative reward model: the server's address and
    the reward model's tokenizer (verl's ``reward_router_address`` and ``reward_model_tokenizer``). Empty when
    the reward model is not generative."""
    if not serves_genrm(config):
        return {}
    if not reward_router_address:
        raise ValueError(
            "the reward model is generative (reward_model.enable with custom_reward_function.path) but no server "
            "address was given: RLTrainer starts the server (GenRMService) and hands its address to the reward "
            "workers"
        )
    tokenizer = load_tokenizer(
        config.reward_model.model.path, bool(config.reward_model.model.trust_remote_code), key=PATH_KEY
    )
    return {"reward_router_address": reward_router_address, "reward_model_tokenizer": tokenizer}
