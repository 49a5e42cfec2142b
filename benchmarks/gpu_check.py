"""Prepared GPU check of the FSDP2 training path (``actor_rollout_ref.actor.strategy=fsdp2``).

Run it with ``bash benchmarks/gpu_check.sh`` on a machine with one CUDA GPU (what it checks and how long it
takes are listed there), or here, on the CPU, with a tiny model: ``python benchmarks/gpu_check.py --device cpu
--tiny`` (tests/unit/test_gpu_check.py runs that).

Layout: this process (the *parent*, which never imports torch) builds nothing itself. It starts *workers*,
``python benchmarks/gpu_check.py --worker NAME[,NAME...]``: on a GPU one per check, so that a crash, an
out-of-memory or a hang in one check (killed at its time limit) still lets the others run; on the CPU one
for all of them (a second start of torch costs more than the checks). Every check in a worker is guarded:
an exception becomes its row's FAIL with the exception's first line. Each worker writes one JSON file per
check under ``<workdir>/results``; the parent prints ONE table at the end and writes it, with every figure,
as ``gpu_check.json`` and ``gpu_check.md`` under ``$OUT`` (or ``--out``, else ``<workdir>/report``).

Checks (rows):

1. ``fsdp2``: GRPO steps of RLTrainer, strategy fsdp2, rollout engine ``fast``, KL loss on (so the
   reference is sharded too): finite losses, step time, ``torch.cuda.max_memory_allocated``, and the
   memory held right after each step (``torch.cuda.memory_allocated``);
2. ``offload``: the same with ``fsdp_config.param_offload`` and ``optimizer_offload`` on for the actor (and
   ``param_offload`` for the reference): completes, and the memory held after a step drops by at least 80%
   of what those flags should move off the GPU (actor shards + optimizer state + reference shards);
2b. ``offload_policy``: the same with FSDP2's CPUOffloadPolicy (``fsdp_config.offload_policy``);
3. ``resume``: a run that stops after step N-1 with a checkpoint (``trainer.save_freq``), resumed by a
   second RLTrainer into the same directory, logs for step N what the uninterrupted run of check 1 logged
   (every metric but timings);
4. ``bf16``: during every forward (rollout prefill, log-probs, reference, update) the gathered parameters
   of the decoder layers are bf16 (plain tensors), while the sharded parameters, their gradients and the
   AdamW state stay fp32 (DTensor shards). For information it also says how far the rollout engine's
   log-probs of its samples are from the actor's forward over the same tokens (the step plan takes the
   former as the PPO ratio's old log-probs when an RL step makes several optimizer steps).

On the CPU (``--device cpu``) FSDP2 runs with gloo and no mixed precision by default: check 4 sets
``mixed_precision.param_dtype=bf16`` explicitly so the inspection still runs; the memory drop of check 2
cannot be measured (``skipped (cpu)``, after the run itself must complete), and CPUOffloadPolicy is refused
on the CPU by design (``skipped (cpu)``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

# ----------------------------------------------------------------------------------------------------------
# What is checked, in which order, with what limits
# ----------------------------------------------------------------------------------------------------------

RUN_ORDER = ("fsdp2", "bf16", "offload", "resume", "offload_policy")
"""the order checks run in: the most important first, so a spent time budget drops the least important"""
TABLE_ORDER = ("fsdp2", "offload", "offload_policy", "resume", "bf16")
TITLES = {
    "fsdp2": "1 fsdp2 GRPO steps",
    "offload": "2 param+optimizer offload",
    "offload_policy": "2b offload_policy",
    "resume": "3 checkpoint save+resume",
    "bf16": "4 bf16 mixed precision",
}
CUDA_ONLY_ROWS = ("offload", "offload_policy", "bf16")
"""rows that may say ``skipped (cpu)`` on the CPU (the memory drop of offloading, CPUOffloadPolicy, bf16)"""
TIME_LIMIT_S = {
    "prepare": 150,
    "fsdp2": 150,
    "bf16": 120,
    "offload": 180,
    "resume": 210,
    "offload_policy": 150,
}
"""seconds each worker may run on the GPU (import, model load and its runs included)"""
TOTAL_BUDGET_S = 450
"""the whole check on the GPU: a check that would start later than this is not run (its row says so)"""

OK, FAIL, SKIPPED_CPU = "ok", "FAIL", "skipped (cpu)"
FAULT_ENV = "VERL_GPU_CHECK_FAULT"
"""``<check>:raise``, ``:exit`` or ``:hang``: that check raises, its worker dies, or it hangs (tests of the guards)"""

# Qwen2-0.5B's shape (hidden 896, 24 layers, 14 heads of 64, 2 KV heads, MLP 4864, tied embeddings) and its
# embedding size: the tokenizer built here has exactly that many tokens (see build_tokenizer).
QWEN2_05B = {
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
}
QWEN2_VOCAB = 151936
TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
}
TINY_VOCAB = 1024


def run_sizes(tiny: bool) -> dict[str, int]:
    """Prompts per step, group size, response length, prompts per optimizer step, rows per micro-batch,
    steps of the runs."""
    if tiny:
        return {"prompts": 2, "n": 4, "response": 6, "mini": 1, "micro": 4, "steps": 2}
    return {"prompts": 8, "n": 4, "response": 32, "mini": 4, "micro": 8, "steps": 3}


# ----------------------------------------------------------------------------------------------------------
# Parent: start workers, collect rows, print and write the table
# ----------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and short runs (for the CPU)")
    parser.add_argument(
        "--workdir", default=None, help="where models, data and runs go (default: a temp dir)"
    )
    parser.add_argument(
        "--out", default=None, help="where the table goes (default: $OUT, else <workdir>/report)"
    )
    parser.add_argument(
        "--checks",
        default=",".join(RUN_ORDER),
        help=f"comma list of checks to run (default: {','.join(RUN_ORDER)})",
    )
    parser.add_argument(
        "--isolate",
        choices=("auto", "yes", "no"),
        default="auto",
        help="one worker process per check (auto: yes on cuda, no on cpu)",
    )
    parser.add_argument(
        "--budget", type=float, default=None, help=f"total seconds (default {TOTAL_BUDGET_S} on cuda)"
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the model, data and runs of a temp workdir (default: removed)",
    )
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def first_line(text: str) -> str:
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return lines[0].strip() if lines else ""


def exception_line(exc: BaseException) -> str:
    message = first_line(str(exc))
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args)
    started = time.monotonic()
    temporary = args.workdir is None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="verl-gpu-check-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    out = Path(args.out or os.environ.get("OUT") or workdir / "report").resolve()
    out.mkdir(parents=True, exist_ok=True)
    (workdir / "results").mkdir(exist_ok=True)
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    checks = [c for c in RUN_ORDER if c in args.checks.split(",")]
    unknown = set(args.checks.split(",")) - set(RUN_ORDER)
    if unknown:
        print(f"unknown checks: {sorted(unknown)}; choose from {','.join(RUN_ORDER)}", file=sys.stderr)
        return 2
    isolate = args.isolate == "yes" or (args.isolate == "auto" and args.device == "cuda")
    budget = args.budget if args.budget is not None else (TOTAL_BUDGET_S if args.device == "cuda" else 600.0)
    print(f"gpu_check: device={args.device} tiny={args.tiny} workdir={workdir} report={out}", flush=True)

    batches = [["prepare"], *[[c] for c in checks]] if isolate else [["prepare", *checks]]
    rows: dict[str, dict[str, Any]] = {}
    prepare: dict[str, Any] | None = None
    while batches:
        batch = batches.pop(0)
        if prepare is not None and prepare.get("status") != OK and batch != ["prepare"]:
            for name in batch:
                rows[name] = {
                    "status": FAIL,
                    "figures": f"not run: prepare failed ({prepare.get('figures')})",
                }
            continue
        left = budget - (time.monotonic() - started)
        limit = sum(TIME_LIMIT_S[name] for name in batch) if args.device == "cuda" else 600
        limit = min(limit, left)
        if limit < 20:
            for name in batch:
                rows[name] = {"status": FAIL, "figures": f"not run: the {budget:.0f} s budget was spent"}
            continue
        results = run_worker(args, batch, workdir, logs, limit)
        if "prepare" in batch:
            prepare = results.get("prepare") or {"status": FAIL, "figures": "no result"}
            print_environment(prepare)
        for name in batch:
            if name in results:
                rows[name] = results[name]
        missing = [name for name in batch if name not in results]
        if missing:
            # The worker died in the first missing check (or ran out of time there); the others get a new one.
            rows[missing[0]] = {"status": FAIL, "figures": results["__worker__"]}
            if missing[0] == "prepare":
                prepare = rows.pop("prepare")
                print_environment(prepare)
            if missing[1:]:
                batches.insert(0, missing[1:])
    if prepare is None:
        prepare = {"status": FAIL, "figures": "not run"}
    table = render_table(checks, rows)
    print()
    print(render_header(args, prepare, time.monotonic() - started))
    print(table, flush=True)
    report = {
        "device": args.device,
        "tiny": args.tiny,
        "seconds": round(time.monotonic() - started, 1),
        "environment": prepare.get("environment", {}),
        "model": prepare.get("model", {}),
        "prepare": prepare,
        "rows": [{"check": c, "title": TITLES[c], **rows[c]} for c in TABLE_ORDER if c in rows],
    }
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "gpu_check.md").write_text(render_header(args, prepare, report["seconds"]) + "\n\n" + table + "\n")
    print(f"table written to {out / 'gpu_check.md'} and {out / 'gpu_check.json'}; worker logs in {logs}")
    if temporary and not args.keep:  # the model and checkpoints take GBs; the results and report stay
        for path in workdir.iterdir():
            if path.is_dir() and path.name not in ("results", "report"):
                shutil.rmtree(path, ignore_errors=True)
    failed = prepare.get("status") != OK or any(r["status"] == FAIL for r in rows.values())
    return 1 if failed else 0


def run_worker(
    args: argparse.Namespace, batch: list[str], workdir: Path, logs: Path, limit: float
) -> dict[str, Any]:
    """One worker process over ``batch``; returns the results it wrote, and ``__worker__``: how it ended."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", ",".join(batch)]
    command += ["--device", args.device, "--workdir", str(workdir)]
    if args.tiny:
        command.append("--tiny")
    log_path = logs / f"{'+'.join(batch)}.log"
    print(
        f"[{time.strftime('%H:%M:%S')}] {', '.join(batch)} (limit {limit:.0f} s, log {log_path.name})",
        flush=True,
    )
    for name in batch:
        (workdir / "results" / f"{name}.json").unlink(missing_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            code = proc.wait(timeout=limit)
            ending = f"worker exited with code {code}" if code else ""
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the worker and anything it started (its own session)
            proc.wait()
            ending = f"timed out after {limit:.0f} s"
        except BaseException:  # Ctrl-C: the worker is in its own session, so it must be stopped here
            os.killpg(proc.pid, 9)
            raise
    results: dict[str, Any] = {}
    for name in batch:
        path = workdir / "results" / f"{name}.json"
        if path.exists():
            results[name] = json.loads(path.read_text())
            print(f"    {name}: {results[name]['status']}  {results[name].get('figures', '')}", flush=True)
    if not ending and len(results) < len(batch):
        ending = "worker ended without writing its result"
    tail = last_error_line(log_path)
    results["__worker__"] = f"{ending}: {tail}" if tail else ending
    if any(name not in results for name in batch):  # a check has no result: show the end of its log
        print(f"    {results['__worker__']} ({time.monotonic() - started:.0f} s); log tail:", flush=True)
        for line in log_path.read_text(errors="replace").splitlines()[-15:]:
            print(f"      {line}")
    return results


def last_error_line(log_path: Path) -> str:
    """The last line of a log, after its last check started, that looks like an error (an exception, a
    CUDA/NCCL message), else ''."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    starts = [i for i, line in enumerate(lines) if line.startswith("=== ")]
    lines = lines[starts[-1] + 1 :] if starts else lines
    markers = ("Error", "error", "Exception", "Killed", "Segmentation", "NCCL", "CUDA")
    for line in reversed(lines):
        if any(m in line for m in markers):
            return line.strip()[:300]
    return ""


def print_environment(prepare: dict[str, Any]) -> None:
    env = prepare.get("environment", {})
    if env:
        print("    " + ", ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    if prepare.get("status") != OK:
        print(f"    prepare: {prepare.get('status')} {prepare.get('figures')}", flush=True)


def render_header(args: argparse.Namespace, prepare: dict[str, Any], seconds: float) -> str:
    env = prepare.get("environment", {})
    model = prepare.get("model", {})
    lines = [
        f"verl FSDP2 check on {args.device}" + (" (tiny)" if args.tiny else "") + f", {seconds:.0f} s",
        "environment: " + (", ".join(f"{k}={v}" for k, v in env.items()) or "unknown"),
        "model: " + (", ".join(f"{k}={v}" for k, v in model.items()) or "not built"),
    ]
    if prepare.get("status") != OK:
        lines.append(f"prepare: {prepare.get('status')} {prepare.get('figures')}")
    return "\n".join(lines)


def render_table(checks: list[str], rows: dict[str, dict[str, Any]]) -> str:
    """A markdown table: check | status | figures (one row per check asked for)."""
    body = [
        (TITLES[c], rows[c]["status"], str(rows[c].get("figures", "")).replace("|", "\\|"))
        for c in TABLE_ORDER
        if c in checks
    ]
    widths = [max(len(r[i]) for r in [("check", "status", "figures"), *body]) for i in range(2)]
    lines = [
        f"| {'check'.ljust(widths[0])} | {'status'.ljust(widths[1])} | figures |",
        f"|{'-' * (widths[0] + 2)}|{'-' * (widths[1] + 2)}|---------|",
    ]
    lines += [f"| {t.ljust(widths[0])} | {s.ljust(widths[1])} | {f} |" for t, s, f in body]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------
# Worker: one or more checks in this process, each guarded
# ----------------------------------------------------------------------------------------------------------


def worker_main(args: argparse.Namespace) -> int:
    if args.device == "cuda":
        # cuBLAS needs this before CUDA starts to run deterministically; the resume check compares two runs.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.device == "cuda":
        import torch

        # Deterministic kernels where torch has them (a warning where not): check 3 compares a resumed run
        # with an uninterrupted one, which other kernels' run-to-run noise would blur.
        torch.use_deterministic_algorithms(True, warn_only=True)
    ctx = Context(args)
    fault = os.environ.get(FAULT_ENV, "")
    for name in args.worker.split(","):
        started = time.monotonic()
        print(f"=== {name}", flush=True)
        if fault == f"{name}:exit":
            os._exit(3)
        if fault == f"{name}:hang":
            time.sleep(10**6)
        try:
            if fault == f"{name}:raise":
                raise RuntimeError(f"fault injected into {name}\n(a second line the row leaves out)")
            result = CHECKS[name](ctx)
        except BaseException as exc:  # noqa: BLE001 - every failure becomes the row's FAIL
            traceback.print_exc()
            result = {"status": FAIL, "figures": exception_line(exc), "traceback": traceback.format_exc()}
            if isinstance(exc, KeyboardInterrupt):
                raise
        result["seconds"] = round(time.monotonic() - started, 1)
        print(
            f"=== {name}: {result['status']} {result.get('figures', '')} ({result['seconds']} s)", flush=True
        )
        ctx.write_result(name, result)
        try:
            ctx.cleanup()
        except Exception:  # noqa: BLE001 - e.g. a CUDA error left by the check: the next one will say so
            traceback.print_exc()
    return 0


class Context:
    """What the checks of a worker share: settings, paths, and the prepared model and data."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.device = args.device
        self.tiny = args.tiny
        self.workdir = Path(args.workdir)
        self.sizes = run_sizes(args.tiny)

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    def write_result(self, name: str, result: dict[str, Any]) -> None:
        path = self.workdir / "results" / f"{name}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=2, default=str))
        tmp.replace(path)

    def result_of(self, name: str) -> dict[str, Any] | None:
        path = self.workdir / "results" / f"{name}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def prepared(self) -> dict[str, Any]:
        prepared = self.result_of("prepare")
        if prepared is None or prepared.get("status") != OK:
            raise RuntimeError("the model and data were not prepared")
        return prepared

    def cleanup(self) -> None:
        import gc

        import torch

        gc.collect()
        if self.cuda and torch.cuda.is_available():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()


# ---------------------------------------------------------------------------------------- prepare


def build_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer with Qwen2's pre-tokenizer, ChatML template and exactly ``vocab_size``
    tokens, made without data: the 3 special tokens, the 256 byte symbols, then every pair of byte symbols
    and then byte triples as merges, until the size is reached (Qwen2-0.5B's 151,936 fits: 65,536 pairs +
    86,141 triples). Its splits mean nothing, which a random-initialised model does not mind; what matters
    is the embedding and LM-head size, and that every id a model samples decodes."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from verl.models.tiny import SPECIAL_TOKENS, chatml_tokenizer, qwen2_byte_level

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *alphabet])}
    if vocab_size < len(vocab):
        raise ValueError(f"vocab_size {vocab_size} < {len(vocab)} (specials + byte symbols)")
    # Every pair of byte symbols, then byte triples (a pair + a symbol), as many as the size needs.
    candidates = itertools.chain(
        ((a, b) for a in alphabet for b in alphabet),
        ((a + b, c) for a in alphabet for b in alphabet for c in alphabet),
    )
    merges = list(itertools.islice(candidates, vocab_size - len(vocab)))
    for left, right in merges:
        vocab[left + right] = len(vocab)
    if len(vocab) < vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is more than byte pairs and triples give ({len(vocab)})")
    tok = qwen2_byte_level(Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False)))
    tok.add_special_tokens(SPECIAL_TOKENS)
    return chatml_tokenizer(tok, model_max_length=32768)


