"""Role workers: thin :class:`~verl.single_controller.Worker` classes that wire models, engines and
algorithms together. The controller calls their ``@register``-ed methods through a worker group, in
this process or in Ray actor processes. Each takes a :class:`DataProto` and, besides it, typed values
(``validate``, an :class:`~verl.workers.requests.UpdateRequest`), never string keys in ``meta_info``;
passes return a :class:`DataProto`, updates a plain metrics dict.

``ActorRolloutRefWorker`` is the hybrid engine: one worker holding the actor (trained), the
rollout (fast / hf generate with the actor's own module; vllm holds a copy of the weights, synchronised
to the current policy version before it generates), when a KL term needs it, the reference: a frozen
copy, or with LoRA the actor's own module with its adapters disabled, and with on-policy distillation the
frozen teachers, held beside the reference. ``CriticWorker`` (`verl.workers.critic_worker`) holds the
value model, ``RewardWorker`` (`verl.workers.reward_worker`) the rule-based reward functions.

What every worker process sets up (config, seeds, device, models) is in `verl.workers.worker_setup`, the
checkpoint and HuggingFace files a trained role writes in `verl.workers.role_files`.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

from verl.algorithms.distillation import DistillationLossOptions
from verl.config import derive_sizes
from verl.config.backends import training_strategy
from verl.config.validation_distillation import distillation_enabled
from verl.models import tokenizer_for
from verl.models.base_fingerprint import base_fingerprint, check_same_base, write_fingerprint
from verl.models.lora import adapter_weight_names, adapters_disabled, apply_lora, has_adapters
from verl.protocol import DataProto
from verl.single_controller import Dispatch, Worker, register
from verl.utils.precision import model_dtype, role_compute_dtype
from verl.workers.actor import Actor, compute_log_prob
from verl.workers.engine.distributed import consecutive_group
from verl.workers.engine.fsdp import gathered, place_frozen
from verl.workers.engine.scoring import PolicyScorer
from verl.workers.engine.update_loop import run_update
from verl.workers.errors import (
    ACTOR_UPDATE_KNOBS,
    GENERATE_KNOBS,
    LOG_PROB_KNOBS,
    REF_LOG_PROB_KNOBS,
    explain_oom,
)
from verl.workers.requests import UpdateRequest
from verl.workers.role_files import load_contents, save_role_checkpoint, write_hf_model
from verl.workers.rollout import get_rollout_class
from verl.workers.rollout.base import ROLLOUT_ENTROPY_KEY
from verl.workers.rollout.host import HostCalls, RolloutHost
from verl.workers.rollout.served import full
from verl.workers.rollout.weight_sync import checksum, pack_buckets, sync_settings
from verl.workers.teacher import Teacher, Teachers, resolve_teacher_models
from verl.workers.worker_setup import (
    attention_for,
    load_policy_model,
    on_device,
    prepare_for_training,
    setup_process,
    trainer_config,
)


def distillation_options(config: Any) -> DistillationLossOptions | None:
    """``distillation.distillation_loss`` when on-policy distillation is on, else None."""
    if not distillation_enabled(config):
        return None
    return DistillationLossOptions.of(config.distillation.distillation_loss)


class ActorRolloutRefWorker(HostCalls, Worker):
    """Actor + rollout + reference for one data-parallel rank.

    ``actor_model`` is the causal LM being trained (the rollout generates with it), ``actor`` its
    `Actor` (log-probs and updates), ``ref_model`` the frozen reference copy and ``ref_scorer`` its
    forward pass (both None without a KL term), built once. With LoRA there is no copy (``ref_in_actor``,
    verl's name): the reference is the actor's module run with its adapters disabled, and checkpoints
    hold the adapters alone, with a fingerprint of the base model's files (``base_fingerprint``) that a
    resume checks ``model.path`` against.

    ``config`` is a trainer config or its ``actor_rollout_ref`` section (see `trainer_config`).
    ``total_training_steps`` (the LR schedule's length) defaults to ``trainer.total_training_steps``, or
    1 when unset; ``need_ref`` to whether a KL term needs the reference (``algorithm.use_kl_in_reward`` or
    ``actor.use_kl_loss``). It runs in-process on CPU as well as in a Ray worker.

    ``host`` (:class:`verl.workers.rollout.host.RolloutHost`) does all generating, with the actor's module:
    the engine, its weight sync, the server, agent loops and, with ``trainer.v1.trainer_mode=colocate_async``,
    the streaming pool (`HostCalls`' calls): generations unfinished at an update go on with the updated
    module in the next step.
    """

    def __init__(
        self, config: Any, total_training_steps: int | None = None, need_ref: bool | None = None
    ) -> None:
        config = trainer_config(config)
        self.config = config
        self.device = setup_process(config, self.rank)
        arr = config.actor_rollout_ref
        model_cfg = arr.model
        if total_training_steps is None:
            total_training_steps = config.trainer.total_training_steps or 1
        if need_ref is None:
            need_ref = bool(config.algorithm.use_kl_in_reward or arr.actor.use_kl_loss)
        self.tokenizer = tokenizer_for(model_cfg)
        self.sizes = derive_sizes(config)
        self.actor_model = load_policy_model(model_cfg, self.device)
        # LoRA (lora_rank > 0 or lora_adapter_path): adapters injected in place (new, or the saved ones),
        # only they train; the optimizer gets only them.
        self.actor_model = apply_lora(self.actor_model, model_cfg)
        lora = has_adapters(self.actor_model)
        self.base_fingerprint = base_fingerprint(model_cfg.path) if lora else None
        """with LoRA, the fingerprint of model.path's files (verl.models.base_fingerprint), kept in checkpoints"""
        scoring = {
            "remove_padding": model_cfg.use_remove_padding,
            "chunk_size": model_cfg.log_prob_chunk_size,
            "share_prompts": model_cfg.share_prompts,
        }
        self.sharded = training_strategy(config) == "fsdp2"
        self.compute = role_compute_dtype(
            arr.actor.fsdp_config,
            device=self.device,
            weights_dtype=model_dtype(self.actor_model),
            sharded=self.sharded,
            key="actor_rollout_ref.actor.fsdp_config",
        )
        self.ref_model = self.ref_scorer = self.ref_offload = None
        self.ref_in_actor = need_ref and lora
        """the reference is the actor's own module with its adapters disabled (LoRA): no second copy"""
        if need_ref and not lora:
            # The reference starts from the same weights and never trains: a deep copy (taken before the
            # actor is sharded) saves a second load.
            self.ref_model = copy.deepcopy(self.actor_model).eval().requires_grad_(False)
            self.ref_scorer = PolicyScorer(self.ref_model, **scoring)
            self.ref_offload = place_frozen(
                self.ref_scorer,
                self.ref_model,
                arr.ref.fsdp_config,
                self.device,
                sharded=self.sharded,
                key="actor_rollout_ref.ref.fsdp_config",
            )
        self.teachers = self._build_teachers(scoring)
        """on-policy distillation's frozen teachers (`verl.workers.teacher.Teachers`), or None"""
        optimizer, lr_scheduler = prepare_for_training(
            self.actor_model, model_cfg, arr.actor.optim, total_training_steps
        )
        # Same shuffle seed on every rank; Actor shards its scorer (fsdp2), or wraps it in DDP when data
        # parallelism is on.
        self.actor = Actor(
            self.actor_model,
            arr.actor,
            optimizer,
            lr_scheduler,
            seed=config.trainer.seed,
            fsdp_config=arr.actor.fsdp_config if self.sharded else None,
            fsdp_key="actor_rollout_ref.actor.fsdp_config",
            compute_dtype=self.compute.dtype,
            distillation=distillation_options(config),
            **scoring,
        )

        rollout_cls = get_rollout_class(arr.rollout.name)
        tp = int(arr.rollout.tensor_model_parallel_size)
        self.host = RolloutHost(
            config,
            self.actor_model,
            self.tokenizer,
            self.device,
            self.rank,
            self.compute,
            resident=self.actor.resident,
            gathered=lambda: gathered(self.actor.scorer),
            # the ranks sharing one tensor-parallel engine with this one (a collective: every rank forms it)
            engine_group=consecutive_group(tp) if rollout_cls.owns_weights and tp > 1 else None,
            pool_version=lambda train_step: train_step - 1,  # colocated: every update before this step's
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @explain_oom(*GENERATE_KNOBS)
    @on_device
    def generate_sequences(self, prompts: DataProto, validate: bool = False) -> DataProto:
        """Sample responses; ``validate`` samples with the validation settings (``rollout.val_kwargs``,
        greedy by default).

        The prompts' other per-sample fields come back with the output, so the result is the whole batch
        the next steps need.
        """
        return self.host.generate(prompts, validate)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @explain_oom(*LOG_PROB_KNOBS)
    @on_device
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` (and ``entropys``) of the responses under the current policy."""
        rollout_cfg = self.config.actor_rollout_ref.rollout
        log_probs, entropy = self.actor.compute_log_prob(
            data,
            rollout_cfg.log_prob_micro_batch_size_per_gpu,
            rollout_cfg.temperature,
            with_entropy=True,
            max_tokens=self.sizes.log_prob_max_tokens,
        )
        return DataProto.from_dict(tensors={"old_log_probs": log_probs, "entropys": entropy})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @explain_oom(*REF_LOG_PROB_KNOBS)
    @on_device
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob``: log-probs of the responses under the frozen reference policy (with LoRA, the
        actor's module with its adapters disabled: the base model)."""
        if self.ref_in_actor:
            scorer, context = self.actor.scorer, self._actor_as_base()
        elif self.ref_scorer is not None:
            scorer = self.ref_scorer
            context = self.ref_offload.resident() if self.ref_offload else contextlib.nullcontext()
        else:
            raise RuntimeError(
                "compute_ref_log_prob called but no reference model was built (no KL term is on)"
            )
        with context:
            log_probs, _ = compute_log_prob(
                scorer,
                data,
                self.config.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu,
                self.config.actor_rollout_ref.rollout.temperature,
                max_tokens=self.sizes.ref_max_tokens,
            )
        return DataProto.from_dict(tensors={"ref_log_prob": log_probs})

    def _build_teachers(self, scoring: dict[str, Any]) -> Teachers | None:
        """The distillation teachers (``distillation.enabled``), loaded as the policy is (its dtype, attention,
        scoring options) and held as the reference is (its fsdp_config: sharded and offloaded under FSDP2)."""
        distillation = self.config.distillation
        if not distillation.enabled:
            return None
        model_cfg = self.config.actor_rollout_ref.model
        key = "actor_rollout_ref.ref.fsdp_config"
        teachers = {}
        for routing_key, spec in resolve_teacher_models(distillation.teacher_models).items():
            teacher = Teacher(
                spec,
                self.tokenizer,
                self.device,
                torch_dtype=model_cfg.torch_dtype,
                attn_implementation=attention_for(
                    model_cfg.attn_implementation, model_cfg.use_remove_padding
                ),
                trust_remote_code=model_cfg.trust_remote_code,
                **scoring,
            )
            fsdp_config = self.config.actor_rollout_ref.ref.fsdp_config
            teacher.place_like_reference(fsdp_config, self.device, sharded=self.sharded, key=key)
            teachers[routing_key] = teacher
        return Teachers(teachers, distillation.teacher_key)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @explain_oom(*REF_LOG_PROB_KNOBS)
    @on_device
    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        """``teacher_logprobs`` and ``teacher_ids`` of the responses under the distillation teachers (each sample
        routed by ``distillation.teacher_key``): the sampled tokens' log-probs, or each position's top-k for a
        top-k loss, at temperature 1; micro-batches as the reference pass's."""
        if self.teachers is None:
            raise RuntimeError(
                "compute_teacher_log_prob called but no teacher was built (distillation.enabled=false)"
            )
        options = self.actor.distillation
        return self.teachers.score(
            data,
            topk=int(options.topk) if options.settings.use_topk else 0,
            micro_batch_size=self.config.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu,
            max_tokens=self.sizes.ref_max_tokens,
        )

    @contextlib.contextmanager
    def _actor_as_base(self) -> Iterator[None]:
        """The actor's weights resident, its LoRA adapters disabled: the base model, for the reference."""
        with self.actor.resident(), adapters_disabled(self.actor_model):
            yield

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRICS)
    @explain_oom(*ACTOR_UPDATE_KNOBS)
    @on_device
    def update_actor(self, data: DataProto, request: UpdateRequest) -> dict[str, float]:
        """One policy update on ``data`` (with advantages); the ``actor/*`` metrics, the same on every rank."""
        sizes = request.sizes
        correction = self.config.algorithm.rollout_correction
        update = self.actor.plan_update(
            data,
            mini_batch_size=sizes.mini_batch_samples,
            micro_batch_size=sizes.micro_batch_samples,
            temperature=self.config.actor_rollout_ref.rollout.temperature,
            progress=request.progress,
            max_tokens=sizes.actor_max_tokens,
            # (the trainer left the rollout's entropies in the batch when actor/entropy came from them)
            measure_entropy=request.measure_entropy and ROLLOUT_ENTROPY_KEY not in data.batch,
            bypass_correction=correction if correction.bypass_mode else None,
        )
        metrics = run_update(self.actor, update)
        self.host.version += 1
        return metrics

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def get_weights(self, trained_only: bool = False) -> dict[str, Any] | None:
        """A CPU copy of the policy's weights for a rollout with its own model (asynchronous training), in
        buckets of at most ``rollout.checkpoint_engine.update_weights_bucket_megabytes`` (`pack_buckets`; in a
        Ray worker, references into Ray's object store): rank 0's (gathered tensor by tensor when sharded, a
        collective); the other ranks answer None. ``trained_only``: with LoRA, the adapters alone (the base
        never changes: a rollout that holds it needs only them; ``complete`` is then False); without LoRA the
        whole weights either way. With LoRA ``adapters_digest`` is the digest of the adapters sent (the rollout
        checks it: `verl.workers.rollout.lora_guard`)."""
        lora = has_adapters(self.actor_model)
        adapters = trained_only and lora
        adapter_names = adapter_weight_names(self.actor_model)
        sent: dict[str, Any] = {}
        names: list[str] = []

        def stream() -> Iterator[tuple[str, Any]]:
            # every rank takes part in a sharded tensor's gather, in the same order; rank 0 keeps them
            for name, tensor in self.actor_model.state_dict().items():
                if adapters and name not in adapter_names:
                    continue
                tensor = full(tensor).cpu()
                if self.rank == 0:
                    names.append(name)
                    if name in adapter_names:
                        sent[name] = tensor
                    yield name, tensor

        with self.actor.resident():
            if self.rank != 0:
                if self.sharded:
                    for _ in stream():
                        pass
                return None
            packed = pack_buckets(stream(), sync_settings(self.config).bucket_bytes)
        digest = checksum(sent.items()) if lora else None
        return {"buckets": packed, "names": names, "complete": not adapters, "adapters_digest": digest}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_hf(self, path: str) -> None:
        """Write the current policy as a HuggingFace directory (weights, config, tokenizer); rank 0 writes."""
        write_hf_model(self.actor, self.rank, path)
        if self.rank == 0:
            self.tokenizer.save_pretrained(path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str, background: bool = False) -> None:
        """This rank's part of a checkpoint (see verl.utils.checkpoint), plus, from rank 0, the HF
        config and tokenizer that ``verl export`` turns it into a model directory with (and, with LoRA, the
        fingerprint of the base model's files)."""
        if self.rank == 0 and self.base_fingerprint is not None:
            write_fingerprint(path, self.base_fingerprint)
        self._save_thread = save_role_checkpoint(
            self.actor,
            self.config.actor_rollout_ref.actor.checkpoint,
            self.tokenizer,
            self.rank,
            path,
            background,
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Restore a checkpoint part; with LoRA, refused when ``model.path`` is not the base it was trained on."""
        if self.base_fingerprint is not None:
            key = "actor_rollout_ref.model.path"
            check_same_base(path, self.base_fingerprint, key, self.config.actor_rollout_ref.model.path)
        self.actor.load_checkpoint(
            path, self.rank, load_contents(self.config.actor_rollout_ref.actor.checkpoint)
        )
        self.host.version += 1

    def get_state(self) -> dict[str, Any] | None:
        """Weights, optimizer and LR schedule: what a restarted worker needs to carry on training (each
        rank's own shards with fsdp2; with dp every rank holds rank 0's, so the others answer None)."""
        return self.actor.training_state() if self.actor.sharded or self.rank == 0 else None

    def set_state(self, state: dict[str, Any]) -> None:
        self.actor.load_training_state(state)
        self.host.version += 1
