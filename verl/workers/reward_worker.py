"""The reward role worker: :class:`RewardWorker`, the reward manager, reward model and weighted reward terms
(`verl.workers.reward`). Re-exported by `verl.workers.roles`, beside the other role workers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from verl.models import tokenizer_for
from verl.protocol import DataProto
from verl.single_controller import Dispatch, Worker, register
from verl.workers.worker_setup import setup_process, trainer_config


class RewardWorker(Worker):
    """Rewards: the reward manager named by ``reward_model.reward_manager``, the reward model
    (``reward_model.enable``, on this worker's device) and the weighted terms of ``reward_model.reward_fns``
    (see verl.workers.reward.combine).

    ``compute_score(data, validate=True)`` uses the validation manager (no printed examples). Custom managers can be passed in (they must pickle for Ray), or
    just a ``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` function for the
    configured manager to call.

    ``reward_router_address``: where a generative reward model is served (``host:port``, see
    verl.workers.reward.genrm); the custom function is called with it and the reward model's tokenizer.
    """

    def __init__(
        self,
        config: Any,
        reward_fn: Any = None,
        val_reward_fn: Any = None,
        compute_score: Any = None,
        reward_router_address: str | None = None,
    ) -> None:
        from verl.workers.reward.factory import build_reward_fns
        from verl.workers.reward.genrm import client_kwargs

        config = trainer_config(config)
        device = setup_process(config, self.rank)
        tokenizer = tokenizer_for(config.actor_rollout_ref.model)
        self.reward_fn, self.val_reward_fn = build_reward_fns(
            config,
            tokenizer,
            device,
            reward_fn,
            val_reward_fn,
            compute_score,
            client_kwargs(config, reward_router_address),
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_score(self, data: DataProto, validate: bool = False) -> DataProto:
        """``token_level_scores`` (the score at each response's last token) and any extra per-sample fields;
        ``validate`` scores with the validation manager."""
        reward_fn = self.val_reward_fn if validate else self.reward_fn
        reward = reward_fn(data, return_dict=True)
        extra = {key: np.array(values, dtype=object) for key, values in reward["reward_extra_info"].items()}
        return DataProto.from_dict(
            tensors={"token_level_scores": reward["reward_tensor"]},
            non_tensors=extra,
            meta_info={"reward_extra_keys": sorted(extra)},  # which columns are reward fields (metrics)
        )