def environment() -> dict[str, Any]:
    import platform

    import torch
    import transformers

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch.version.cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        queries = {
            "gpu": lambda: torch.cuda.get_device_name(0),
            "gpu_count": torch.cuda.device_count,
            "gpu_memory_gib": lambda: round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
            "cudnn": torch.backends.cudnn.version,
            "nccl": lambda: ".".join(map(str, torch.cuda.nccl.version())),
            "bf16_supported": torch.cuda.is_bf16_supported,
        }
        for key, query in queries.items():
            try:
                env[key] = query()
            except Exception as exc:  # noqa: BLE001 - a version that cannot be read is no reason to stop
                env[key] = f"? ({type(exc).__name__})"
    return env


def check_prepare(ctx: Context) -> dict[str, Any]:
    """The model directory (random-initialised Qwen2, fp32 safetensors) and the arithmetic task's files."""
    import torch
    from transformers import AutoModelForCausalLM

    from verl.data import write_arithmetic_dataset
    from verl.models.tiny import tiny_model_config

    env = environment()
    if ctx.cuda and not torch.cuda.is_available():
        return {"status": FAIL, "figures": "no CUDA device visible to torch", "environment": env}
    vocab = TINY_VOCAB if ctx.tiny else QWEN2_VOCAB
    sizes = TINY if ctx.tiny else QWEN2_05B
    model_dir = ctx.workdir / ("model-tiny" if ctx.tiny else "model-qwen2-0.5b-random")
    tokenizer = build_tokenizer(vocab)
    config = tiny_model_config(tokenizer, arch="qwen2", **sizes)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)  # fp32, on the CPU
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.bos_token_id = None
    model_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    n_params = sum(p.numel() for p in model.parameters())
    dtype = str(next(model.parameters()).dtype)
    del model
    train, test = write_arithmetic_dataset(ctx.workdir / "data", max_operand=30, holdout_frac=0.2, seed=0)
    model_info = {
        "arch": "Qwen2ForCausalLM (random init)",
        **{k: v for k, v in sizes.items() if k != "rms_norm_eps"},
        "vocab": f"{len(tokenizer)} (tokenizer built offline = embedding rows)",
        "params": f"{n_params / 1e6:.1f}M",
        "weights": dtype,
    }
    return {
        "status": OK,
        "figures": f"{n_params / 1e6:.1f}M params, vocab {len(tokenizer)}",
        "environment": env,
        "model": model_info,
        "model_dir": str(model_dir),
        "train_file": str(train),
        "test_file": str(test),
    }


