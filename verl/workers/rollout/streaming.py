"""The streaming rollout of fully asynchronous training (``async_training.staleness_threshold`` > 0).

The rollout holds a pool of generations: groups of prompts handed to it, each row's tokens so far, and
groups finished but not yet trained. :meth:`StreamingPool.collect` decodes every unfinished row together
until ``num_groups`` groups are complete and hands over the stalest complete ones; the rows still running
stay in the pool. A batch therefore never waits for the slowest responses of its prompts: they are
finished later, and trained in a later step (AReaL's and verl's fully-async trainer's streaming).

A generation that is interrupted this way and continued after the rollout has taken new weights is a
*partial rollout*: its first tokens were drawn by one policy version and its last by another. Each token's
version is recorded (``token_versions``; ``min_global_steps`` / ``max_global_steps`` per sample, verl's
fields), and each token's log-prob is the one of the weights that drew it, so rollout correction sees the
true behaviour policy. A continued row is prefilled again (prompt + its tokens so far) under the new
weights: the KV cache of the old weights is not reused.

With ``partial_rollout=False`` (verl's mode without it) :meth:`StreamingPool.finish_started` completes
every started generation under the weights it started with, before the rollout takes new ones.

Every decode call draws from its own seeded generator (``seed`` and the call's index), so a run is the same
in-process and on Ray, and a checkpoint of the pool (:meth:`state_dict`) resumes it exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto
from verl.workers.rollout.base import (
    ROW_BUDGET_KEY,
    SamplingParams,
    assemble_rollout_output,
    concat_prompts,
    left_padded_batch,
    with_prompt_fields,
)

Decode = Callable[
    [DataProto, Callable[[torch.Tensor], bool], torch.Generator], tuple[torch.Tensor, torch.Tensor, int]
]
"""``decode(batch, enough, generator) -> (responses, log_probs, steps)``: FastRollout.decode_until with the
sampling settings bound"""


@dataclass
class _Row:
    """One response being generated: its prompt's ids (no padding) and what has been drawn so far."""

    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    """the policy version that drew each token"""
    done: bool = False
    budget: int | None = None
    """at most this many tokens (None: the pool's ``max_new_tokens``; an agent loop's turn asks for fewer)"""


class StalenessOrder:
    """What both pools (this one and the agent loops' :class:`~verl.workers.rollout.agent_pool.AgentPool`)
    order and bound by: a group's age is the oldest policy version that drew one of its tokens
    (:meth:`first_version`). A pool says which groups are complete (``_group_complete``)."""

    rows: dict[str, list[Any]]

    def _group_complete(self, uid: str) -> bool:
        raise NotImplementedError

    def first_version(self, uid: str) -> float:
        """The oldest policy version that drew a token of this group (inf: none drawn yet)."""
        raise NotImplementedError

    def complete(self) -> list[str]:
        """The complete groups, stalest first (then the order they were submitted in): a collect hands these
        over first."""
        return sorted((uid for uid in self.rows if self._group_complete(uid)), key=self.first_version)

    def stale(self, oldest_allowed: int, finished: bool = False) -> list[str]:
        """The unfinished groups (``finished``: the complete ones, stalest first) with a token drawn by weights
        older than version ``oldest_allowed``."""
        complete = self.complete()
        done = set(complete)
        groups = complete if finished else [uid for uid in self.rows if uid not in done]
        return [uid for uid in groups if self.first_version(uid) < oldest_allowed]

    def past_bound(self, oldest_allowed: int) -> list[str]:
        """Every group, finished or not, with a token drawn by weights older than version ``oldest_allowed``:
        what ``restart_stale`` starts again."""
        return [uid for uid in self.rows if self.first_version(uid) < oldest_allowed]


