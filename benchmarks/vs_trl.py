"""verl against TRL's GRPOTrainer: one GRPO step, side by side, on the same model, prompts and settings.

    python benchmarks/vs_trl.py --models 4m,smollm2 [--steps 8] [--warmup 2] [--out vs_trl.json]
    python benchmarks/vs_trl.py --models 4m --trl-rows default,fp32-nogc      # more TRL configurations
    python benchmarks/vs_trl.py --models 4m --ours-override trainer.torch_threads=2 --trl-arg bf16=false

Needs TRL (``python -m pip install -c constraints-cpu.txt trl==1.16.0``; it adds datasets and pandas and
leaves torch and transformers alone) and, for ``smollm2``, the bench's SmolLM2 packages (benchmarks/README.md).

Both sides run GRPO steps that each generate and update once: 8 prompts x 8 samples (``--prompts``,
``--samples``), up to 32 new tokens on ``4m`` and 64 on ``smollm2`` (``--response-length``), sampling at
temperature 1.0, one optimizer step per RL step, no KL term, no reference model. The prompts are the default
recipe's ``a+b=`` problems (its arithmetic task), chat-templated by the model's tokenizer on both sides and in
the same order (no shuffling: step k trains on rows 8k..8k+7 of the same file; the child processes report the
first step's prompt token ids and the table says whether they are identical). The reward is the same Python
function on both sides (``benchmarks/vs_trl_reward.py``: partial credit on the last integer, so that groups
have signal).

verl's side is ``RLTrainer`` built from the default recipe (``verl run --config grpo``: what
``verl/bench/step.py`` runs) with only the model, the data, the batch sizes, the response length and
the reward function given; its threads, engine, attention and precision are the recipe's (``--ours-override``
changes any key). TRL's side is ``GRPOTrainer`` on CPU (``use_cpu``, ``report_to=none``, no vLLM: transformers'
``generate``) with ``per_device_train_batch_size`` = prompts x samples, ``num_generations`` = samples,
``gradient_accumulation_steps=1``, ``num_iterations=1``, ``steps_per_generation=1``, ``beta=0``, and verl's
optimizer settings copied from the resolved config (lr, warm-up, weight decay, betas, gradient clip, clip
ratio, temperature; ``loss_type=dapo`` is verl's ``token-mean``); everything else is TRL 1.16's default,
including ``bf16=True`` (GRPOConfig turns it on whenever ``fp16`` is off, on a CPU too: accelerate then runs
every forward under bf16 autocast, the weights stay fp32) and ``gradient_checkpointing=True``. ``--trl-rows``
adds TRL configurations (:data:`TRL_ROWS`); ``--trl-arg`` changes any GRPOConfig field on every TRL row.

Each side runs in its own child process (``python benchmarks/vs_trl.py --child``), one after the other, so
that thread settings cannot leak: verl sets its own (the recipe's ``trainer.torch_threads``), TRL's side
keeps torch's default. Per step: wall seconds of the whole step (generation + reward + update; verl: around
``train_step``, TRL: from ``on_step_begin`` to ``on_step_end`` of a TrainerCallback, which excludes the
dataloader fetch and the logging that follow), the generation seconds (verl: ``timing_s/gen``; TRL: its
``_generate_single_turn`` call, timed by wrapping it on the instance), and the completion tokens (every real
token up to and including EOS, no padding: verl's ``response_length/mean`` x samples, from ``response_mask``;
TRL: the ``completion_ids`` its reward function receives, already cut after the first EOS, checked against
its logged ``completions/mean_length``). tokens/s = completion tokens / step seconds; the table shows medians
over ``--steps`` timed steps after ``--warmup`` untimed ones, and the ratio of verl's tokens/s to each TRL
row's. ``others %`` is the CPU share other processes took during the timed steps (as in ``verl bench``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

REWARD_FILE = Path(__file__).resolve().with_name("vs_trl_reward.py")

RESPONSE_LENGTHS = {"tiny": 32, "4m": 32, "30m": 32, "smollm2": 64}
"""max new tokens per model when ``--response-length`` is not given (the issue's sizes)"""

TRL_ROWS: dict[str, dict[str, Any]] = {
    "default": {},
    "fp32": {"bf16": False},
    "nogc": {"gradient_checkpointing": False},
    "fp32-nogc": {"bf16": False, "gradient_checkpointing": False},
}
"""TRL configurations ``--trl-rows`` can name: GRPOConfig fields on top of TRL's defaults and the shared
settings. ``default`` is TRL 1.16 as it comes (on a CPU: bf16 autocast, gradient checkpointing on)."""

LOSS_TYPES = {"token-mean": "dapo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum-norm": "dr_grpo"}
"""verl's ``loss_agg_mode`` -> TRL's ``loss_type`` with the same normalisation (dapo: by the generation batch's
completion tokens)"""


@dataclass(frozen=True)
class Settings:
    """What both sides share."""

    prompts: int = 8
    samples: int = 8
    response_length: int = 32
    warmup: int = 2
    steps: int = 8

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps

    @property
    def batch(self) -> int:
        """completions per step"""
        return self.prompts * self.samples

    @property
    def pool(self) -> int:
        """prompts used over the run: every step gets new ones, no epoch wraps"""
        return self.prompts * self.total_steps


# ---------------------------------------------------------------------------------------------- helpers


def parse_value(text: str) -> Any:
    """A command-line value: JSON when it parses (numbers, true/false/null, lists, objects), Python's
    True/False/None, else the string itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return {"True": True, "False": False, "None": None}.get(text, text)


def parse_kv(items: Sequence[str], flag: str) -> dict[str, Any]:
    """``key=value`` strings -> a dict (values via :func:`parse_value`); a malformed item is a SystemExit."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"{flag} {item!r}: expected key=value")
        out[key.strip()] = parse_value(value)
    return out


def median(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(statistics.median(kept)) if kept else None


def completion_tokens(completion_ids: Sequence[Sequence[int]]) -> int:
    """Real completion tokens of a generation batch as TRL hands it to a reward function: each row is already
    cut after its first EOS (EOS included, no padding), so the count is the sum of the row lengths."""
    return sum(len(ids) for ids in completion_ids)


def summarize(steps: Sequence[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Medians over the timed steps (those after ``warmup``): step and generation seconds, completion tokens,
    tokens/s (each step's tokens over its own seconds), and the spread of the step times."""
    timed = list(steps[warmup:])
    if not timed:
        raise ValueError(f"no timed steps: {len(steps)} steps ran, {warmup} of them warm-up")
    times = [s["step_s"] for s in timed]
    step_s = median(times)
    return {
        "timed_steps": len(timed),
        "step_s": step_s,
        "gen_s": median([s.get("gen_s") for s in timed]),
        "update_s": median([s.get("update_s") for s in timed]),
        "completion_tokens": median([s["completion_tokens"] for s in timed]),
        "tokens_per_s": median([s["completion_tokens"] / s["step_s"] for s in timed]),
        "mean_reward": median([s.get("mean_reward") for s in timed]),
        "spread_pct": 100 * (max(times) - min(times)) / step_s if step_s else None,
    }


class CpuShare:
    """The share of the machine's CPUs other processes used between ``start()`` and ``stop()``
    (:class:`verl.bench.measure.ContentionMeter`, started and stopped from callbacks)."""

    def __init__(self) -> None:
        from verl.bench.measure import ContentionMeter

        self.meter = ContentionMeter()
        self.others_pct: float | None = None

    def start(self) -> None:
        self.meter.__enter__()

    def stop(self) -> None:
        self.meter.__exit__(None, None, None)
        self.others_pct = self.meter.others_pct


def timed(fn: Any, seconds: list[float]) -> Any:
    """``fn``, appending the wall seconds of each call to ``seconds`` (also when it raises)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - start)

    return wrapper


def peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def read_rows(data_dir: str, count: int) -> list[dict[str, Any]]:
    """The first ``count`` rows of the task's train file: what verl's ``data.train_max_samples`` keeps."""
    import pyarrow.parquet as pq

    rows = pq.read_table(Path(data_dir) / "train.parquet").slice(0, count).to_pylist()
    if len(rows) < count:
        raise SystemExit(f"the train file has {len(rows)} rows, fewer than the {count} prompts the run needs")
    return rows


# ---------------------------------------------------------------------------------------------- verl's side


def ours_overrides(model_path: str, data_dir: str, s: Settings, out_dir: str) -> list[str]:
    """What verl's side gives on top of the default recipe: the model, the data (the first ``s.pool`` prompts,
    in file order), the batch sizes (one optimizer step per RL step), the response length, the shared reward.
    Not the threads, the engine, the attention or the precision: those stay the recipe's."""
    from verl.bench.common import prompt_width

    data = Path(data_dir)
    return [
        f"actor_rollout_ref.model.path={model_path}",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'test.parquet'}",
        f"data.train_max_samples={s.pool}",
        "data.val_max_samples=16",
        "data.shuffle=false",
        f"data.max_prompt_length={prompt_width(model_path, s.response_length)}",
        f"data.max_response_length={s.response_length}",
        f"data.train_batch_size={s.prompts}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={s.prompts}",
        f"actor_rollout_ref.rollout.n={s.samples}",
        f"custom_reward_function.path={REWARD_FILE}",
        "custom_reward_function.name=compute_score",
        f"trainer.default_local_dir={out_dir}",
        "trainer.logger=[]",
        "prepare.enable=false",
    ]


def ours_config(model_path: str, data_dir: str, s: Settings, out_dir: str, extra: Sequence[str] = ()) -> Any:
    from verl.bench.common import recipe_config

    return recipe_config([*ours_overrides(model_path, data_dir, s, out_dir), *extra])


def child_ours(spec: dict[str, Any]) -> dict[str, Any]:
    from verl.bench.step import step_runner
    from verl.trainer.rl_trainer import RLTrainer

    s = Settings(**spec["settings"])
    with tempfile.TemporaryDirectory(prefix="verl-vs-trl-") as out_dir:
        config = ours_config(spec["model_path"], spec["data_dir"], s, out_dir, spec["ours_overrides"])
        trainer = RLTrainer(config)
        try:
            prompt_ids = [trainer.train_dataset[i]["input_ids"].tolist() for i in range(s.prompts)]
            run = step_runner(trainer)
            share, steps = CpuShare(), []
            for i in range(s.total_steps):
                if i == s.warmup:
                    share.start()
                start = time.perf_counter()
                metrics = run()
                wall = time.perf_counter() - start
                steps.append(
                    {
                        "step_s": wall,
                        "gen_s": metrics.get("timing_s/gen"),
                        "update_s": metrics.get("timing_s/update_actor"),
                        # response_mask: 1 up to and including the first EOS, so this counts real tokens only
                        "completion_tokens": round(metrics["response_length/mean"] * s.batch),
                        "mean_reward": metrics.get("critic/score/mean"),
                        "skipped_backward_frac": metrics.get("actor/skipped_backward_frac"),
                        "timing_s": {k[9:]: v for k, v in metrics.items() if k.startswith("timing_s/")},
                    }
                )
            share.stop()
            actor = trainer.controller.group("actor_rollout").workers[0]
            compute = getattr(actor, "compute", None)  # the compute dtype the worker chose, where it has one
            info = {
                # the workers' count (this thread only drives: one OpenMP thread, verl.utils.threads)
                "torch_threads": trainer.threads.threads or "torch's default",
                "trainer.torch_threads": config.trainer.torch_threads,
                "threads_plan": getattr(getattr(trainer, "threads", None), "describe", lambda: None)(),
                "actor_compute": compute.describe("actor") if hasattr(compute, "describe") else None,
                "engine": config.actor_rollout_ref.rollout.name,
                "attn_implementation": config.actor_rollout_ref.model.attn_implementation,
                "torch_dtype": config.actor_rollout_ref.model.torch_dtype,
                "param_dtype": config.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype,
                "lr": config.actor_rollout_ref.actor.optim.lr,
                "loss_agg_mode": config.actor_rollout_ref.actor.loss_agg_mode,
                "skip_zero_advantage": config.actor_rollout_ref.actor.skip_zero_advantage,
                "share_prompts": config.actor_rollout_ref.model.share_prompts,
            }
        finally:
            trainer.shutdown()
    return {"steps": steps, "prompt_ids": prompt_ids, "others_pct": share.others_pct, "info": info}


# ---------------------------------------------------------------------------------------------- TRL's side


def trl_shared_args(config: Any, s: Settings) -> dict[str, Any]:
    """GRPOConfig fields that make TRL's step verl's: the batch geometry and verl's resolved optimizer, loss
    and sampling settings (``config`` is verl's side's config)."""
    actor = config.actor_rollout_ref.actor
    optim = actor.optim
    rollout = config.actor_rollout_ref.rollout
    loss_type = LOSS_TYPES.get(actor.loss_agg_mode)
    if loss_type is None:
        raise SystemExit(f"verl's loss_agg_mode {actor.loss_agg_mode!r} has no TRL loss_type here")
    warmup = optim.lr_warmup_steps if optim.lr_warmup_steps >= 0 else 0
    return {
        "use_cpu": True,
        "report_to": "none",
        "use_vllm": False,
        "per_device_train_batch_size": s.batch,
        "gradient_accumulation_steps": 1,
        "num_generations": s.samples,
        "num_iterations": 1,
        "steps_per_generation": 1,
        "max_completion_length": s.response_length,
        "temperature": float(rollout.temperature),
        "top_p": float(rollout.top_p),
        "top_k": max(int(rollout.top_k), 0),
        "beta": 0.0,
        "epsilon": float(actor.clip_ratio),
        "loss_type": loss_type,
        "scale_rewards": "group" if config.algorithm.norm_adv_by_std_in_grpo else "none",
        "learning_rate": float(optim.lr),
        **lr_schedule_args(optim),
        "warmup_steps": warmup,
        "weight_decay": float(optim.weight_decay),
        "adam_beta1": float(optim.betas[0]),
        "adam_beta2": float(optim.betas[1]),
        "max_grad_norm": float(actor.grad_clip),
        "max_steps": s.total_steps,
        "logging_steps": 1,
        "save_strategy": "no",
        "shuffle_dataset": False,
        "seed": int(config.trainer.seed),
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }


def lr_schedule_args(optim: Any) -> dict[str, Any]:
    """verl's LR schedule as GRPOConfig fields: constant after warm-up, or cosine down to ``min_lr_ratio``
    (transformers' ``cosine_with_min_lr``; its plain ``cosine`` decays to 0)."""
    if optim.lr_scheduler_type == "constant":
        return {"lr_scheduler_type": "constant_with_warmup"}
    if optim.lr_scheduler_type != "cosine":
        raise SystemExit(f"verl's lr_scheduler_type {optim.lr_scheduler_type!r} has no TRL schedule here")
    if not optim.min_lr_ratio:
        return {"lr_scheduler_type": "cosine"}
    return {
        "lr_scheduler_type": "cosine_with_min_lr",
        "lr_scheduler_kwargs": {"min_lr_rate": float(optim.min_lr_ratio)},
    }


def child_trl(spec: dict[str, Any]) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from benchmarks.vs_trl_reward import trl_reward

    s = Settings(**spec["settings"])
    rows = read_rows(spec["data_dir"], s.pool)
    dataset = Dataset.from_list(
        [{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"]} for r in rows]
    )
    tokens_per_call: list[int] = []

    def arithmetic_partial_credit(prompts, completions, completion_ids, ground_truth, **kwargs):
        tokens_per_call.append(completion_tokens(completion_ids))
        return trl_reward(completions, ground_truth)

    share = CpuShare()

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.begin = 0.0
            self.times: list[float] = []
            self.logs: list[dict[str, Any]] = []

        def on_step_begin(self, args, state, control, **kwargs):
            if len(self.times) == s.warmup:
                share.start()
            self.begin = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self.begin)
            if len(self.times) == s.total_steps:
                share.stop()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                self.logs.append(dict(logs))

    clock = StepClock()
    with tempfile.TemporaryDirectory(prefix="trl-vs-verl-") as out_dir:
        args = GRPOConfig(output_dir=out_dir, **spec["trl_args"])
        trainer = GRPOTrainer(
            model=spec["model_path"],
            reward_funcs=[arithmetic_partial_credit],
            args=args,
            train_dataset=dataset,
            callbacks=[clock],
        )
        prompt_ids = [
            list(ids) for ids in trainer._tokenize_prompts([r["prompt"] for r in rows[: s.prompts]])[0]
        ]
        gen_s: list[float] = []
        score_s: list[float] = []
        generate, generate_and_score = trainer._generate_single_turn, trainer._generate_and_score_completions

        trainer._generate_single_turn = timed(generate, gen_s)
        trainer._generate_and_score_completions = timed(generate_and_score, score_s)
        info = trl_info(trainer)
        trainer.train()
    n = len(clock.times)
    if not (len(gen_s) == len(score_s) == len(tokens_per_call) == n == s.total_steps):
        raise RuntimeError(
            f"expected {s.total_steps} steps with one generation each; got {n} steps, {len(gen_s)} generations, "
            f"{len(tokens_per_call)} reward calls"
        )
    steps = []
    for i in range(n):
        logged = clock.logs[i]["completions/mean_length"] * s.batch if i < len(clock.logs) else None
        steps.append(
            {
                "step_s": clock.times[i],
                "gen_s": gen_s[i],
                "gen_score_s": score_s[i],
                "update_s": clock.times[i] - score_s[i],
                "completion_tokens": tokens_per_call[i],
                "logged_completion_tokens": logged,
                "mean_reward": clock.logs[i].get("reward") if i < len(clock.logs) else None,
            }
        )
    mismatched = [
        i
        for i, st in enumerate(steps)
        if st["logged_completion_tokens"] is None
        or not math.isclose(st["logged_completion_tokens"], st["completion_tokens"], abs_tol=0.5)
    ]
    info["token_count_matches_log"] = not mismatched
    return {"steps": steps, "prompt_ids": prompt_ids, "others_pct": share.others_pct, "info": info}


def trl_info(trainer: Any) -> dict[str, Any]:
    """How a built GRPOTrainer will compute: threads, precision, autocast, attention, optimizer, loss."""
    import torch

    model, args = trainer.model, trainer.args
    return {
        "torch_threads": torch.get_num_threads(),
        "bf16": args.bf16,
        "gradient_checkpointing": args.gradient_checkpointing,
        "mixed_precision": str(trainer.accelerator.mixed_precision),
        # accelerate wraps the forward in autocast when mixed precision is on: generate() goes through it too
        "forward_autocast": getattr(model, "_original_forward", None) is not None,
        # the loss's forward passes run under accelerator.autocast(); generate() does not
        "loss_autocast": _autocast_dtype(trainer.accelerator),
        "param_dtype": str(next(model.parameters()).dtype),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "optim": str(args.optim),
        "loss_type": args.loss_type,
    }


def _autocast_dtype(accelerator: Any) -> str | None:
    """The dtype ``accelerator.autocast()`` computes CPU ops in, or None when it does not autocast."""
    import torch

    with accelerator.autocast():
        return str(torch.get_autocast_dtype("cpu")) if torch.is_autocast_enabled("cpu") else None


# ---------------------------------------------------------------------------------------------- running


def child_env() -> dict[str, str]:
    """The environment of a child process: this checkout first on ``PYTHONPATH``, the hub offline."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("HF_HUB_OFFLINE", "1")  # every model here is a local directory
    return env


def require_trl() -> str:
    """TRL's version; a SystemExit with the install command when it is missing."""
    try:
        import trl
    except ImportError:
        raise SystemExit(
            "TRL is not installed: python -m pip install -c constraints-cpu.txt trl==1.16.0"
        ) from None
    return trl.__version__


def run_child(spec: dict[str, Any], work: Path, timeout_s: float) -> dict[str, Any]:
    """One side in a fresh interpreter (its own threads, its own memory); its log is kept under ``work``."""
    tag = f"{spec['model']}-{spec['label']}"
    spec_path, result_path, log_path = (work / f"{tag}.{ext}" for ext in ("spec.json", "result.json", "log"))
    spec_path.write_text(json.dumps(spec))
    env = child_env()
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        str(spec_path),
        "--child-out",
        str(result_path),
    ]
    start = time.perf_counter()
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(
                cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, cwd=ROOT, env=env
            )
            code: int | str = proc.returncode
        except subprocess.TimeoutExpired:
            code = f"timed out after {timeout_s:.0f} s"
    wall = time.perf_counter() - start
    if code != 0 or not result_path.exists():
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-25:])
        return {"status": "error", "reason": f"exit {code}; log {log_path}:\n{tail}", "wall_s": wall}
    result = json.loads(result_path.read_text())
    result.update(status="ok", wall_s=wall, log=str(log_path))
    return result


def child_main(spec_path: str, out_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    result = child_ours(spec) if spec["side"] == "ours" else child_trl(spec)
    result["peak_rss_mb"] = peak_rss_mb()
    Path(out_path).write_text(json.dumps(result))
    return 0


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def render(rows: Sequence[dict[str, Any]]) -> str:
    head = (
        "| model | side | threads | step s | gen s | update s | completion tok/step | tok/s | ours/this "
        "| reward | others % | spread % | peak MB |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['model']} | {r['label']} | error: {r['reason'].splitlines()[0]} |")
            continue
        sm = r["summary"]
        lines.append(
            "| "
            + " | ".join(
                [
                    r["model"],
                    r["label"],
                    fmt(r["info"].get("torch_threads")),
                    fmt(sm["step_s"], 3),
                    fmt(sm["gen_s"], 3),
                    fmt(sm["update_s"], 3),
                    fmt(sm["completion_tokens"], 0),
                    fmt(sm["tokens_per_s"], 1),
                    "-" if r.get("ratio") is None else f"{r['ratio']:.2f}x",
                    fmt(sm["mean_reward"], 3),
                    fmt(r.get("others_pct"), 1),
                    fmt(sm["spread_pct"], 0),
                    fmt(r.get("peak_rss_mb"), 0),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--models", default="4m", help="comma list of bench models (verl/bench/models.py)")
    p.add_argument("--steps", type=int, default=8, help="timed steps per side (median over them)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--samples", type=int, default=8, help="samples per prompt (rollout.n / num_generations)")
    p.add_argument(
        "--response-length", type=int, default=None, help="max new tokens (default: 32; 64 for smollm2)"
    )
    p.add_argument("--sides", default="ours,trl", help="ours, trl or both (the order they run in)")
    p.add_argument(
        "--trl-rows", default="default", help=f"comma list of TRL configurations: {', '.join(TRL_ROWS)}"
    )
    p.add_argument(
        "--ours-override", action="append", default=[], metavar="KEY=VALUE", help="verl config key"
    )
    p.add_argument("--trl-arg", action="append", default=[], metavar="KEY=VALUE", help="GRPOConfig field")
    p.add_argument("--out", default=None, help="write every row (per-step figures too) as JSON here")
    p.add_argument(
        "--log-dir", default=None, help="keep the child processes' logs here (default: a temp dir)"
    )
    p.add_argument("--timeout-s", type=float, default=1800, help="limit per side")
    p.add_argument(
        "--retries",
        type=int,
        default=0,
        help="run a side again (up to this many times) when other processes took over 5%% of the CPUs during "
        "its timed steps; the least disturbed attempt is kept",
    )
    p.add_argument(
        "--idle-wait-s", type=float, default=60, help="wait up to this long for idle CPUs per side"
    )
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    return p


def plan_sides(sides: str, trl_rows: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(side, label, extra GRPOConfig fields) per row, in running order; unknown names are a SystemExit."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    rows = [r.strip() for r in trl_rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in TRL_ROWS]
    if unknown:
        raise SystemExit(f"--trl-rows: unknown {unknown}; choose from {', '.join(TRL_ROWS)}")
    for side in (x.strip() for x in sides.split(",") if x.strip()):
        if side == "ours":
            out.append(("ours", "verl", {}))
        elif side == "trl":
            out.extend(("trl", f"trl {row}", TRL_ROWS[row]) for row in rows)
        else:
            raise SystemExit(f"--sides: unknown side {side!r}; use ours and/or trl")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.child:
        return child_main(args.child, args.child_out)

    from verl.bench.common import load_average, machine_info, write_task_data
    from verl.bench.measure import BUSY_PCT, wait_for_idle
    from verl.bench.models import ModelUnavailable, default_specs, prepare_model

    trl_args = parse_kv(args.trl_arg, "--trl-arg")
    parse_kv(args.ours_override, "--ours-override")  # checked here, passed on as given
    plan = plan_sides(args.sides, args.trl_rows)
    trl_version = require_trl() if any(side == "trl" for side, _, _ in plan) else None
    specs = default_specs()
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in specs]
    if unknown:
        raise SystemExit(f"--models: unknown {unknown}; choose from {', '.join(specs)}")

    work = Path(args.log_dir or tempfile.mkdtemp(prefix="vs-trl-"))
    work.mkdir(parents=True, exist_ok=True)
    data_dir = work / "data"
    write_task_data(data_dir)
    rows: list[dict[str, Any]] = []
    machine = machine_info(0)
    machine.pop("torch_threads")
    machine["trl"] = trl_version
    machine["git"] = _git_state()
    print(
        f"machine: {machine['cpu']} ({machine['cpu_count']} CPUs), torch {machine['torch']}, "
        f"transformers {machine['transformers']}, trl {trl_version}; load {load_average()}; logs in {work}"
    )
    for name in names:
        try:
            model = prepare_model(specs[name])
        except ModelUnavailable as e:
            print(f"{name}: skipped ({e})")
            rows.append({"model": name, "label": "-", "status": "error", "reason": f"unavailable: {e}"})
            continue
        settings = Settings(
            prompts=args.prompts,
            samples=args.samples,
            response_length=args.response_length or RESPONSE_LENGTHS.get(name, 32),
            warmup=args.warmup,
            steps=args.steps,
        )
        with tempfile.TemporaryDirectory() as tmp:
            config = ours_config(str(model.path), str(data_dir), settings, tmp, args.ours_override)
        shared = trl_shared_args(config, settings)
        for side, label, extra in plan:
            spec = {
                "side": side,
                "label": label.replace(" ", "-"),
                "model": name,
                "model_path": str(model.path),
                "data_dir": str(data_dir),
                "settings": asdict(settings),
                "ours_overrides": list(args.ours_override),
                "trl_args": {**shared, **extra, **trl_args},
            }
            attempts = []
            for attempt in range(args.retries + 1):
                busy = wait_for_idle(args.idle_wait_s)
                load = load_average()
                again = (
                    f" (again: {attempts[-1]['others_pct']:.0f}% of the CPUs were busy elsewhere)"
                    if attempt
                    else ""
                )
                print(
                    f"{name} / {label}: {settings.total_steps} steps ({settings.warmup} warm-up){again} ...",
                    flush=True,
                )
                result = run_child(spec, work, args.timeout_s)
                result.update(busy_before_pct=busy, load_before=load)
                attempts.append(result)
                if result["status"] == "ok":
                    sm = summarize(result["steps"], settings.warmup)
                    print(
                        f"  step {sm['step_s']:.3f} s, {sm['tokens_per_s']:.1f} tok/s, others "
                        f"{fmt(result['others_pct'], 0)}% ({result['wall_s']:.0f} s in all)",
                        flush=True,
                    )
                else:
                    print(f"  failed: {result['reason']}", flush=True)
                if result["status"] != "ok" or (result["others_pct"] or 0.0) <= BUSY_PCT:
                    break
            result = least_disturbed(attempts)
            row = {"model": name, "label": label, "side": side, "settings": asdict(settings), **result}
            row["attempts_others_pct"] = [a.get("others_pct") for a in attempts]
            if side == "trl":
                row["trl_args"] = spec["trl_args"]
            if result["status"] == "ok":
                row["summary"] = summarize(result["steps"], settings.warmup)
            rows.append(row)
        _compare(rows, name)
    print()
    print(render(rows))
    _notes(rows)
    disturbed = [r for r in rows if r["status"] == "ok" and (r.get("others_pct") or 0.0) > BUSY_PCT]
    if disturbed:
        print(
            f"\nwarning: {len(disturbed)} row(s) ran while other processes took over {BUSY_PCT:g}% of the CPUs "
            "(others %): on 2 cores that slows a 2-thread run by far more than that share; rerun them on a quiet "
            "machine (or with --retries)"
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))
        print(f"\nJSON: {args.out}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def least_disturbed(attempts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The successful attempt during which other processes took the least CPU (the last attempt when none
    succeeded)."""
    ok = [a for a in attempts if a["status"] == "ok"]
    if not ok:
        return attempts[-1]
    return min(ok, key=lambda a: math.inf if a.get("others_pct") is None else a["others_pct"])


def _compare(rows: list[dict[str, Any]], model: str) -> None:
    """Ratios (verl tokens/s over each TRL row's) and whether both sides' first prompts were the same tokens."""
    mine = [r for r in rows if r["model"] == model and r["status"] == "ok"]
    ours = next((r for r in mine if r["side"] == "ours"), None)
    for r in mine:
        if r["side"] != "trl" or ours is None:
            continue
        r["ratio"] = ours["summary"]["tokens_per_s"] / r["summary"]["tokens_per_s"]
        r["step_ratio"] = r["summary"]["step_s"] / ours["summary"]["step_s"]
        r["same_prompt_ids"] = r["prompt_ids"] == ours["prompt_ids"]


def _notes(rows: Sequence[dict[str, Any]]) -> None:
    for r in rows:
        if r["status"] != "ok":
            continue
        info = r["info"]
        bits = [f"{k}={v}" for k, v in info.items() if k != "threads_plan"]
        if r.get("same_prompt_ids") is not None:
            bits.append(f"same prompt token ids as verl: {'yes' if r['same_prompt_ids'] else 'NO'}")
        skipped = [s.get("skipped_backward_frac") for s in r["steps"][r["settings"]["warmup"] :]]
        if any(v is not None for v in skipped):
            bits.append(f"backward skipped (zero advantage) median {median(skipped):.2f}")
        print(f"- {r['model']} / {r['label']}: " + ", ".join(bits))


def _git_state() -> str | None:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return None
    return head.stdout.strip() + (" (uncommitted changes)" if dirty.stdout.strip() else "")


if __name__ == "__main__":
    sys.exit(main())