# ---------------------------------------------------------------------------------------- RL runs


def score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """A reward that differs between the samples of a group (a random model never solves the task), so
    GRPO's advantages, the policy loss and the gradients are not zero; deterministic in the text."""
    return (sum(map(ord, solution_str)) % 7) / 6.0


def rl_overrides(ctx: Context, run_dir: Path, steps: int, *extra: str) -> list[str]:
    prepared = ctx.prepared()
    s = ctx.sizes
    return [
        f"data.train_files={prepared['train_file']}",
        f"data.train_batch_size={s['prompts']}",
        "data.max_prompt_length=64",
        f"data.max_response_length={s['response']}",
        f"actor_rollout_ref.model.path={prepared['model_dir']}",
        "actor_rollout_ref.actor.strategy=fsdp2",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={s['mini']}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={s['micro']}",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.optim.lr=1e-5",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        "actor_rollout_ref.rollout.name=fast",
        f"actor_rollout_ref.rollout.n={s['n']}",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.val_before_train=false",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={run_dir}",
        f"trainer.device={ctx.device}",
        f"trainer.torch_threads={4 if ctx.cuda else 1}",
        "prepare.enable=false",
        *extra,
    ]


class RLRun:
    """One RLTrainer.fit() with the memory held after each step recorded; ``trainer`` and ``worker`` (the
    in-process actor/rollout/ref worker) stay for inspection until ``close``."""

    def __init__(self, ctx: Context, run_dir: Path, steps: int, *extra: str, before_fit: Any = None) -> None:
        import torch

        from verl.config import load_config
        from verl.trainer.rl_trainer import RLTrainer

        self.ctx = ctx
        self.run_dir = run_dir
        self.config = load_config("grpo", rl_overrides(ctx, run_dir, steps, *extra))
        self.trainer = RLTrainer(self.config, compute_score=score)
        self.worker = self.trainer.controller.group("actor_rollout").workers[0]
        self.after_step: list[int] = []
        self.steps_run: list[int] = []
        train_step = self.trainer.train_step

        def recorded(step: int, prompts: Any, more: Any = None) -> dict[str, float]:
            metrics = train_step(step, prompts, more)
            self.steps_run.append(step)
            if ctx.cuda:
                torch.cuda.synchronize()
                self.after_step.append(torch.cuda.memory_allocated())
            return metrics

        self.trainer.train_step = recorded  # the loop calls self.train_step
        if before_fit is not None:
            before_fit(self)
        if ctx.cuda:
            torch.cuda.synchronize()
            self.loaded = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        started = time.monotonic()
        try:
            self.summary = self.trainer.fit()
        except BaseException:
            self.trainer.shutdown()  # the worker threads, before the next check of this process
            raise
        self.fit_seconds = time.monotonic() - started
        self.peak = torch.cuda.max_memory_allocated() if ctx.cuda else None
        self.metrics = metrics_by_step(run_dir)

    def close(self) -> None:
        self.trainer.shutdown()
        del self.trainer, self.worker
        self.ctx.cleanup()


