"""`verl bench` at a toy size: the report's structure and that every number is real (no speed claims)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from verl.bench import BenchSizes, run_bench, run_cli
from verl.bench.measure import MIN_REPEATS, Case, planned_repeats, run_case
from verl.bench.models import ModelSpec, PreparedModel, prepare_model
from verl.bench.report import format_table
from verl.bench.rollout import engines
from verl.bench.runner import section_cases

# The tests share one bench run (the report fixture, ~40 s): one process (--dist loadfile), sent out first.
pytestmark = pytest.mark.xdist_group("bench")

TOY = ModelSpec(
    "toy",
    "test model",
    dict(
        hidden_size=64,  # 2 heads of 32: the narrowest vLLM's CPU attention takes
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
    ),
)
SIZES = BenchSizes(
    rollout_batches=(1, 3),
    rollout_lengths=(5,),
    train_sequences=4,
    train_max_response_length=6,
    train_micro_batch=2,
    fsdp_ranks=(1,),  # in-process here; the 2-rank rows have their own test (their own processes)
    warmup=1,
    repeats=2,
    budget_s=30.0,
    contention_retries=0,  # no speed is asserted: a busy machine needs no second attempt here
    idle_wait_s=0.0,
)


def _positive(value) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    # In-process (the same measurement code without a process per case) and one thread: fast even when
    # other processes keep the CPUs busy, where a 2-thread OpenMP team waits on its descheduled half.
    return run_bench(
        [TOY],
        sizes=SIZES,
        threads=1,
        json_path=tmp / "bench.json",
        isolate=False,
        home=tmp,
        log=lambda _: None,
    )


def test_rollout_rows_cover_every_engine_batch_and_length(report):
    rows = report["sections"]["rollout"]
    assert "dummy" not in engines() and "hf" in engines()
    assert {(r["engine"], r["batch"], r["length"]) for r in rows} == {
        (e, b, n) for e in engines() for b in SIZES.rollout_batches for n in SIZES.rollout_lengths
    }
    for r in rows:
        assert r["status"] == "ok", r["reason"]
        # EOS is ignored: every response has the full length, so engines do the same work.
        assert r["tokens_per_run"] == r["batch"] * r["length"]
        assert _positive(r["tokens_per_s"]) and _positive(r["median_s"]) and _positive(r["peak_rss_mb"])
        assert r["peak_delta_mb"] >= 0 and r["repeats"] >= MIN_REPEATS == len(r["times_s"])
        assert r["torch_threads"] == 1
        assert r["others_cpu_pct"] is None or 0 <= r["others_cpu_pct"] <= 100


def test_train_rows_padded_and_packed(report):
    rows = {r["mode"]: r for r in report["sections"]["train"]}
    assert set(rows) == {"padded", "packed"}
    padded = rows["padded"]
    assert padded["status"] == "ok", padded["reason"]
    assert _positive(padded["tokens_per_s"]) and padded["real_tokens"] < padded["padded_tokens"]
    assert 0 < padded["padding_fraction"] < 1
    packed = rows["packed"]
    assert packed["status"] == "ok", packed["reason"]
    assert _positive(packed["tokens_per_s"]) and packed["real_tokens"] == padded["real_tokens"]


def test_step_rows_have_the_stage_breakdown(report):
    rows = report["sections"]["step"]
    others = [(e, t) for e in engines() if e not in ("hf", "vllm") for t in ("padded", "shared", "packed")]
    vllm = [("vllm", "shared")] if "vllm" in engines() else []
    assert [(r["engine"], r["training"]) for r in rows] == [("hf", "padded"), *others, *vllm]
    for r in rows:
        assert r["status"] == "ok", r["reason"]
        assert r["samples"] == 128  # the default recipe: 16 prompts x 8 samples
        assert _positive(r["median_s"]) and _positive(r["tokens_per_s"])
        assert {"gen", "reward", "update_actor"} <= set(r["stages_s"])
        assert all(v >= 0 for v in r["stages_s"].values())


HELD = ("param_bytes", "grad_bytes", "optim_bytes", "state_bytes")


def _check_fsdp_row(row, ranks):
    assert row["status"] == "ok", row["reason"]
    assert _positive(row["tokens_per_s"]) and _positive(row["median_s"]) and _positive(row["peak_rss_mb"])
    assert row["torch_threads"] == 1 and row["ranks"] == ranks and len(row["per_rank"]) == ranks
    for r in row["per_rank"]:
        assert all(_positive(r[k]) for k in HELD) and r["torch_threads"] == 1
        assert r["state_bytes"] == r["param_bytes"] + r["grad_bytes"] + r["optim_bytes"]
        assert _positive(r["peak_rss_mb"]) and r["peak_delta_mb"] >= 0
    # the row's per-rank figures are the max over the ranks
    for key in (*HELD, "peak_rss_mb"):
        assert row[key] == max(r[key] for r in row["per_rank"])


def test_fsdp_rows_one_rank(report):
    """1 rank: fsdp2 shards over a one-process group, so it holds what dp holds: every fp32 weight, its
    gradient and AdamW's two moments (plus a step count per tensor)."""
    rows = {r["strategy"]: r for r in report["sections"]["fsdp"]}
    assert set(rows) == {"dp", "fsdp2"}
    for row in rows.values():
        _check_fsdp_row(row, ranks=1)
        assert row["param_bytes"] == row["grad_bytes"] == 4 * row["n_params"]
        assert 2 * row["param_bytes"] < row["optim_bytes"] < 2.01 * row["param_bytes"]
        # the train section's batch
        assert row["real_tokens"] == report["sections"]["train"][0]["real_tokens"]
    assert {k: rows["dp"][k] for k in HELD} == {k: rows["fsdp2"][k] for k in HELD}


