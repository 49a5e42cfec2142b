"""The batch arithmetic of one RL step, explained: every number with the formula and the config keys it comes
from, e.g. ``samples per step = data.train_batch_size (1024) x actor_rollout_ref.rollout.n (5) = 5120``.

The numbers are :class:`verl.config.sizes.DerivedSizes` (what the trainer itself derives and logs) and the
:class:`verl.trainer.plan.StepPlan` (which passes run); this module only divides them over the data-parallel
ranks and multiplies by the sequence lengths, and keeps the size of each forward pass (rows, tokens, LM-head
positions) for the memory estimate (:mod:`verl.doctor.memory`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

from verl.config.sizes import DerivedSizes

ARR = "actor_rollout_ref"


@dataclass(frozen=True)
class Explained:
    """One line of arithmetic: ``label = formula = value``, and a remark."""

    label: str
    value: int | str
    formula: str = ""
    note: str = ""

    def text(self) -> str:
        line = (
            f"{self.label} = {self.formula} = {self.value}"
            if self.formula
            else f"{self.label} = {self.value}"
        )
        return f"{line}  ({self.note})" if self.note else line


@dataclass(frozen=True)
class ForwardPass:
    """The largest forward (and backward) pass of one kind on one rank: what its memory scales with."""

    phase: str
    """generate | validate | old_log_prob | ref | values | actor_update | critic_update"""
    rows: int
    """sequences in it"""
    tokens: int
    """tokens in it (rows x (prompt + response length), or the use_dynamic_bsz budget)"""
    head_tokens: int = 0
    """positions through the full-vocabulary LM head at once (the log_prob_chunk_size chunk)"""
    grad: bool = False
    budgeted: bool = False
    """micro-batches formed by a token budget (use_dynamic_bsz) rather than a row count"""


@dataclass
class BatchReport:
    """The explained arithmetic by section, and the passes it implies."""

    sections: list[tuple[str, list[Explained]]] = field(default_factory=list)
    passes: dict[str, ForwardPass] = field(default_factory=dict)
    dp: int = 1
    seq_len: int = 0

    def add_pass(self, title: str, lines: list[Explained], forward: ForwardPass) -> None:
        """A section whose lines explain one forward (and maybe backward) pass."""
        self.sections.append((title, lines))
        self.passes[forward.phase] = forward


def _key(config: Any, key: str) -> str:
    """``key (value)`` as the lines write a setting; null for unset."""
    value = OmegaConf.select(config, key)
    return f"{key} ({'null' if value is None else value})"


def _ceil_div(a: int, b: int) -> int:
    return -(-a // max(b, 1))


def _ranks_note(config: Any) -> str:
    """What verl asked for when the loader mapped its GPU counts onto one process (trainer.backend=local)."""
    mapped = dict(config.compat.mapped) if config.get("compat") is not None else {}
    if "trainer.n_gpus_per_node" not in mapped and "trainer.nnodes" not in mapped:
        return ""
    nodes = mapped.get("trainer.nnodes", config.trainer.nnodes)
    per_node = mapped.get("trainer.n_gpus_per_node", config.trainer.n_gpus_per_node)
    return (
        f"asked {nodes} x {per_node}; trainer.backend=local runs one process, trainer.backend=ray runs "
        f"{int(nodes) * int(per_node)} workers"
    )


def _lengths(config: Any) -> tuple[int, str]:
    data = config.data
    seq = int(data.max_prompt_length) + int(data.max_response_length)
    return seq, f"({_key(config, 'data.max_prompt_length')} + {_key(config, 'data.max_response_length')})"


def _step_lines(config: Any, sizes: DerivedSizes) -> list[Explained]:
    n_key = f"{ARR}.rollout.n"
    local = sizes.samples_per_step // sizes.dp_size
    strategy = sizes.strategy
    if strategy == "fsdp2":
        strategy += f" (weights, gradients and optimizer state sharded over {sizes.dp_size} rank(s))"
    else:
        strategy += " (every rank holds the whole model)"
    return [
        Explained("prompts per step", sizes.prompts_per_step, _key(config, "data.train_batch_size")),
        Explained(
            "samples per step",
            sizes.samples_per_step,
            f"{_key(config, 'data.train_batch_size')} x {_key(config, n_key)}",
        ),
        Explained(
            "data-parallel ranks",
            sizes.dp_size,
            f"{_key(config, 'trainer.nnodes')} x {_key(config, 'trainer.n_gpus_per_node')}",
            _ranks_note(config),
        ),
        Explained(
            "samples per rank",
            local,
            f"samples per step ({sizes.samples_per_step}) / data-parallel ranks ({sizes.dp_size})",
        ),
        Explained("training strategy", strategy),
    ]


def _rows_or_budget(
    config: Any, rows_key: str, budget: int | None, budget_key: str, whole: int, whole_what: str
) -> tuple[int, int | None, Explained]:
    """Rows per pass (capped at the rank's ``whole``), the token budget, and the line saying so."""
    if budget:
        line = Explained(
            "micro-batch per rank", f"up to {budget} real tokens", note=f"use_dynamic_bsz: {budget_key}"
        )
        return whole, budget, line
    asked = OmegaConf.select(config, rows_key)
    rows = whole if asked is None else min(int(asked), whole)
    if asked is None:
        note = f"null: all {whole} {whole_what} at once"
    elif int(asked) > whole:
        note = f"more than the rank's {whole} {whole_what}: {whole}"
    else:
        note = ""
    return rows, None, Explained("rows per pass", rows, _key(config, rows_key), note)


def _tokens_line(rows: int, budget: int | None, seq: int, lengths: str) -> tuple[int, Explained]:
    if budget:
        return budget, Explained("tokens per pass", budget, note="the token budget: real tokens, packed")
    tokens = rows * seq
    note = "an upper bound: rows padded to the longest; use_remove_padding computes only real tokens"
    return tokens, Explained("tokens per pass", tokens, f"rows ({rows}) x {lengths}", note)


def _head_line(config: Any, rows: int, budget: int | None) -> tuple[int, Explained]:
    """Positions through the LM head at once: the project computes it over response positions only, in
    chunks of ``model.log_prob_chunk_size`` (verl.workers.engine.scoring)."""
    chunk_key = f"{ARR}.model.log_prob_chunk_size"
    chunk = int(OmegaConf.select(config, chunk_key))
    response = int(config.data.max_response_length)
    positions = budget if budget else rows * response
    head = positions if chunk <= 0 else min(chunk, positions)
    formula = f"min({_key(config, chunk_key)}, response positions of the pass ({positions}))"
    if chunk <= 0:
        formula = f"response positions of the pass ({positions}), {_key(config, chunk_key)}: all at once"
    return head, Explained("LM-head positions at once", head, formula)


def _forward_lines(
    config: Any,
    phase: str,
    rows_key: str,
    budget: int | None,
    budget_key: str,
    local: int,
    seq: int,
    lengths: str,
    head: bool = True,
) -> tuple[list[Explained], ForwardPass]:
    """The lines of a forward-only pass (log-probs, values) and its size."""
    rows, budget, rows_line = _rows_or_budget(
        config, rows_key, budget, budget_key, local, "samples of the rank"
    )
    tokens, tokens_line = _tokens_line(rows, budget, seq, lengths)
    lines = [rows_line]
    if not budget:
        lines.append(
            Explained(
                "passes per step", _ceil_div(local, rows), f"samples per rank ({local}) / rows ({rows})"
            )
        )
    lines.append(tokens_line)
    return lines, _pass(config, lines, phase, rows, tokens, budget, head, grad=False)


def _update_lines(
    config: Any,
    phase: str,
    section: str,
    mini_key: str,
    mini_samples: int,
    micro_samples: int,
    epochs: tuple[str, int],
    budget: int | None,
    budget_key: str,
    sizes: DerivedSizes,
    seq: int,
    lengths: str,
    head: bool = True,
) -> tuple[list[Explained], ForwardPass]:
    """The lines of a trained role's update (actor or critic) and the size of its micro-batch."""
    dp, n_key = sizes.dp_size, f"{ARR}.rollout.n"
    mini_prompts = mini_samples // int(config.actor_rollout_ref.rollout.n)
    per_step = sizes.prompts_per_step // mini_prompts
    local_mini = mini_samples // dp
    epochs_key, epochs_value = epochs
    lines = [
        Explained(
            "mini-batch", mini_samples, f"{mini_key} x {_key(config, n_key)}", "samples per optimizer step"
        ),
        Explained("mini-batch per rank", local_mini, f"mini-batch ({mini_samples}) / ranks ({dp})"),
        Explained(
            "mini-batches per epoch",
            per_step,
            f"{_key(config, 'data.train_batch_size')} / {mini_key}",
        ),
        Explained(
            "optimizer steps per RL step",
            epochs_value * per_step,
            f"{epochs_key} x mini-batches per epoch ({per_step})",
        ),
    ]
    if budget:
        rows = local_mini
        lines.append(
            Explained(
                "micro-batch per rank", f"up to {budget} real tokens", note=f"use_dynamic_bsz: {budget_key}"
            )
        )
    else:
        asked = OmegaConf.select(config, f"{section}.ppo_micro_batch_size_per_gpu")
        rows = min(micro_samples, local_mini)
        note = f"null: the rank's whole mini-batch, {local_mini}" if asked is None else ""
        lines.append(
            Explained(
                "micro-batch per rank", rows, _key(config, f"{section}.ppo_micro_batch_size_per_gpu"), note
            )
        )
        lines.append(
            Explained(
                "gradient-accumulation steps",
                _ceil_div(local_mini, rows),
                f"mini-batch per rank ({local_mini}) / micro-batch ({rows})",
            )
        )
    tokens, tokens_line = _tokens_line(rows, budget, seq, lengths)
    lines.append(tokens_line)
    return lines, _pass(config, lines, phase, rows, tokens, budget, head, grad=True)


def _pass(
    config: Any,
    lines: list[Explained],
    phase: str,
    rows: int,
    tokens: int,
    budget: Any,
    head: bool,
    grad: bool,
) -> ForwardPass:
    """The pass's LM-head line (appended to ``lines`` when it computes log-probs) and its ForwardPass."""
    head_tokens = 0
    if head:
        head_tokens, head_line = _head_line(config, rows, budget)
        lines.append(head_line)
    return ForwardPass(phase, rows, tokens, head_tokens, grad=grad, budgeted=bool(budget))


def _generate_lines(
    config: Any, local: int, seq: int, lengths: str, owns_weights: bool, val: tuple[int | None, str] | None
) -> tuple[list[Explained], list[ForwardPass]]:
    rollout = config.actor_rollout_ref.rollout
    lines: list[Explained] = []
    passes = []
    if owns_weights:
        at_once = min(int(rollout.max_num_seqs), local)
        lines.append(
            Explained(
                "sequences at once",
                at_once,
                f"min({_key(config, f'{ARR}.rollout.max_num_seqs')}, samples per rank ({local}))",
                f"{rollout.name} schedules them itself",
            )
        )
        passes.append(ForwardPass("generate", at_once, at_once * seq))
    else:
        rows, _, line = _rows_or_budget(
            config, f"{ARR}.rollout.micro_batch_size", None, "", local, "samples of the rank"
        )
        lines.append(Explained("rows per generate call", line.value, line.formula, line.note))
        lines.append(Explained("KV-cache tokens per call", rows * seq, f"rows ({rows}) x {lengths}"))
        passes.append(ForwardPass("generate", rows, rows * seq))
    if val and val[0] is None:
        lines.append(Explained("validation rows per rank", "unknown", note=val[1]))
    elif val:
        val_rows, how = val
        chunk = OmegaConf.select(config, f"{ARR}.rollout.micro_batch_size")
        rows = min(val_rows, int(rollout.max_num_seqs)) if owns_weights else min(val_rows, chunk or val_rows)
        lines.append(Explained("validation rows per rank", val_rows, how))
        if rows != val_rows:
            lines.append(Explained("validation rows at once", rows))
        passes.append(ForwardPass("validate", rows, rows * seq))
    return lines, passes


def explain_batches(
    config: Any,
    sizes: DerivedSizes,
    old_log_probs: str,
    ref: bool,
    critic: bool,
    owns_weights: bool,
    val: tuple[int | None, str] | None = None,
) -> BatchReport:
    """The batch arithmetic of ``config`` (its ``sizes``; which passes run: ``old_log_probs`` as the step plan
    says, ``ref``, ``critic``; ``owns_weights``: the rollout engine is vLLM-like) and each pass's size.
    ``val``: the validation rows per rank and how they were counted, None without validation."""
    report = BatchReport(dp=sizes.dp_size)
    seq, lengths = _lengths(config)
    report.seq_len = seq
    local = sizes.samples_per_step // sizes.dp_size
    report.sections.append(("per RL step", _step_lines(config, sizes)))

    gen_lines, gen_passes = _generate_lines(config, local, seq, lengths, owns_weights, val)
    report.sections.append((f"generation ({config.actor_rollout_ref.rollout.name} engine)", gen_lines))
    report.passes.update({p.phase: p for p in gen_passes})

    actor = config.actor_rollout_ref.actor
    lines, update = _update_lines(
        config,
        "actor_update",
        f"{ARR}.actor",
        _key(config, f"{ARR}.actor.ppo_mini_batch_size"),
        sizes.mini_batch_samples,
        sizes.micro_batch_samples,
        (_key(config, f"{ARR}.actor.ppo_epochs"), int(actor.ppo_epochs)),
        sizes.actor_max_tokens,
        f"{ARR}.actor.ppo_max_token_len_per_gpu",
        sizes,
        seq,
        lengths,
    )
    report.add_pass("actor update", lines, update)

    if old_log_probs == "recompute":
        lines, lp = _forward_lines(
            config,
            "old_log_prob",
            f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu",
            sizes.log_prob_max_tokens,
            f"{ARR}.rollout.log_prob_max_token_len_per_gpu",
            local,
            seq,
            lengths,
        )
        report.add_pass("old log-prob pass", lines, lp)
    else:
        why = {
            "from_rollout": "the engine's own log-probs are π_old",
            "not_needed": "one optimizer step per RL step",
        }
        report.sections.append(
            (
                "old log-prob pass",
                [Explained("old log-prob pass", "not run", note=why.get(old_log_probs, ""))],
            )
        )
    if ref:
        lines, rp = _forward_lines(
            config,
            "ref",
            f"{ARR}.ref.log_prob_micro_batch_size_per_gpu",
            sizes.ref_max_tokens,
            f"{ARR}.ref.log_prob_max_token_len_per_gpu",
            local,
            seq,
            lengths,
        )
        report.add_pass("reference log-prob pass", lines, rp)
    if critic:
        lines, vp = _forward_lines(
            config,
            "values",
            "critic.forward_micro_batch_size_per_gpu",
            sizes.critic_forward_max_tokens,
            "critic.forward_max_token_len_per_gpu",
            local,
            seq,
            lengths,
            head=False,
        )
        report.add_pass("critic value pass", lines, vp)
        mini_key = (
            _key(config, "critic.ppo_mini_batch_size")
            if config.critic.ppo_mini_batch_size is not None
            else _key(config, f"{ARR}.actor.ppo_mini_batch_size")
        )
        epochs_key = (
            "critic.ppo_epochs" if config.critic.ppo_epochs is not None else f"{ARR}.actor.ppo_epochs"
        )
        lines, cp = _update_lines(
            config,
            "critic_update",
            "critic",
            mini_key,
            sizes.critic_mini_batch_samples,
            sizes.critic_micro_batch_samples,
            (_key(config, epochs_key), sizes.critic_ppo_epochs),
            sizes.critic_max_tokens,
            "critic.ppo_max_token_len_per_gpu",
            sizes,
            seq,
            lengths,
            head=False,
        )
        report.add_pass("critic update", lines, cp)
    return report


def _count_rows(path: str) -> int | None:
    """Rows of one data file (parquet: from its footer, nothing else read), None when it cannot be read."""
    try:
        if path.lower().endswith(".parquet"):
            import pyarrow.parquet as pq

            return int(pq.ParquetFile(path).metadata.num_rows)
        from verl.data.io import read_rows

        return len(read_rows(path))
    except Exception:  # a missing or unreadable file: check_inputs reports it
        return None


def validation_rows(config: Any, dp: int) -> tuple[int | None, str] | None:
    """The validation prompts' rows per rank generated at once and how they were counted (rows None: the files
    cannot be read, e.g. not built yet); None when the run has no validation set. ``config`` has the data paths the run will use (prepare's artifacts filled in)."""
    data = config.data
    if not data.val_files:
        return None
    n_key = f"{ARR}.rollout.val_kwargs.n"
    n = int(OmegaConf.select(config, n_key))
    if data.val_batch_size is not None:
        prompts, how = int(data.val_batch_size), _key(config, "data.val_batch_size")
    else:
        from verl.data.io import as_path_list

        counts = [_count_rows(p) for p in as_path_list(data.val_files)]
        if any(c is None for c in counts):
            return None, "data.val_files not readable yet (built at the first run?): not counted"
        prompts = sum(counts)
        if data.val_max_samples is not None and int(data.val_max_samples) >= 0:
            prompts = min(prompts, int(data.val_max_samples))
        how = f"data.val_batch_size (null: all {prompts} rows of data.val_files at once)"
    rows = _ceil_div(prompts * n, dp)
    return rows, f"{how} x {_key(config, n_key)} / ranks ({dp})"
