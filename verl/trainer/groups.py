"""Groups: the ``n`` responses to one prompt, sharing a ``uid``. The one place groups are formed.

Every batch source (generate now, generated ahead, the streaming pool) and the validation pass hand the
rollout prompts made into groups here, so a group estimator (GRPO, RLOO, ...) and DAPO's filter see the
same ``uid`` layout in every mode: a group's rows are consecutive (interleaved repeat).
"""

from __future__ import annotations

import numpy as np

from verl.protocol import DataProto


def with_group_ids(prompts: DataProto, tag: str) -> DataProto:
    """A copy of ``prompts`` with a ``uid`` per prompt, ``<tag>-<row>``: the group of its responses."""
    prompts = prompts.select()
    prompts.non_tensor_batch["uid"] = np.array([f"{tag}-{i}" for i in range(len(prompts))], dtype=object)
    return prompts


def groups_of(prompts: DataProto, n: int, tag: str) -> DataProto:
    """Each prompt with its group's ``uid`` (``<tag>-<row>``), repeated ``n`` times consecutively."""
    return with_group_ids(prompts, tag).repeat(n, interleave=True)


def repeat_with_baselines(prompts: DataProto, scores: DataProto, n: int) -> DataProto:
    """ReMax: each prompt (already given its ``uid``) ``n`` times, consecutively, with its greedy response's
    reward as ``reward_baselines``."""
    baselines = scores.batch["token_level_scores"].sum(-1).repeat_interleave(n)
    groups = prompts.repeat(n, interleave=True)
    groups.batch["reward_baselines"] = baselines
    return groups
