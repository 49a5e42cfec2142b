"""The rollout as a role of its own, for asynchronous training (``trainer.v1.trainer_mode=separate_async``).

In the synchronous trainer the actor's module samples (verl's hybrid engine). Here a separate worker holds a
copy of the policy and samples the next batches while the actor trains; after each update the actor's weights
are copied in (:meth:`RolloutWorker.set_weights`), tagged with the policy version (the number of RL steps
trained). Every sample carries the version that generated it, as verl's ``min_global_steps`` /
``max_global_steps``.

Fully asynchronous training (``async_training.staleness_threshold`` > 0) streams instead: prompts are
``submit``-ted to a pool, each ``collect`` hands over the first groups to finish, and the unfinished
generations continue, across weight updates (partial rollouts), in the next one
(`verl.workers.rollout.streaming`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from verl.models import eos_token_ids, tokenizer_for
from verl.protocol import DataProto
from verl.single_controller.base import Dispatch, Worker, register
from verl.utils.precision import model_dtype, role_compute_dtype, rollout_compute_dtype
from verl.workers.engine.packed_weights import unpack_weights
from verl.workers.engine.trained import with_tied_names
from verl.workers.roles import (
    load_policy_model,
    sampling_params,
    setup_process,
    trainer_config,
)
from verl.workers.rollout import get_rollout_class
from verl.workers.rollout.base import with_prompt_fields
from verl.workers.rollout.streaming import StreamingPool, StreamingRollout

VERSION_KEYS = ("min_global_steps", "max_global_steps")
"""verl's per-sample fields: the policy versions the sample's first and last tokens were drawn with"""


class RolloutWorker(StreamingRollout, Worker):
    """A copy of the policy and its rollout engine; ``weights_version`` is the version it holds."""

    def __init__(self, config: Any) -> None:
        config = trainer_config(config)
        self.config = config
        self.device = setup_process(config, self.rank)
        arr = config.actor_rollout_ref
        model_cfg = arr.model
        self.tokenizer = tokenizer_for(model_cfg)
        self.model = load_policy_model(model_cfg, self.device).eval().requires_grad_(False)
        rollout_cls = get_rollout_class(arr.rollout.name)
        self.rollout = rollout_cls(
            self.model,
            eos_token_ids(self.tokenizer, self.model),
            self.tokenizer.pad_token_id,
            arr.rollout.micro_batch_size,
        )
        # The actor's compute dtype, chosen as the actor chooses it, so both sample and score alike.
        compute = role_compute_dtype(
            arr.actor.fsdp_config,
            device=self.device,
            weights_dtype=model_dtype(self.model),
            sharded=False,
            key="actor_rollout_ref.actor.fsdp_config",
        )
        self.rollout.compute_dtype = rollout_compute_dtype(arr.rollout.dtype, compute, self.model)
        self.weights_version = 0
        self.pool = StreamingPool.for_sampling(
            sampling_params(config, validate=False), self.rollout.eos_token_ids, self.tokenizer.pad_token_id,
            int(config.trainer.seed), self.device,
        )  # fmt: skip

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Sample responses with the weights held now; every row is tagged with their version."""
        start = time.perf_counter()
        idle = 0.0 if self._idle_from is None else start - self._idle_from
        sampling = sampling_params(self.config, validate=False)
        with torch.no_grad():
            output = self.rollout.generate_sequences(prompts.to(self.device), sampling).to("cpu")
        output = with_prompt_fields(output, prompts)
        for key in VERSION_KEYS:
            output.non_tensor_batch[key] = np.full(len(output), self.weights_version, dtype=np.int64)
        output.meta_info["rollout_idle_s"] = idle
        self._idle_from = time.perf_counter()
        return output

    # ------------------------------------------------------------------ streaming (fully async)

    def _pool_decode(
        self, batch: DataProto, enough: Any, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        sampling = sampling_params(self.config, validate=False)
        return self.rollout.decode_until(batch.to(self.device), sampling, enough, generator)

    def _pool_version(self, train_step: int) -> int:
        return self.weights_version  # the weights copied in last

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_weights(self, weights: dict[str, Any] | list[Any], version: int) -> None:
        """Copy the actor's weights in (every parameter and buffer must be there) and take their version.
        ``weights``: a state dict or `pack_weights`' form, or the actor group's answer, one per rank (rank 0's
        holds them)."""
        if isinstance(weights, list):
            weights = next(w for w in weights if w is not None)
        if "buffers" in weights:
            weights = unpack_weights(weights)
        # a gathered state dict may name a tied weight (the LM head) once
        missing, unexpected = self.model.load_state_dict(with_tied_names(self.model, weights), strict=False)
        if missing or unexpected:
            raise RuntimeError(
                f"the actor's weights do not fit the rollout's model: missing {missing[:5]}, unexpected "
                f"{unexpected[:5]}"
            )
        self.weights_version = int(version)

    def get_state(self) -> dict[str, Any]:
        return {"weights": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
                "version": self.weights_version}  # fmt: skip

    def set_state(self, state: dict[str, Any]) -> None:
        self.set_weights(state["weights"], state["version"])