def metrics_by_step(run_dir: Path) -> dict[int, dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {int(r["step"]): r for r in rows if "step" in r}


WALL_CLOCK_PREFIXES = ("timing_s/", "timing_per_token_ms/", "perf/")
"""verl.trainer.metrics.WALL_CLOCK_PREFIXES, written out: this parent process never imports torch"""


def non_timing(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if not k.startswith(WALL_CLOCK_PREFIXES)}


def loss_problems(metrics: dict[int, dict[str, Any]], steps: int) -> list[str]:
    """What is wrong with a run's losses: a missing step, a non-finite loss or gradient norm, a skipped
    optimizer step (non-finite gradients); [] when all is well."""
    problems = [f"step {s} not logged" for s in range(1, steps + 1) if s not in metrics]
    for step, row in sorted(metrics.items()):
        watched = {
            k: v for k, v in row.items() if k.startswith("actor/") and ("loss" in k or "grad_norm" in k)
        }
        if not any("loss" in k for k in watched):
            problems.append(f"step {step}: no actor loss logged")
        for key, value in watched.items():
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                problems.append(f"step {step}: {key}={value}")
        if row.get("actor/skipped_steps", 0):
            problems.append(
                f"step {step}: {row['actor/skipped_steps']} optimizer steps skipped (non-finite grads)"
            )
    return problems


def gib(n_bytes: float | None) -> str:
    return "n/a" if n_bytes is None else f"{n_bytes / 2**30:.2f} GiB"


def step_seconds(metrics: dict[int, dict[str, Any]]) -> tuple[float, float]:
    """(first step, median of the later ones) of ``timing_s/step``."""
    times = [metrics[s]["timing_s/step"] for s in sorted(metrics) if "timing_s/step" in metrics[s]]
    if not times:
        return math.nan, math.nan
    return times[0], statistics.median(times[1:] or times)


def _local(t: Any) -> Any:
    return t.to_local() if hasattr(t, "to_local") else t


def resident(worker: Any) -> dict[str, Any]:
    """Bytes and devices of what offloading should move: the actor's shards, its optimizer state and the
    reference's shards (this rank's parts)."""

    def summary(tensors: list[Any]) -> dict[str, Any]:
        local = [_local(t) for t in tensors]
        return {
            "bytes": sum(t.numel() * t.element_size() for t in local),
            "devices": sorted({str(t.device) for t in local}),
        }

    state = [
        v
        for s in worker.actor.optimizer.state.values()
        for v in s.values()
        if hasattr(v, "dim") and v.dim() > 0
    ]
    out = {
        "actor_params": summary(list(worker.actor_model.parameters())),
        "optimizer_state": summary(state),
    }
    if worker.ref_model is not None:
        out["ref_params"] = summary(list(worker.ref_model.parameters()))
    return out


def placement(res: dict[str, Any]) -> str:
    names = {"actor_params": "actor", "optimizer_state": "adam", "ref_params": "ref"}
    return ", ".join(
        f"{names[k]} {gib(v['bytes'])} on {'+'.join(v['devices']) or '-'}" for k, v in res.items()
    )


def run_summary(run: RLRun, steps: int) -> dict[str, Any]:
    first, later = step_seconds(run.metrics)
    last = run.metrics.get(max(run.metrics)) if run.metrics else {}
    return {
        "steps": sorted(run.metrics),
        "step_s_first": first,
        "step_s": later,
        "fit_s": round(run.fit_seconds, 1),
        "peak_allocated": run.peak,
        "loaded_allocated": getattr(run, "loaded", None),
        "after_step_allocated": run.after_step,
        "resident": resident(run.worker),
        "last_losses": {k: v for k, v in (last or {}).items() if k.startswith("actor/")},
        "problems": loss_problems(run.metrics, steps),
    }


def describe_run(s: dict[str, Any], ctx: Context) -> str:
    last = s["last_losses"]
    parts = [
        f"{len(s['steps'])} steps",
        f"step {s['step_s']:.2f} s (first {s['step_s_first']:.2f} s)",
        f"pg_loss {last.get('actor/pg_loss', float('nan')):.4g}",
        f"kl_loss {last.get('actor/kl_loss', float('nan')):.3g}",
        f"grad_norm {last.get('actor/grad_norm', float('nan')):.3g}",
        f"ppo_kl {last.get('actor/ppo_kl', float('nan')):.3g}",
    ]
    if ctx.cuda:
        parts.append(f"max_memory_allocated {gib(s['peak_allocated'])}")
        after = s["after_step_allocated"]
        parts.append(f"after step {gib(after[-1] if after else None)}")
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------- check 1


def check_fsdp2(ctx: Context) -> dict[str, Any]:
    steps = ctx.sizes["steps"]
    run = RLRun(ctx, ctx.workdir / "runs" / "fsdp2", steps)
    try:
        s = run_summary(run, steps)
    finally:
        run.close()
    status = OK if not s["problems"] else FAIL
    figures = describe_run(s, ctx) if not s["problems"] else "; ".join(s["problems"][:3])
    return {"status": status, "figures": figures, "run": s, "run_dir": str(ctx.workdir / "runs" / "fsdp2")}


# ---------------------------------------------------------------------------------------- check 2 / 2b

OFFLOAD_FLAGS = (
    "actor_rollout_ref.actor.fsdp_config.param_offload=true",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
    "actor_rollout_ref.ref.fsdp_config.param_offload=true",
)
OFFLOAD_POLICY_FLAGS = (
    "actor_rollout_ref.actor.fsdp_config.offload_policy=true",
    "actor_rollout_ref.ref.fsdp_config.offload_policy=true",
)


def baseline(ctx: Context) -> dict[str, Any]:
    """Check 1's run (memory after a step without offloading), or a short one of its own."""
    done = ctx.result_of("fsdp2")
    if done is not None and done.get("run", {}).get("after_step_allocated"):
        return done["run"]
    run = RLRun(ctx, ctx.workdir / "runs" / "offload-baseline", 1)
    try:
        return run_summary(run, 1)
    finally:
        run.close()


def offload_row(ctx: Context, name: str, flags: tuple[str, ...]) -> dict[str, Any]:
    steps = ctx.sizes["steps"] if name == "offload" else min(2, ctx.sizes["steps"])
    run = RLRun(ctx, ctx.workdir / "runs" / name, steps, *flags)
    try:
        s = run_summary(run, steps)
    finally:
        run.close()
    if s["problems"]:
        return {"status": FAIL, "figures": "; ".join(s["problems"][:3]), "run": s}
    if not ctx.cuda:
        figures = f"{len(s['steps'])} steps completed, finite losses; the GPU memory drop needs CUDA"
        return {"status": SKIPPED_CPU, "figures": figures, "run": s}
    return {**offload_verdict(s, baseline(ctx)), "run": s}


def offload_verdict(s: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """ok when the memory held right after a step dropped by at least 80% of what offloading should move off
    the GPU: the baseline run's actor shards, AdamW state and reference shards."""
    without, with_ = base["after_step_allocated"][-1], s["after_step_allocated"][-1]
    expected = sum(v["bytes"] for v in base["resident"].values())
    drop = without - with_
    status = OK if drop >= 0.8 * expected else FAIL
    figures = (
        f"after step {gib(with_)} vs {gib(without)} without offload (drop {gib(drop)}, expected >= 80% of "
        f"{gib(expected)}); peak {gib(s['peak_allocated'])} vs {gib(base['peak_allocated'])}; step "
        f"{s['step_s']:.2f} s vs {base['step_s']:.2f} s; after the run: {placement(s['resident'])}"
    )
    return {"status": status, "figures": figures, "baseline": base}


def check_offload(ctx: Context) -> dict[str, Any]:
    return offload_row(ctx, "offload", OFFLOAD_FLAGS)


def check_offload_policy(ctx: Context) -> dict[str, Any]:
    if not ctx.cuda:
        return {"status": SKIPPED_CPU, "figures": "CPUOffloadPolicy is refused on the CPU by design"}
    return offload_row(ctx, "offload_policy", OFFLOAD_POLICY_FLAGS)


# ---------------------------------------------------------------------------------------- check 3


def compare_metrics(expected: dict[str, Any], got: dict[str, Any]) -> tuple[bool, float, list[str]]:
    """(identical, largest relative difference, differences beyond 1e-4 relative) over non-timing metrics."""
    expected, got = non_timing(expected), non_timing(got)
    problems = [f"{k} missing after resume" for k in sorted(set(expected) - set(got))]
    problems += [f"{k} only after resume" for k in sorted(set(got) - set(expected))]
    worst = 0.0
    identical = not problems
    for key in sorted(set(expected) & set(got)):
        a, b = expected[key], got[key]
        if a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)):
            continue
        identical = False
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
            problems.append(f"{key}: {a!r} vs {b!r}")
            continue
        rel = abs(a - b) / max(abs(a), abs(b), 1e-6)
        worst = max(worst, rel)
        if rel > 1e-4:
            problems.append(f"{key}: {a:.6g} uninterrupted vs {b:.6g} resumed")
    return identical, worst, problems