def test_fsdp_two_ranks_hold_half_each(tmp_path):
    """2 ranks, each case in its own process as `verl bench` runs it (rank 1 forked from it): DDP keeps
    everything on each rank, FSDP2 about half; the table says by how much."""
    from verl.bench import fsdp
    from verl.bench.common import write_task_data
    from verl.bench.report import fsdp_table
    from verl.bench.runner import PRELOAD, measure

    write_task_data(tmp_path)
    model = prepare_model(TOY, tmp_path)
    common = dict(data_dir=str(tmp_path), warmup=1, repeats=2, budget_s=30.0)
    cases = fsdp.cases("toy", str(model.path), 4, 6, 2, ranks=(2,), **common)
    assert PRELOAD[-1] == "verl.bench.fsdp"
    rows = {c.params["strategy"]: measure(c, isolate=True, sizes=SIZES) for c in cases}
    for row in rows.values():
        _check_fsdp_row(row, ranks=2)
    dp, sharded = rows["dp"], rows["fsdp2"]
    assert len({r["param_bytes"] for r in dp["per_rank"]}) == 1  # replicated
    assert sharded["param_bytes"] < 0.6 * dp["param_bytes"]
    assert sum(r["param_bytes"] for r in sharded["per_rank"]) == dp["param_bytes"]  # cut, nothing duplicated
    assert sharded["state_bytes"] < 0.6 * dp["state_bytes"]
    assert "toy, 2 ranks, fsdp2 / dp per rank: params+grads+optim 0.5" in fsdp_table([dp, sharded])


def test_json_and_printed_tables(report, tmp_path_factory):
    saved = json.loads(open(report["json_path"]).read())
    assert saved["sections"].keys() == {"rollout", "train", "step", "fsdp"}
    assert saved["machine"]["torch_threads"] == 1 and saved["models"][0]["n_params"] > 0
    from verl.bench.report import render

    text = render(saved)
    for heading in ("(a) rollout", "(b) policy update", "(c) one GRPO step", "(e) policy update", "peak MB"):
        assert heading in text


def test_a_case_in_its_own_process(tmp_path):
    """The default path: the case runs in a process forked from the forkserver and reports back."""
    from verl.bench import rollout
    from verl.bench.common import write_task_data

    write_task_data(tmp_path)
    model = prepare_model(TOY, tmp_path)
    case = Case(
        "rollout",
        "toy",
        str(model.path),
        {"engine": "hf", "batch": 2, "length": 3},
        str(tmp_path),
        threads=1,
        repeats=2,
    )
    result = run_case(rollout.setup, case, isolate=True, preload=["verl.bench.rollout"])
    assert len(result["times_s"]) == 2 and all(r["tokens"] == 6 for r in result["runs"])
    assert result["peak_rss_mb"] > 0 and result["peak_delta_mb"] >= 0


def test_unknown_names_are_refused(capsys):
    assert run_cli("tiny,huge", None, quick=True, json_path=None) == 2
    assert "unknown model huge" in capsys.readouterr().err
    assert run_cli(None, "rollout,nope", quick=True, json_path=None) == 2


def test_engines_narrow_the_rollout_cases(capsys):
    common = dict(data_dir="unused", threads=1, warmup=0, repeats=1, budget_s=1.0)
    model = PreparedModel("toy", Path("unused"), 0, "not built: cases only")
    cases = section_cases("rollout", model, replace(SIZES, rollout_engines=("fast",)), common)
    assert {(c.params["engine"], c.params["batch"]) for c in cases} == {("fast", 1), ("fast", 3)}
    assert run_cli("tiny", "rollout", quick=True, json_path=None, engines="fast,nope") == 2
    assert "unknown engine nope" in capsys.readouterr().err


def test_planned_repeats_respects_budget_and_minimum():
    assert planned_repeats(5, budget_s=60, seconds_per_run=1) == 5
    assert planned_repeats(5, budget_s=60, seconds_per_run=20) == 3
    assert planned_repeats(5, budget_s=60, seconds_per_run=600) == MIN_REPEATS
    assert planned_repeats(1, budget_s=60, seconds_per_run=600) == 1


def test_format_table_aligns_columns():
    lines = format_table(["a", "tokens/s"], [["x", 1234.5], ["yy", None]]).splitlines()
    assert len({len(line) for line in lines}) == 1
    assert lines[2].endswith("1,234") and lines[3].endswith("-")


def test_verl_bench_runs_the_librarys_harness(capsys):
    """`verl bench` runs verl.bench, part of the installed package (no source checkout needed)."""
    from verl.cli import main

    assert main(["bench", "--quick", "--models", "tiny,huge"]) == 2
    assert "unknown model huge" in capsys.readouterr().err