class StreamingPool(StalenessOrder):
    """Generations in flight on the rollout, by group (a prompt's ``n`` rows), oldest first."""

    def __init__(
        self,
        max_new_tokens: int,
        stop_ids: list[int],
        pad_token_id: int,
        seed: int,
        device: torch.device | str = "cpu",
    ) -> None:
        self.max_new_tokens = max_new_tokens
        self.stop_ids = set(stop_ids)
        self.pad_token_id = pad_token_id
        self.seed = seed
        self.device = torch.device(device)
        """where the decoder draws (its generator lives there)"""
        self.prompts: dict[str, DataProto] = {}
        """each group's rows as submitted (left-padded prompts and their per-sample fields)"""
        self.rows: dict[str, list[_Row]] = {}
        self.decode_calls = 0
        self.restarted = 0
        """generations dropped because they grew too stale (see :meth:`restart_stale`)"""

    @classmethod
    def for_sampling(
        cls, sampling: SamplingParams, eos_token_ids: list[int], pad_token_id: int, seed: int, device: Any
    ) -> StreamingPool:
        """A worker's pool for its rollout settings: responses of ``sampling.max_new_tokens``, its stop tokens."""
        return cls(sampling.max_new_tokens, sampling.stop_tokens(eos_token_ids), pad_token_id, seed, device)

    def __len__(self) -> int:
        return len(self.rows)

    def submit(self, groups: DataProto) -> None:
        """Add prompts, already repeated ``n`` times with their group's ``uid``; none is generated yet."""
        uids = np.asarray(groups.non_tensor_batch["uid"])
        mask = groups.batch["attention_mask"].bool()
        for uid in dict.fromkeys(uids.tolist()):
            if uid in self.rows:
                raise ValueError(f"group {uid!r} is already in the rollout's pool")
            idx = np.flatnonzero(uids == uid)
            self.prompts[uid] = groups.select_idxs(idx)
            self.rows[uid] = [_Row(groups.batch["input_ids"][i][mask[i]].tolist()) for i in idx]

    def _group_complete(self, uid: str) -> bool:
        return all(r.done for r in self.rows[uid])

    def first_version(self, uid: str) -> float:
        return min((r.versions[0] for r in self.rows[uid] if r.versions), default=float("inf"))

    def running(self) -> list[tuple[str, int]]:
        """(group, row) of every unfinished row, oldest first."""
        return [(uid, i) for uid, rows in self.rows.items() for i, r in enumerate(rows) if not r.done]

    # ------------------------------------------------------------------ generation

    def collect(self, num_groups: int, decode: Decode, version: int) -> DataProto:
        """Decode until ``num_groups`` groups are complete, then remove and return the stalest complete ones
        (fewer only when the pool holds fewer groups)."""
        num_groups = min(num_groups, len(self.rows))
        while len(self.complete()) < num_groups:
            self._decode(decode, version, need=num_groups)
        return self._take(self.complete()[:num_groups])

    def finish_started(self, decode: Decode, version: int) -> None:
        """Complete every generation that has drawn a token, with the weights held now."""
        while any(self.rows[uid][i].tokens for uid, i in self.running()):
            started = {uid for uid, i in self.running() if self.rows[uid][i].tokens}
            self._decode(decode, version, need=None, only=started)

    def restart_stale(self, oldest_allowed: int) -> int:
        """Drop what groups drew with weights older than ``oldest_allowed``, finished or not (they start again,
        under the current weights): verl's ``max_off_policy_strategy=drop``, which evicts the whole group.
        Returns how many groups started again."""
        stale = self.past_bound(oldest_allowed)
        for uid in stale:
            self.rows[uid] = [_Row(r.prompt_ids) for r in self.rows[uid]]
        self.restarted += len(stale)
        return len(stale)

    def finish_stale(self, oldest_allowed: int, decode: Decode, version: int) -> int:
        """verl's ``max_off_policy_strategy=wait``: complete the unfinished groups that drew a token with
        weights older than ``oldest_allowed``, with the weights held now, so that they are trained (the oldest
        complete groups are handed over first) rather than started again. Returns how many."""
        stale = set(self.stale(oldest_allowed))
        while any(uid in stale for uid, _ in self.running()):
            self._decode(decode, version, need=None, only=stale)
        return len(stale)

    def _decode(self, decode: Decode, version: int, need: int | None, only: set[str] | None = None) -> None:
        """One decode call over the unfinished rows (of the groups in ``only``), prompt + tokens so far,
        until ``need`` groups are complete (None: until every row in the call finishes)."""
        slots = [(uid, i) for uid, i in self.running() if only is None or uid in only]
        enough = enough_when(len(self.complete()), [uid for uid, _ in slots], need)
        self.draw([self.rows[uid][i] for uid, i in slots], decode, enough, version)

    def draw(
        self, rows: list[_Row], decode: Decode, enough: Callable[[torch.Tensor], bool], version: int
    ) -> None:
        """One decode call continuing ``rows`` (each its prompt and tokens so far, up to its budget) until
        ``enough``; each row's new tokens, their log-probs and ``version`` appended, ``done`` set at a stop
        token or the budget."""
        batch = left_padded_batch([r.prompt_ids + r.tokens for r in rows], self.pad_token_id)
        budgets = [(self.max_new_tokens if r.budget is None else r.budget) - len(r.tokens) for r in rows]
        batch.batch[ROW_BUDGET_KEY] = torch.tensor(budgets)
        # A generator of its own, not torch's default one: in-process, the actor's thread draws from that.
        generator = torch.Generator(self.device).manual_seed(self.seed * 1_000_003 + self.decode_calls)
        self.decode_calls += 1
        responses, log_probs, steps = decode(batch, enough, generator)
        responses, log_probs = responses.cpu(), log_probs.float().cpu()
        for k, (row, budget) in enumerate(zip(rows, budgets, strict=True)):
            drawn = responses[k, : min(steps, budget)].tolist()
            for j, token in enumerate(drawn):
                if token in self.stop_ids:
                    drawn = drawn[: j + 1]
                    break
            row.tokens += drawn
            row.log_probs += log_probs[k, : len(drawn)].tolist()
            row.versions += [version] * len(drawn)
            row.done = (bool(drawn) and drawn[-1] in self.stop_ids) or len(drawn) >= budget

    def _take(self, uids: list[str]) -> DataProto:
        """Remove these groups and return them as a rollout batch (the prompts' rows, in this order)."""
        prompts = concat_prompts(
            [self.prompts.pop(uid) for uid in uids]
        )  # (from batches of different widths)
        rows = [row for uid in uids for row in self.rows.pop(uid)]
        width = self.max_new_tokens
        responses = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        log_probs = torch.zeros(len(rows), width)
        versions = torch.full((len(rows), width), -1, dtype=torch.long)
        for k, row in enumerate(rows):
            n = len(row.tokens)
            responses[k, :n] = torch.tensor(row.tokens, dtype=torch.long)
            log_probs[k, :n] = torch.tensor(row.log_probs)
            versions[k, :n] = torch.tensor(row.versions, dtype=torch.long)
        lengths = torch.tensor([len(r.tokens) for r in rows])
        output = assemble_rollout_output(
            prompts, responses, sorted(self.stop_ids), self.pad_token_id, width, lengths
        )
        mask = output.batch["response_mask"]
        output.batch["rollout_log_probs"] = log_probs * mask
        output.batch["token_versions"] = versions  # (-1 after each response, as the mask ends it)
        first = np.array([r.versions[0] if r.versions else -1 for r in rows], dtype=np.int64)
        last = np.array([r.versions[-1] if r.versions else -1 for r in rows], dtype=np.int64)
        output.non_tensor_batch["min_global_steps"] = first
        output.non_tensor_batch["max_global_steps"] = last
        return with_prompt_fields(output, prompts)

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        return {
            "prompts": dict(self.prompts),
            # copies of the token lists: the pool goes on appending to its own
            "rows": {uid: [asdict(r) for r in rows] for uid, rows in self.rows.items()},
            "decode_calls": self.decode_calls,
            "restarted": self.restarted,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.prompts = dict(state["prompts"])
        self.rows = {uid: [_Row(**r) for r in rows] for uid, rows in state["rows"].items()}
        self.decode_calls = int(state["decode_calls"])
        self.restarted = int(state["restarted"])


def enough_when(
    complete_before: int, groups_of_rows: list[str], need: int | None
) -> Callable[[torch.Tensor], bool]:
    """A decode call's stop rule: true once ``need`` groups are complete, counting the ``complete_before`` the
    call and those whose every row in the call (``groups_of_rows``: each row's group) has finished in it
    (None: never, every row of the call runs to its end)."""
    if need is None:
        return lambda done: False
    groups = list(dict.fromkeys(groups_of_rows))
    group_of = torch.tensor([groups.index(uid) for uid in groups_of_rows])
    sizes = torch.bincount(group_of, minlength=len(groups))

    def enough(done: torch.Tensor) -> bool:
        finished = torch.bincount(group_of, weights=done.cpu().float(), minlength=len(groups))
        return complete_before + int((finished == sizes).sum()) >= need

    return enough
