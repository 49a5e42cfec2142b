"""Runs one agent loop per sample of a prompt batch, all in flight at once, and lays the trajectories out as
the trainer's batch.

The layout is the single-turn one (see verl.workers.rollout.base): left-padded ``prompts``, ``responses``
right-padded to ``data.max_response_length``, the full-sequence ``input_ids`` / ``attention_mask`` /
``position_ids``, and ``rollout_log_probs`` when the engine returns them. Only ``response_mask`` differs: it
is 0 on inserted tokens, which the attention mask keeps (the model reads tool results, it is not trained to
write them). Per-sample non-tensor fields: ``__num_turns__`` (verl's name), ``__tool_calls__``,
``__tool_errors__``, ``__tool_latency_s__``, ``__tool_timeouts__`` (summarised by verl.agent_loop.metrics) and each loop's
``extra_fields`` (``tool_rewards``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import uuid
from typing import Any

import numpy as np
import torch

from verl.agent_loop.base import AGENT_LOOPS, AgentLoopBase, AgentLoopContext, AgentLoopOutput
from verl.agent_loop.tool_calls import RunStopping
from verl.config.errors import ConfigError
from verl.models.plumbing import position_ids
from verl.protocol import DataProto
from verl.workers.rollout.base import SamplingParams, TokenRequest, TokenResponse

METRIC_FIELDS = ("tool_calls", "tool_errors", "tool_latency_s", "tool_timeouts")
"""per-sample numbers a loop reports in ``AgentLoopOutput.metrics``, kept as ``__<name>__`` fields"""


EXTRA_FIELD_DEFAULTS: dict[str, Any] = {"tool_rewards": 0.0}
"""extra fields every agent-loop batch has, and their value for samples whose loop sets none"""


def uses_agent_loop(rollout_cfg: Any) -> bool:
    """Whether the config asks for agent loops (multi-turn, another default loop, or user loops)."""
    agent = rollout_cfg.agent
    return bool(
        rollout_cfg.multi_turn.enable
        or agent.default_agent_loop != "single_turn_agent"
        or agent.agent_loop_config_path
    )


def default_agent_loop(rollout_cfg: Any) -> str:
    """The loop of samples without an ``agent_name``: ``agent.default_agent_loop``, which ``multi_turn.enable``
    turns from single_turn_agent into tool_agent."""
    name = rollout_cfg.agent.default_agent_loop
    return "tool_agent" if rollout_cfg.multi_turn.enable and name == "single_turn_agent" else name


def load_agent_loop_config(path: str) -> dict[str, type]:
    """``agent.agent_loop_config_path``: a YAML list of ``{name: ..., _target_: module.Class | file.py:Class}``
    (verl's format); the loops it names, registered under their names for this run."""
    from omegaconf import OmegaConf

    from verl.utils.imports import load_object

    key = "actor_rollout_ref.rollout.agent.agent_loop_config_path"
    try:
        entries = OmegaConf.to_container(OmegaConf.load(path))
    except FileNotFoundError:
        raise ConfigError(f"{key}: no such file {path}") from None
    if not isinstance(entries, list):
        raise ConfigError(f"{key}: {path} must hold a list of {{name, _target_}} entries")
    loops = {}
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not entry.get("name") or not entry.get("_target_"):
            raise ConfigError(f"{key}: entry {index} of {path} needs a name and a _target_, got {entry!r}")
        target = str(entry["_target_"])
        if ":" not in target:  # verl writes package.module.Class
            target = ":".join(target.rsplit(".", 1))
        cls = load_object(target, f"{key} ({path}, entry {index})", "agent loop class")
        if not (isinstance(cls, type) and issubclass(cls, AgentLoopBase)):
            raise ConfigError(
                f"{key}: entry {index} of {path}: {entry['_target_']} is not an AgentLoopBase subclass"
            )
        loops[str(entry["name"])] = cls
    return loops


class AgentLoopRunner:
    """The agent loops of one rollout worker. ``submit(request)`` answers one turn request (the rollout
    server's coroutine, verl.workers.rollout.server.RolloutServer.generate, or the streaming pool's);
    ``submit_all(requests)`` answers a wave of them together (the server's ``generate_all``; default: each
    through ``submit``, all at once).

    :meth:`generate_sequences` runs every sample's loop and answers their turns in waves: it lets the loops run
    until each has returned or waits for a turn, then sends the waiting turns, in row order, as one call. Which
    requests form an engine call, and in which order, is then the same on every run, whatever the timing of
    the tools, so a seeded run is reproducible and resumes exactly."""

    def __init__(
        self,
        config: Any,
        tokenizer: Any,
        submit: Any,
        stop_token_ids: list[int],
        pad_token_id: int,
        submit_all: Any = None,
    ) -> None:
        rollout = config.actor_rollout_ref.rollout
        self.submit = submit
        self.submit_all = submit_all or (lambda requests: asyncio.gather(*(submit(r) for r in requests)))
        self.pad_token_id = pad_token_id
        self.default_loop = default_agent_loop(rollout)
        self.loop_classes = dict(AGENT_LOOPS)
        if rollout.agent.agent_loop_config_path:
            self.loop_classes.update(load_agent_loop_config(rollout.agent.agent_loop_config_path))
        if self.default_loop not in self.loop_classes:
            AGENT_LOOPS.lookup(self.default_loop)  # the error names the closest registered loop
        path = rollout.multi_turn.tool_config_path
        tools = []
        if path:
            from verl.tools.loader import load_tools

            tools = load_tools(path)
        self.context = AgentLoopContext(
            generate=self._generate,
            tokenizer=tokenizer,
            stop_token_ids=list(stop_token_ids),
            max_response_length=int(config.data.max_response_length),
            multi_turn=rollout.multi_turn,
            tools={tool.name: tool for tool in tools},
        )
        self.weights_version: int | None = None
        self._loops: dict[str, AgentLoopBase] = {}
        self._wave: _Wave | None = None
        """the turns waiting while generate_sequences runs (None outside it: each turn goes to ``submit``)"""

    def loop(self, name: str) -> AgentLoopBase:
        """The loop registered (or configured) as ``name``: one instance for every sample that names it."""
        if name not in self._loops:
            if name not in self.loop_classes:
                raise ConfigError(
                    f"agent_name {name!r} names no agent loop (registered: {', '.join(sorted(self.loop_classes))})"
                )
            self._loops[name] = self.loop_classes[name](self.context)
        return self._loops[name]

    async def _generate(self, ids: list[int], sampling: SamplingParams) -> TokenResponse:
        request = TokenRequest(uuid.uuid4().hex, list(ids), sampling, self.weights_version)
        if self._wave is None:
            return await self.submit(request)
        return await self._wave.join(request)

    def generate_sequences(
        self, prompts: DataProto, sampling: SamplingParams, weights_version: int | None = None
    ) -> DataProto:
        """Every sample's trajectory (its loop: the ``agent_name`` column, else the default), in row order."""
        self.weights_version = weights_version
        outputs = _run(self._run_all(self.samples(prompts), sampling))
        return self.assemble(prompts, outputs, sampling.max_new_tokens)

    def samples(self, prompts: DataProto) -> list[tuple[str, list[int], dict]]:
        """Each row of a left-padded prompt batch as ``(its loop's name, prompt ids, its other fields)``."""
        ids, mask = prompts.batch["input_ids"].cpu(), prompts.batch["attention_mask"].bool().cpu()
        rows = []
        for row in range(len(prompts)):
            fields = {key: values[row] for key, values in prompts.non_tensor_batch.items()}
            rows.append(
                (str(fields.get("agent_name") or self.default_loop), ids[row][mask[row]].tolist(), fields)
            )
        return rows

    async def _run_all(
        self, rows: list[tuple[str, list[int], dict]], sampling: SamplingParams
    ) -> list[AgentLoopOutput]:
        self._wave = wave = _Wave()
        try:
            tasks = []
            for index, (name, prompt, fields) in enumerate(rows):
                context = contextvars.copy_context()
                context.run(_ROW.set, index)
                tasks.append(
                    context.run(asyncio.ensure_future, self.loop(name).run(sampling, prompt, **fields))
                )
            try:
                while not all(task.done() for task in tasks):
                    await wave.settle(tasks)
                    _raise_interruption(tasks)
                    if wave.waiting:
                        await wave.send(self.submit_all)
            except BaseException:
                await _cancel_and_collect(tasks)
                raise
            return [task.result() for task in tasks]
        finally:
            self._wave = None

    def assemble(self, prompts: DataProto, outputs: list[AgentLoopOutput], width: int) -> DataProto:
        """The trainer's batch of these trajectories (one per prompt row, in order); see the module docstring."""
        rows = len(outputs)
        responses = torch.full((rows, width), self.pad_token_id, dtype=torch.long)
        response_mask = torch.zeros(rows, width, dtype=torch.long)
        response_attention = torch.zeros(rows, width, dtype=torch.long)
        log_probs = torch.zeros(rows, width, dtype=torch.float32)
        for row, out in enumerate(outputs):
            n = len(out.response_ids)
            n_log_probs = n if out.response_logprobs is None else len(out.response_logprobs)
            if n > width or len(out.response_mask) != n or n_log_probs != n:
                raise RuntimeError(
                    f"agent loop returned {n} response tokens with {len(out.response_mask)} mask entries and "
                    f"{n_log_probs} log-probs; the response must fit in data.max_response_length={width} and "
                    "have one mask entry and one log-prob (or none at all) per token"
                )
            responses[row, :n] = torch.tensor(out.response_ids, dtype=torch.long)
            response_mask[row, :n] = torch.tensor(out.response_mask, dtype=torch.long)
            response_attention[row, :n] = 1
            if out.response_logprobs is not None:
                log_probs[row, :n] = torch.tensor(out.response_logprobs, dtype=torch.float32)
        device = prompts.batch["input_ids"].device
        prompt_ids = prompts.batch["input_ids"]
        prompt_mask = prompts.batch["attention_mask"]
        attention_mask = torch.cat([prompt_mask, response_attention.to(device, prompt_mask.dtype)], dim=1)
        tensors = {
            "prompts": prompt_ids,
            "responses": responses.to(device, prompt_ids.dtype),
            "response_mask": response_mask.to(device),
            "input_ids": torch.cat([prompt_ids, responses.to(device, prompt_ids.dtype)], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids(attention_mask),
        }
        if all(out.response_logprobs is not None for out in outputs):
            tensors["rollout_log_probs"] = (log_probs * response_mask).to(device)
        non_tensors = {"__num_turns__": np.array([out.num_turns for out in outputs], dtype=np.int64)}
        for name in METRIC_FIELDS:
            non_tensors[f"__{name}__"] = np.array([float(out.metrics.get(name, 0.0)) for out in outputs])
        # every call gives the same fields, whichever loops ran (ranks' batches are concatenated)
        for key in sorted({key for out in outputs for key in out.extra_fields} | set(EXTRA_FIELD_DEFAULTS)):
            default = EXTRA_FIELD_DEFAULTS.get(key)
            non_tensors[key] = np.array([out.extra_fields.get(key, default) for out in outputs], dtype=object)
        return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def _run(coroutine: Any) -> Any:
    """Run ``coroutine`` to completion, in a thread of its own when this thread already runs an event loop
    (a notebook, an async Ray actor)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        running = False
    else:
        running = True
    if not running:  # outside the except block: its RuntimeError is no context of the loops' errors
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


async def _cancel_and_collect(tasks: list[asyncio.Future]) -> None:
    """Cancel the loops still running (their tool calls are cancelled with them) and wait for them, taking
    their errors: a batch that is being abandoned must not leave tasks whose errors asyncio would report as
    never retrieved."""
    for task in tasks:
        task.cancel()
    try:
        await asyncio.gather(*tasks, return_exceptions=True)
    except asyncio.CancelledError:  # cancelled again while waiting: asyncio.run collects the rest
        pass


def _raise_interruption(tasks: list[asyncio.Future]) -> None:
    """Raise at once what ended a loop that is not an error of that loop (a Ctrl-C or SIGTERM raised while its
    code ran, e.g. verl.cli's ``Terminated``, which asyncio keeps as the task's exception; RunStopping from a
    tool call): the run is being interrupted, and waiting for the other loops (their tools) first would delay
    it. ``asyncio.run`` then cancels the other loops, and so their tool calls."""
    for task in tasks:
        if task.done() and not task.cancelled():
            error = task.exception()
            if error is not None and (not isinstance(error, Exception) or isinstance(error, RunStopping)):
                raise error


_ROW: contextvars.ContextVar[int] = contextvars.ContextVar("agent_loop_row")
"""the batch row whose loop is running: each loop's task carries its own"""


def _interrupted(tasks: list[asyncio.Future]) -> bool:
    try:
        _raise_interruption(tasks)
    except BaseException:
        return True
    return False


class _Wave:
    """The turn requests the loops of one batch wait on, sent together in row order (see AgentLoopRunner)."""

    def __init__(self) -> None:
        self.waiting: list[tuple[tuple[int, int], TokenRequest, asyncio.Future]] = []
        self.turns: dict[int, int] = {}
        """turn requests each row has made"""
        self.joined = asyncio.Event()

    async def join(self, request: TokenRequest) -> TokenResponse:
        row = _ROW.get()
        self.turns[row] = self.turns.get(row, 0) + 1
        future = asyncio.get_running_loop().create_future()
        self.waiting.append(((row, self.turns[row]), request, future))
        self.joined.set()
        return await future

    async def settle(self, tasks: list[asyncio.Future]) -> None:
        """Until every loop has returned or waits for its turn (a loop may still be running a tool)."""
        while True:
            busy = [task for task in tasks if not task.done()]
            if len(busy) <= len(self.waiting) or _interrupted(tasks):
                return
            self.joined.clear()
            joined = asyncio.ensure_future(self.joined.wait())
            await asyncio.wait([*busy, joined], return_when=asyncio.FIRST_COMPLETED)
            joined.cancel()

    async def send(self, submit_all: Any) -> None:
        """The waiting turns, in row order, as one call; each loop gets its answer (or the call's error)."""
        wave, self.waiting = sorted(self.waiting, key=lambda entry: entry[0]), []
        try:
            responses = await submit_all([request for _, request, _ in wave])
        except Exception as error:  # every loop of the wave sees the engine's error
            for _, _, future in wave:
                future.set_exception(error)
            return
        for (_, _, future), response in zip(wave, responses, strict=True):
            future.set_result(response)
