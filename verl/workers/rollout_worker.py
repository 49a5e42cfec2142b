"""The rollout as a role of its own, for asynchronous training (``trainer.v1.trainer_mode=separate_async``).

In the synchronous trainer the actor's module samples (verl's hybrid engine). Here a separate worker holds a
copy of the policy and samples the next batches while the actor trains; after each update the actor's weights
are copied in (:meth:`RolloutWorker.set_weights`: in buckets of ``rollout.checkpoint_engine.
update_weights_bucket_megabytes``, `verl.workers.rollout.weight_sync`; with LoRA checked by the LoRA guard),
tagged with the policy version (the number of RL steps trained). Every sample carries the version that generated it, as verl's ``min_global_steps`` /
``max_global_steps``.

The generating itself is the same component as the actor's (:class:`verl.workers.rollout.host.RolloutHost`):
any engine (an engine with weights of its own, such as vLLM, takes each new version at its next generation),
the server and agent loops, and the streaming pool of fully asynchronous training
(``async_training.staleness_threshold`` > 0), whose unfinished generations continue across weight updates.
"""

from __future__ import annotations

import time
from typing import Any

from verl.models import tokenizer_for
from verl.models.lora import apply_lora
from verl.protocol import DataProto
from verl.single_controller.base import Dispatch, Worker, register
from verl.utils.precision import model_dtype, role_compute_dtype
from verl.workers.engine.packed_weights import unpack_weights
from verl.workers.rollout.host import HostCalls, RolloutHost
from verl.workers.rollout.lora_guard import check_model_adapters
from verl.workers.rollout.weight_sync import receive_buckets
from verl.workers.worker_setup import load_policy_model, on_device, setup_process, trainer_config


class RolloutWorker(HostCalls, Worker):
    """A copy of the policy and the generation component over it; ``host.version`` is the version it holds."""

    def __init__(self, config: Any) -> None:
        config = trainer_config(config)
        self.config = config
        self.device = setup_process(config, self.rank)
        arr = config.actor_rollout_ref
        self.tokenizer = tokenizer_for(arr.model)
        # With LoRA the same adapters as the actor's (new, or lora_adapter_path's), so the actor's weights,
        # adapters included, fit it name for name.
        self.model = apply_lora(load_policy_model(arr.model, self.device), arr.model)
        self.model.eval().requires_grad_(False)
        # The actor's compute dtype, chosen as the actor chooses it, so both sample and score alike.
        compute = role_compute_dtype(
            arr.actor.fsdp_config,
            device=self.device,
            weights_dtype=model_dtype(self.model),
            sharded=False,
            key="actor_rollout_ref.actor.fsdp_config",
        )
        self.host = RolloutHost(config, self.model, self.tokenizer, self.device, self.rank, compute)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @on_device
    def generate_sequences(self, prompts: DataProto, validate: bool = False) -> DataProto:
        """Sample responses with the weights held now; every row is tagged with their version (training
        batches; ``validate``: with ``rollout.val_kwargs``, untagged)."""
        return self.host.generate(prompts, validate, tag_version=not validate)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_weights(self, weights: dict[str, Any] | list[Any], version: int) -> None:
        """Copy the actor's weights in and take their version: every parameter and buffer, or (``complete``
        False in `get_weights`' answer) the LoRA adapters alone over the base held already. ``weights``: the
        actor's bucketed answer (``buckets``, copied in one bucket at a time), `pack_weights`' form or a state
        dict, or the actor group's answer, one per rank (rank 0's holds them). With LoRA the adapters held after
        the copy must be the ones sent (the LoRA guard, `check_model_adapters`)."""
        if isinstance(weights, list):
            weights = next(w for w in weights if w is not None)
        start = time.perf_counter()
        complete = bool(weights.get("complete", True))
        if "buckets" in weights:
            parts: Any = receive_buckets(weights["buckets"])
        elif "buffers" in weights:
            parts = [unpack_weights(weights)]
        else:
            parts = [weights]
        counts = self.host.load_buckets(parts, version, complete=complete)
        check_model_adapters(self.model, weights.get("adapters_digest"), version)
        self.host.count_sync(time.perf_counter() - start, counts[1], counts[0])

    def get_state(self) -> dict[str, Any]:
        return {"weights": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
                "version": self.host.version}  # fmt: skip

    def set_state(self, state: dict[str, Any]) -> None:
        self.set_weights(state["weights"], state["version"])