def check_resume(ctx: Context) -> dict[str, Any]:
    from verl.workers.engine.sharded_checkpoint import SHARDED_DIR

    steps = ctx.sizes["steps"]
    stop = steps - 1
    reference = ctx.result_of("fsdp2")
    ref_dir = ctx.workdir / "runs" / "fsdp2"
    source = "check 1's run"
    if reference is None or reference.get("status") != OK or steps not in metrics_by_step(ref_dir):
        ref_dir, source = ctx.workdir / "runs" / "resume-uninterrupted", "its own uninterrupted run"
        RLRun(ctx, ref_dir, steps).close()
    expected = metrics_by_step(ref_dir)[steps]

    run_dir = ctx.workdir / "runs" / "resume"
    first = RLRun(ctx, run_dir, stop, f"trainer.save_freq={stop}")
    first.close()
    part = run_dir / f"global_step_{stop}" / "actor"
    layout = "DCP shards" if (part / SHARDED_DIR / ".metadata").is_file() else "NO DCP shards"
    second = RLRun(ctx, run_dir, steps)
    ran = list(second.steps_run)
    second.close()
    if ran != [steps]:
        return {
            "status": FAIL,
            "figures": f"the second run ran steps {ran}, not only step {steps}: no resume",
        }
    got = metrics_by_step(run_dir)[steps]
    identical, worst, problems = compare_metrics(expected, got)
    n = len(non_timing(expected))
    save_s = metrics_by_step(run_dir).get(stop, {}).get("timing_s/save_checkpoint")
    saved = f"saved at step {stop} ({layout}" + (f", {save_s:.1f} s)" if save_s is not None else ")")
    if identical:
        figures = f"{saved}, resumed: step {steps} identical to {source} ({n} metrics, bit for bit)"
        return {"status": OK, "figures": figures}
    if not problems:
        figures = (
            f"{saved}, resumed: step {steps} matches {source} within 1e-4 relative, not bit for bit "
            f"(largest relative difference {worst:.2g} over {n} metrics)"
        )
        return {"status": OK, "figures": figures}
    figures = f"{saved}, resumed: step {steps} differs from {source}: " + "; ".join(problems[:3])
    return {"status": FAIL, "figures": figures, "differences": problems}


