"""The streaming pool with agent loops: multi-turn trajectories (tool calls) generated across weight updates.

The plain pool (:mod:`verl.workers.rollout.streaming`) continues each unfinished response token by token
after the rollout takes new weights. Here each sample is an agent loop (:mod:`verl.agent_loop`), a coroutine
that asks for one turn at a time and inserts tool results between turns. The pool runs every sample's loop
on an event loop of its own, and answers their turn requests (``generate``) with its decode calls:

    settle: run the loops until each has returned or waits for a turn
    decode: one call over every waiting turn (its request + tokens so far) until enough groups *could* be
            complete (every row of a group has ended its turn); then settle again, and so on

A turn cut short by the end of a collect stays in the pool, its tokens so far kept; the next collect, maybe
under new weights, continues it (prefilled again). So a trajectory's turns, and even one turn's tokens, can
come from different policy versions, each token's recorded (``token_versions``, ``min_global_steps`` /
``max_global_steps``, verl's fields) with the log-prob of the weights that drew it.

**Checkpoints** hold every turn request and the tokens drawn for it, not the coroutines (which cannot be
saved). After a resume each loop runs again from its prompt and its turn requests are answered from the
record (replay) until it reaches the turn in flight, which decoding continues. The tools run again during
replay: a deterministic tool gives the same text, and the run continues exactly as the uninterrupted one. If a
request differs from the record (a tool whose answer changed), the record from there on is dropped, with a
warning, and that turn is generated afresh.

Every turn is sampled with the rollout's settings; a loop may ask for fewer tokens (``max_new_tokens``) and
nothing else (a different temperature, say, is refused with the loop's name).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import logging
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from verl.agent_loop.base import AgentLoopOutput
from verl.agent_loop.runner import AgentLoopRunner
from verl.protocol import DataProto
from verl.workers.rollout.base import (
    SamplingParams,
    TokenRequest,
    TokenResponse,
    concat_prompts,
    with_prompt_fields,
)
from verl.workers.rollout.streaming import Decode, StalenessOrder, StreamingPool, _Row, enough_when

logger = logging.getLogger(__name__)

RunnerFactory = Callable[[Callable[[TokenRequest], Coroutine[Any, Any, TokenResponse]]], AgentLoopRunner]
"""``factory(submit) -> AgentLoopRunner`` whose loops send their turn requests to ``submit``"""

_SAMPLE: contextvars.ContextVar[tuple[str, int]] = contextvars.ContextVar("agent_pool_sample")
"""the (group, row) whose loop is running: each loop's task carries its own"""


@dataclass
class _Trajectory:
    """One sample's record: its turn requests (each a row: the request's ids as its prompt, the tokens drawn
    for it) and, once its loop has returned, the loop's output."""

    turns: list[_Row] = field(default_factory=list)
    output: dict[str, Any] | None = None

    @property
    def started(self) -> bool:
        return any(turn.tokens for turn in self.turns)


@dataclass
class _Running:
    """What a sample's loop holds while it runs (not checkpointed: it is rebuilt by replay)."""

    task: asyncio.Task
    answered: int = 0
    """turn requests made so far"""
    waiting: asyncio.Future | None = None
    """set while the loop waits for the turn ``turns[answered - 1]``"""


