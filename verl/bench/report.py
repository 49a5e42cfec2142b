"""The bench's printed tables: one per section, plus what was skipped and why."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from verl.bench.measure import BUSY_PCT


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Right-aligned plain-text columns (numbers read best aligned on the right)."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value >= 100:
            return f"{value:,.0f}"
        if value >= 1:
            return f"{value:.2f}"
        return f"{value:.3f}"
    return str(value)


def _memory(row: dict[str, Any]) -> list[Any]:
    """The columns every table ends with: memory, then how trustworthy the timing is."""
    return [
        row.get("peak_rss_mb"),
        row.get("peak_delta_mb"),
        row.get("repeats"),
        _spread(row),
        row.get("others_cpu_pct"),
    ]


def _spread(row: dict[str, Any]) -> float | None:
    """(slowest - fastest) / median of the timed runs, in percent: a large one marks a disturbed row."""
    times = row.get("times_s") or []
    if len(times) < 2 or not row.get("median_s"):
        return None
    return 100 * (max(times) - min(times)) / sorted(times)[len(times) // 2]


MEMORY_HEADERS = ["peak MB", "+MB", "reps", "spread %", "others %"]


def rollout_table(rows: list[dict[str, Any]]) -> str:
    headers = [
        "model",
        "engine",
        "batch",
        "resp len",
        "tokens/s",
        "s/run",
        "ms/step",
        *MEMORY_HEADERS,
    ]
    body = [
        [r["model"], r["engine"], r["batch"], r["length"]]
        + [r.get("tokens_per_s"), r.get("median_s"), r.get("ms_per_step")]
        + _memory(r)
        for r in rows
        if r["status"] == "ok"
    ]
    return format_table(headers, body)


def train_table(rows: list[dict[str, Any]]) -> str:
    headers = [
        "model",
        "mode",
        "seqs",
        "resp len",
        "tokens",
        "pad %",
        "tokens/s",
        "s/run",
        *MEMORY_HEADERS,
    ]
    body = []
    for r in rows:
        lengths = f"{r.get('mean_response_length', 0):.0f}/{r['max_response_length']}"
        head = [r["model"], r["mode"], r["sequences"]]
        if r["status"] != "ok":
            body.append([*head, "-", "-", "-", r["status"], "-"] + ["-"] * len(MEMORY_HEADERS))
            continue
        body.append(
            [*head, lengths, r["real_tokens"], 100 * r["padding_fraction"], r["tokens_per_s"], r["median_s"]]
            + _memory(r)
        )
    return format_table(headers, body)


def step_table(rows: list[dict[str, Any]]) -> str:
    ok = [r for r in rows if r["status"] == "ok"]
    stages = list(dict.fromkeys(s for r in ok for s in r["stages_s"]))
    headers = ["model", "engine", "training", "samples", "micro", "step s", "tokens/s"]
    headers += [f"{s} s" for s in stages] + MEMORY_HEADERS
    body = [
        [
            r["model"],
            r["engine"],
            r.get("training", "padded"),
            r["samples"],
            r["micro_batch"] or r["samples"],
            r["median_s"],
            r["tokens_per_s"],
        ]
        + [r["stages_s"].get(s) for s in stages]
        + _memory(r)
        for r in ok
    ]
    return format_table(headers, body)


def _mb(value: int | None) -> float | None:
    return None if value is None else value / 2**20


def fsdp_table(rows: list[dict[str, Any]]) -> str:
    """One row per strategy x ranks; then, per model, the fsdp2 / dp ratios of the per-rank figures at
    each rank count above 1 (what sharding saves)."""
    headers = [
        "model",
        "strategy",
        "ranks",
        "tokens/s",
        "s/run",
        "params MB",
        "grads MB",
        "optim MB",
        "sum MB",
        *MEMORY_HEADERS,
    ]
    body = []
    for r in rows:
        head = [r["model"], r["strategy"], r["ranks"]]
        if r["status"] != "ok":
            body.append([*head, r["status"]] + ["-"] * (len(headers) - 4))
            continue
        held = [_mb(r.get(k)) for k in ("param_bytes", "grad_bytes", "optim_bytes", "state_bytes")]
        body.append([*head, r["tokens_per_s"], r["median_s"], *held] + _memory(r))
    lines = [format_table(headers, body)]
    ok = {(r["model"], r["strategy"], r["ranks"]): r for r in rows if r["status"] == "ok"}
    for model, strategy, ranks in ok:
        dp = ok.get((model, "dp", ranks))
        if strategy != "fsdp2" or ranks < 2 or dp is None:
            continue
        fsdp2 = ok[model, strategy, ranks]
        ratios = [
            f"{what} {fsdp2[key] / dp[key]:.2f}"
            for what, key in (("params+grads+optim", "state_bytes"), ("peak RSS", "peak_rss_mb"))
            if fsdp2.get(key) and dp.get(key)
        ]
        lines.append(f"{model}, {ranks} ranks, fsdp2 / dp per rank: " + ", ".join(ratios))
    return "\n".join(lines)


TABLES = {
    "rollout": (
        "(a) rollout: response tokens/s, EOS ignored (every response has the full length)",
        rollout_table,
    ),
    "train": (
        "(b) policy update (forward + backward + AdamW step): real tokens/s; resp len = mean/max",
        train_table,
    ),
    "step": (
        "(c) one GRPO step (RLTrainer.train_step, default recipe: 16 prompts x 8 samples; micro = rows per "
        "forward pass): medians of timing_s/*",
        step_table,
    ),
    "fsdp": (
        "(e) policy update as (b) padded, replicated (dp: DDP over 2 ranks) vs sharded (fsdp2), 1 torch thread per "
        "rank: tokens/s of the whole batch over all ranks; params / grads / optim = what ONE rank holds after an "
        "update (local shards), sum = their total, peak MB = that rank's peak RSS; every per-rank figure is the "
        "max over the ranks",
        fsdp_table,
    ),
}


def render(report: dict[str, Any]) -> str:
    """Everything a reader needs: the machine, how it was measured, the tables, the skips."""
    env, settings = report["machine"], report["settings"]
    parts = [
        f"verl bench: {env['cpu']} ({env['cpu_count']} CPUs, {env['cpu_capability']}), torch {env['torch']}, "
        f"transformers {env['transformers']}, torch threads {env['torch_threads']}, "
        f"attention {env['attn_implementation']}",
        f"timing: median of up to {settings['repeats']} runs after {settings['warmup']} warm-up run(s) "
        f"(fewer when runs would exceed {settings['budget_s']:.0f}s, at least {settings['min_repeats']}); a case "
        f"during which other processes used over {BUSY_PCT:.0f}% of the CPUs is measured again (at most "
        f"{settings.get('contention_retries', 0)} more attempts) and the least disturbed attempt kept",
        f"memory: {settings['memory_method']}",
        "columns: peak MB / +MB = peak RSS / its excess over the RSS after setup; spread % = (slowest - "
        "fastest) timed run / median; others % = share of the machine's CPU time used by other processes "
        "meanwhile",
        "models: "
        + ", ".join(
            f"{m['name']} ({m['n_params'] / 1e6:.1f}M params, {m['description']})" for m in report["models"]
        ),
    ]
    for section, (title, table) in TABLES.items():
        rows = report["sections"].get(section)
        if rows:
            parts += ["", title, table(rows)]
    busy = _busy_warning(report)
    if busy:
        parts += ["", busy]
    problems = [r for rows in report["sections"].values() for r in rows if r["status"] not in ("ok",)]
    skipped = report["skipped"] + [{"what": _row_name(r), "reason": r["reason"]} for r in problems]
    if skipped:
        parts += ["", "skipped / failed:"] + [f"  {s['what']}: {_first_line(s['reason'])}" for s in skipped]
    return "\n".join(parts)


def _busy_warning(report: dict[str, Any]) -> str | None:
    """A warning naming the rows that ran while other processes used the CPUs: their times are slower and
    noisier than on an idle machine (with every core running a bench thread, each preemption stalls the
    whole OpenMP team)."""
    rows = [r for rows in report["sections"].values() for r in rows if r["status"] == "ok"]
    busy = [r for r in rows if (r.get("others_cpu_pct") or 0) > BUSY_PCT]
    if not busy:
        return None
    worst = max(r["others_cpu_pct"] for r in busy)
    return (
        f"warning: other processes used more than {BUSY_PCT:.0f}% of the CPUs during {len(busy)} of {len(rows)} "
        f"rows (up to {worst:.0f}%, column 'others %'): those times are slower and noisier than on an idle machine"
    )


def _row_name(row: dict[str, Any]) -> str:
    keys = ("engine", "training", "mode", "strategy", "ranks", "batch", "length")
    detail = " ".join(f"{k}={row[k]}" for k in keys if k in row)
    return f"{row['section']} {row['model']} {detail}".strip()


def _first_line(text: str) -> str:
    """The last non-empty line of a traceback (the exception), or the first line of a message."""
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[-1] if lines[0].startswith("Traceback") else lines[0]