# ---------------------------------------------------------------------------------------- check 4


def dtypes(names: Any) -> str:
    short = {"torch.bfloat16": "bf16", "torch.float32": "fp32", "torch.float16": "fp16"}
    return "/".join(sorted(short.get(n, n) for n in names))


def check_bf16(ctx: Context) -> dict[str, Any]:
    """Hooks on the first decoder layer's q_proj of the actor and of the reference record the weight each
    forward sees (FSDP2's pre-forward hook of the layer has gathered it by then); afterwards the sharded
    parameters, their gradients and AdamW's state are read from the worker."""
    import torch

    seen: dict[str, list[tuple[str, bool]]] = {"actor": [], "ref": []}
    inputs: set[str] = set()

    def install(run: RLRun) -> None:
        for role, model in (("actor", run.worker.actor_model), ("ref", run.worker.ref_model)):
            if model is None:
                continue
            layer = model.model.layers[0]

            def hook(module: Any, args: Any, role: str = role) -> None:
                w = module.weight
                seen[role].append((str(w.dtype), hasattr(w, "to_local")))
                if args and torch.is_tensor(args[0]):
                    inputs.add(str(args[0].dtype))

            layer.self_attn.q_proj.register_forward_pre_hook(hook)

    extra = []
    if not ctx.cuda:  # the CPU's default is no mixed precision: ask for bf16 to inspect the same machinery
        extra = [
            "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
            "actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=bf16",
        ]
    run = RLRun(ctx, ctx.workdir / "runs" / "bf16", 1, *extra, before_fit=install)
    try:
        from verl.workers.engine.fsdp import fsdp_modules

        worker = run.worker
        roles = {
            "actor": (worker.actor_model, worker.actor.scorer),
            "ref": (worker.ref_model, worker.ref_scorer),
        }
        # Parameters a unit left gathered after the run (FSDP2 may keep a root's for the next backward): said,
        # then resharded, so that what is read below is the shards.
        left = {
            r: sum(not hasattr(p, "to_local") for p in m.parameters()) for r, (m, _) in roles.items() if m
        }
        for _, scorer in roles.values():
            for unit in fsdp_modules(scorer) if scorer is not None else []:
                unit.reshard()
        params = list(run.worker.actor_model.parameters())
        shard_dtypes = {str(p.dtype) for p in params}
        shard_dtensor = all(hasattr(p, "to_local") for p in params)
        grad_dtypes = {str(p.grad.dtype) for p in params if p.grad is not None}
        state = [
            v
            for s in run.worker.actor.optimizer.state.values()
            for v in s.values()
            if hasattr(v, "dim") and v.dim()
        ]
        state_dtypes = {str(v.dtype) for v in state}
        ref_shards = (
            {str(p.dtype) for p in run.worker.ref_model.parameters()} if run.worker.ref_model else set()
        )
        problems = loss_problems(run.metrics, 1)
        gap = rollout_gap(ctx, run)
    finally:
        run.close()
    gathered = {role: sorted({d for d, _ in calls}) for role, calls in seen.items()}
    gathered_dtensor = any(is_dt for calls in seen.values() for _, is_dt in calls)
    bf16, fp32 = "torch.bfloat16", "torch.float32"
    if not seen["actor"]:
        problems.append("no forward of the actor's layers was seen")
    if gathered["actor"] != [bf16] or (seen["ref"] and gathered["ref"] != [bf16]):
        problems.append(f"gathered weights {gathered}, expected bf16")
    if gathered_dtensor:
        problems.append("a forward saw a sharded (DTensor) weight: not gathered")
    if shard_dtypes != {fp32} or not shard_dtensor:
        problems.append(f"shards {sorted(shard_dtypes)} (DTensor: {shard_dtensor}), expected fp32 DTensor")
    if ref_shards and ref_shards != {fp32}:
        problems.append(f"reference shards {sorted(ref_shards)}, expected fp32")
    if not state or state_dtypes != {fp32}:
        problems.append(f"AdamW state {sorted(state_dtypes) or 'empty'}, expected fp32")
    if grad_dtypes - {fp32}:
        problems.append(f"sharded gradients {sorted(grad_dtypes)}, expected fp32")
    figures = (
        f"gathered q_proj weight {dtypes(gathered['actor'])} in {len(seen['actor'])} actor and "
        f"{len(seen['ref'])} ref forwards (layer input {dtypes(inputs)}); shards {dtypes(shard_dtypes)} "
        f"DTensor={shard_dtensor}, ref shards {dtypes(ref_shards) or '-'}, grads {dtypes(grad_dtypes) or 'freed'}, "
        f"AdamW state {dtypes(state_dtypes)} ({len(state)} tensors)"
    )
    figures += f"; {gap}"
    if any(left.values()):
        figures += f"; still gathered after the run: {', '.join(f'{r} {n} params' for r, n in left.items())}"
    if not ctx.cuda:
        figures += "; cpu: param_dtype=bf16 set explicitly (the CUDA default is checked on a GPU)"
    if problems:
        return {"status": FAIL, "figures": "; ".join(problems[:3]) + " | " + figures}
    return {"status": OK, "figures": figures}