class AgentPool(StalenessOrder):
    """Agent-loop trajectories in flight on the rollout, by group, oldest first: the interface of
    :class:`~verl.workers.rollout.streaming.StreamingPool` (submit, collect, finish_started, restart_stale,
    finish_stale, state_dict), whose decode step it uses for the turns."""

    def __init__(
        self,
        runner_factory: RunnerFactory,
        sampling: SamplingParams,
        stop_ids: list[int],
        pad_token_id: int,
        seed: int,
        device: torch.device | str = "cpu",
    ) -> None:
        self.sampling = sampling
        self.decoder = StreamingPool(sampling.max_new_tokens, stop_ids, pad_token_id, seed, device)
        """draws the turns' tokens (its decode counter and generator are the pool's)"""
        self._runner_factory = runner_factory
        self._runner: AgentLoopRunner | None = None
        self.prompts: dict[str, DataProto] = {}
        self.rows: dict[str, list[_Trajectory]] = {}
        self.restarted = 0
        self._running: dict[tuple[str, int], _Running] = {}
        self._loop = asyncio.new_event_loop()
        # The loops' event loop runs in a thread of its own: the caller may already run one (an async actor).
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agent-pool")
        self._blocked: asyncio.Event | None = None

    @property
    def runner(self) -> AgentLoopRunner:
        """The agent loops (tools loaded), made at the first collect."""
        if self._runner is None:
            self._runner = self._runner_factory(self._turn)
        return self._runner

    def __len__(self) -> int:
        return len(self.rows)

    def submit(self, groups: DataProto) -> None:
        """Add prompts, already repeated ``n`` times with their group's ``uid``; their loops start at the next
        collect."""
        uids = np.asarray(groups.non_tensor_batch["uid"])
        for uid in dict.fromkeys(uids.tolist()):
            if uid in self.rows:
                raise ValueError(f"group {uid!r} is already in the rollout's pool")
            idx = np.flatnonzero(uids == uid)
            self.prompts[uid] = groups.select_idxs(idx)
            self.rows[uid] = [_Trajectory() for _ in idx]

    def _group_complete(self, uid: str) -> bool:
        return all(r.output is not None for r in self.rows[uid])  # every loop has returned

    def first_version(self, uid: str) -> float:
        firsts = [turn.versions[0] for r in self.rows[uid] for turn in r.turns if turn.versions]
        return min(firsts, default=float("inf"))

    # ------------------------------------------------------------------ generation

    def collect(self, num_groups: int, decode: Decode, version: int) -> DataProto:
        """Run the loops and decode their turns until ``num_groups`` groups are complete; remove and return the
        stalest complete ones (fewer only when the pool holds fewer groups)."""
        num_groups = min(num_groups, len(self.rows))
        self._settle()
        while len(self.complete()) < num_groups:
            self._decode(decode, version, need=num_groups)
            self._settle()
        return self._take(self.complete()[:num_groups])

    def finish_started(self, decode: Decode, version: int) -> None:
        """Complete every trajectory that has drawn a token, with the weights held now."""
        self._settle()
        while started := {uid for uid, i in self._waiting() if self.rows[uid][i].started}:
            self._decode(decode, version, need=None, only=started)
            self._settle()

    def finish_stale(self, oldest_allowed: int, decode: Decode, version: int) -> int:
        """verl's ``max_off_policy_strategy=wait``: run the loops of the unfinished groups with a token drawn by
        weights older than ``oldest_allowed`` to their end, their turns decoded with the weights held now, so
        that they are trained rather than started again. Returns how many."""
        stale = set(self.stale(oldest_allowed))
        self._settle()
        while waiting := {uid for uid, _ in self._waiting() if uid in stale}:
            self._decode(decode, version, need=None, only=waiting)
            self._settle()
        return len(stale)

    def restart_stale(self, oldest_allowed: int) -> int:
        """Start again (under the current weights) the groups, finished or not, with a token drawn by weights
        older than ``oldest_allowed``; the loops still running are cancelled (their tools released). Returns how
        many."""
        stale = self.past_bound(oldest_allowed)
        for uid in stale:
            self._cancel([key for key in self._running if key[0] == uid])
            self.rows[uid] = [_Trajectory() for _ in self.rows[uid]]
        self.restarted += len(stale)
        return len(stale)

    def _waiting(self) -> list[tuple[str, int]]:
        """(group, row) of every loop waiting for a turn that is not finished, oldest group first."""
        return [
            (uid, i)
            for uid, rows in self.rows.items()
            for i, r in enumerate(rows)
            if r.output is None and (uid, i) in self._running and not r.turns[-1].done
        ]

    def _decode(self, decode: Decode, version: int, need: int | None, only: set[str] | None = None) -> None:
        """One decode call over the waiting turns (of the groups in ``only``), until ``need`` groups could be
        complete (each of their rows has ended its turn; a turn that calls a tool leaves its group
        incomplete, and decoding goes on after the next settle). None: every turn of the call runs to its end."""
        slots = [(uid, i) for uid, i in self._waiting() if only is None or uid in only]
        enough = enough_when(len(self.complete()), [uid for uid, _ in slots], need)
        self.decoder.draw([self.rows[uid][i].turns[-1] for uid, i in slots], decode, enough, version)

    def _take(self, uids: list[str]) -> DataProto:
        """Remove these groups and return them as a rollout batch (the prompts' rows, in this order)."""
        prompts = concat_prompts(
            [self.prompts.pop(uid) for uid in uids]
        )  # (from batches of different widths)
        rows = [row for uid in uids for row in self.rows.pop(uid)]
        outputs = [AgentLoopOutput(**row.output) for row in rows]
        width = self.sampling.max_new_tokens
        output = self.runner.assemble(prompts, outputs, width)
        versions = torch.full((len(rows), width), -1, dtype=torch.long)
        first, last = np.full(len(rows), -1, dtype=np.int64), np.full(len(rows), -1, dtype=np.int64)
        for k, (row, out) in enumerate(zip(rows, outputs, strict=True)):
            drawn = [v for turn in row.turns for v in turn.versions]
            sampled = [j for j, m in enumerate(out.response_mask) if m]
            if drawn:
                first[k], last[k] = min(drawn), max(drawn)
                # a loop that kept every sampled token in order (the tool loop does): each its own version;
                # one that edited its turns: the newest version on all of them
                per_token = drawn if len(drawn) == len(sampled) else [last[k]] * len(sampled)
                versions[k, sampled] = torch.tensor(per_token, dtype=torch.long)
        output.batch["token_versions"] = versions  # (-1 on inserted tokens and after the response)
        output.non_tensor_batch["min_global_steps"] = first
        output.non_tensor_batch["max_global_steps"] = last
        return with_prompt_fields(output, prompts)

    # ------------------------------------------------------------------ the loops

    def _settle(self) -> None:
        """Start the loops not running yet, answer the turns finished since the last settle, and run the loops
        until each has returned or waits for an unfinished turn."""
        self._call(self._settle_loops)
        for key, running in list(self._running.items()):
            if running.task.done():
                del self._running[key]
                uid, i = key
                error = running.task.exception()
                if error is not None:
                    raise RuntimeError(
                        f"the agent loop of group {uid!r} row {i} raised {type(error).__name__}: {error}"
                    ) from error
                self.rows[uid][i].output = asdict(running.task.result())

    def _start(self, uid: str, i: int) -> None:
        """Start sample (uid, i)'s loop as a task of the event loop (called on it), knowing its sample."""
        name, prompt_ids, fields = self.runner.samples(self.prompts[uid].select_idxs([i]))[0]
        coroutine = self.runner.loop(name).run(self.sampling, prompt_ids, **fields)
        context = contextvars.copy_context()
        context.run(_SAMPLE.set, (uid, i))
        task = context.run(asyncio.create_task, coroutine)
        # When the process ends, loops still waiting for a turn just end with it: asyncio need not warn.
        task._log_destroy_pending = False
        self._running[(uid, i)] = _Running(task)

    async def _settle_loops(self) -> None:
        self._blocked = self._blocked or asyncio.Event()
        for uid, rows in self.rows.items():
            for i, row in enumerate(rows):
                if row.output is None and (uid, i) not in self._running:
                    self._start(uid, i)
        for (uid, i), running in self._running.items():
            if running.waiting is not None and self.rows[uid][i].turns[-1].done:
                running.waiting.set_result(None)
                running.waiting = None
        while busy := [r.task for r in self._running.values() if r.waiting is None and not r.task.done()]:
            self._blocked.clear()
            blocked = asyncio.ensure_future(self._blocked.wait())
            await asyncio.wait([*busy, blocked], return_when=asyncio.FIRST_COMPLETED)
            blocked.cancel()

    async def _turn(self, request: TokenRequest) -> TokenResponse:
        """A loop's turn request: answered from the record (replay after a resume) or by the decode calls."""
        uid, i = _SAMPLE.get()
        running, row = self._running[(uid, i)], self.rows[uid][i]
        if (
            dataclasses.replace(request.sampling, max_new_tokens=self.sampling.max_new_tokens)
            != self.sampling
        ):
            name = self.runner.samples(self.prompts[uid].select_idxs([i]))[0][0]
            raise ValueError(
                f"agent loop {name!r} asked for a turn sampled with {request.sampling}; in the streaming pool every "
                f"turn samples with the rollout's settings ({self.sampling}), only max_new_tokens may be lower"
            )
        k = running.answered
        running.answered += 1
        if k < len(row.turns) and row.turns[k].prompt_ids != list(request.prompt_ids):
            logger.warning(
                "group %r row %d: turn %d's request differs from the checkpoint's (a tool answered differently "
                "after the resume); generating it and what follows again",
                uid,
                i,
                k,
            )
            del row.turns[k:]
        if k == len(row.turns):
            budget = request.sampling.max_new_tokens
            row.turns.append(_Row(list(request.prompt_ids), budget=budget, done=budget <= 0))
        turn = row.turns[k]
        if not turn.done:
            running.waiting = self._loop.create_future()
            self._blocked.set()
            await running.waiting
        stopped = bool(turn.tokens) and turn.tokens[-1] in self.decoder.stop_ids
        return TokenResponse(
            request.request_id, list(turn.tokens), list(turn.log_probs), "stop" if stopped else "length"
        )

    def _cancel(self, keys: list[tuple[str, int]]) -> None:
        """Cancel these loops and wait for them to end (their ``finally`` releases their tools)."""
        tasks = [self._running.pop(key).task for key in keys]

        async def cancel() -> None:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if tasks:
            self._call(cancel)

    def _call(self, coroutine_function: Callable[[], Coroutine]) -> Any:
        """Run ``coroutine_function()`` on the loops' event loop, in its thread, to its end."""
        return self._thread.submit(self._loop.run_until_complete, coroutine_function()).result()

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        return {
            "prompts": dict(self.prompts),
            "rows": {
                uid: [{"turns": [asdict(t) for t in r.turns], "output": r.output} for r in rows]
                for uid, rows in self.rows.items()
            },
            "decode_calls": self.decoder.decode_calls,
            "restarted": self.restarted,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._cancel(list(self._running))
        self.prompts = dict(state["prompts"])
        self.rows = {
            uid: [_Trajectory([_Row(**t) for t in r["turns"]], r["output"]) for r in rows]
            for uid, rows in state["rows"].items()
        }
        self.decoder.decode_calls = int(state["decode_calls"])
        self.restarted = int(state["restarted"])