def rollout_gap(ctx: Context, run: RLRun) -> str:
    """How far the rollout engine's log-probs of its own samples are from the actor's forward pass over the
    same tokens (for information: the step plan uses the former as the PPO ratio's old log-probs, which is
    exact only when both compute alike, e.g. in fp32 on a CPU)."""
    import torch

    trainer, worker = run.trainer, run.worker
    items = [trainer.train_dataset[i] for i in range(ctx.sizes["prompts"])]
    prompts = trainer._collate(items).repeat(ctx.sizes["n"], interleave=True)
    out = worker.generate_sequences(prompts)
    actor = worker.compute_log_prob(out).batch["old_log_probs"]
    mask = out.batch["response_mask"].bool()
    diff = (out.batch["rollout_log_probs"].float() - actor.float())[mask].abs()
    if not len(diff):
        return "rollout vs actor log-probs: no response tokens"
    return (
        f"rollout vs actor log-probs of the same {len(diff)} tokens: max abs diff {diff.max().item():.3g}, "
        f"mean {diff.mean().item():.3g}{' (bit-identical)' if torch.all(diff == 0) else ''}"
    )


CHECKS = {
    "prepare": check_prepare,
    "fsdp2": check_fsdp2,
    "offload": check_offload,
    "offload_policy": check_offload_policy,
    "resume": check_resume,
    "bf16": check_bf16,
}


if __name__ == "__main__":
    sys.exit(main())
