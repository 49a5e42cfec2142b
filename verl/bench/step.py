"""(c) One full GRPO step: its time, tokens/s, and where the time goes.

``RLTrainer`` with the default recipe as it is (16 prompts x 8 samples, its response length and update
sizes) on the arithmetic task, pointed at the bench model, once per rollout engine. Each run is one
``train_step``; the rows report the medians of its ``timing_s/*`` metrics (``gen``, ``reward``,
``old_log_prob``, ``adv``, ``update_actor``, ``step``) and of ``perf/throughput`` (prompt + response
tokens per second of the whole step). Validation, checkpoints and logging are not part of a step.

HF ``generate`` runs with padded training, every prompt computed once per sample: the baseline. Every
other engine runs with each way of training in ``TRAINING``: padded, ``shared`` (each distinct prompt
computed once per micro-batch, the default) and ``packed`` (padding-free), so the table holds the
baseline and the fastest configuration side by side. vLLM (when installed) runs with the default, ``shared``.
"""

from __future__ import annotations

import functools
import numbers
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verl.bench.common import attn_implementation, prompt_width, recipe_config
from verl.bench.measure import Case, Prepared, median
from verl.bench.rollout import engines
from verl.data import collate_rl, iterate_batches
from verl.trainer.rl_trainer import RLTrainer

STEP_PROMPT_POOL = 512
"""Training prompts the step draws its batches from (data.train_max_samples)."""

# Stages in the order they run; any other timing_s/* key a step reports is listed after them.
STAGES = ["gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor"]


TRAINING: dict[str, list[str]] = {
    "padded": ["actor_rollout_ref.model.share_prompts=false"],
    "shared": ["actor_rollout_ref.model.share_prompts=true"],
    "packed": ["actor_rollout_ref.model.use_remove_padding=true"],
}


def cases(
    model: str, model_path: str, micro_batch: int | None, prompts: int | None = None, **common: Any
) -> list[Case]:
    variants = [("hf", "padded")] + [(e, t) for e in engines() if e not in ("hf", "vllm") for t in TRAINING]
    if "vllm" in engines():  # the engine does not change how training runs: the default training only
        variants.append(("vllm", "shared"))
    return [
        Case(
            "step",
            model,
            model_path,
            {"engine": e, "training": t, "micro_batch": micro_batch, "prompts": prompts},
            **common,
        )
        for e, t in variants
    ]


def micro_batch_overrides(micro_batch: int | None) -> list[str]:
    """Rows per forward pass of the update and the log-prob pass; None keeps the recipe's (the whole batch
    at once). Before the LM head ran in chunks, SmolLM2's 49k-token vocabulary made a whole-batch step
    peak at 14 GB, mostly logits. The update's result does not depend on it (the loss is normalised
    by mini-batch counts), only its speed and memory do."""
    if micro_batch is None:
        return []
    return [
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro_batch}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro_batch}",
    ]


def prompt_overrides(prompts: int | None) -> list[str]:
    """Prompts per step (one optimizer step, as the recipe), or the recipe's when None."""
    if prompts is None:
        return []
    return [f"data.train_batch_size={prompts}", f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}"]


def step_config(case: Case, out_dir: str) -> Any:
    data = Path(case.data_dir)
    return recipe_config(
        [
            f"data.train_files={data / 'train.parquet'}",
            f"data.val_files={data / 'test.parquet'}",
            f"data.max_prompt_length={prompt_width(case.model_path, recipe_config().data.max_response_length)}",
            # A sample of the task is as good as all of it for timing, and loads in a fraction of the time.
            f"data.train_max_samples={STEP_PROMPT_POOL}",
            "data.val_max_samples=16",
            f"actor_rollout_ref.model.path={case.model_path}",
            f"actor_rollout_ref.model.attn_implementation={attn_implementation()}",
            f"actor_rollout_ref.rollout.name={case.params['engine']}",
            f"trainer.torch_threads={case.threads}",
            f"trainer.seed={case.seed}",
            f"trainer.default_local_dir={out_dir}",
            "trainer.logger=[]",
            "prepare.enable=false",
            *micro_batch_overrides(case.params["micro_batch"]),
            *TRAINING[case.params.get("training", "padded")],
            *prompt_overrides(case.params.get("prompts")),
            *case.params.get("overrides", ()),  # a variant's own settings (benchmarks/compute_dtype.py)
        ],
    )


def step_runner(trainer: RLTrainer) -> Callable[[], dict[str, float]]:
    """A function that runs the trainer's next RL step (its next batch of prompts, as ``fit()`` draws them)
    and returns the step's numeric metrics. Also used by ``benchmarks/vs_trl.py``."""
    collate = functools.partial(collate_rl, pad_token_id=trainer.tokenizer.pad_token_id)
    batches = iterate_batches(trainer.train_dataset, trainer.sampler, collate, num_epochs=None)

    def run() -> dict[str, float]:
        metrics = trainer.train_step(trainer.global_steps + 1, next(batches), batches)
        return {k: float(v) for k, v in metrics.items() if isinstance(v, numbers.Real)}

    return run


def setup(case: Case) -> Prepared:
    out_dir = tempfile.TemporaryDirectory(prefix="verl-bench-step-")
    config = step_config(case, out_dir.name)
    trainer = RLTrainer(config)
    train_step = step_runner(trainer)

    def run() -> dict[str, Any]:
        keep = ("timing_s/", "perf/", "response_length/mean")
        return {k: v for k, v in train_step().items() if k.startswith(keep)}

    def close() -> None:
        trainer.shutdown()
        out_dir.cleanup()

    samples = config.data.train_batch_size * config.actor_rollout_ref.rollout.n
    info = {
        "prompts": config.data.train_batch_size,
        "samples": samples,
        "max_response_length": config.data.max_response_length,
    }
    modules = [worker.actor_model for worker in trainer.controller.group("actor_rollout").workers]
    return Prepared(run, info=info, close=close, modules=modules)


def summarize(case: Case, result: dict[str, Any]) -> dict[str, Any]:
    runs = result["runs"]
    keys = sorted({k for r in runs for k in r})
    medians = {k: median([r[k] for r in runs if k in r]) for k in keys}
    timing = {k.removeprefix("timing_s/"): v for k, v in medians.items() if k.startswith("timing_s/")}
    order = [s for s in STAGES if s in timing] + sorted(set(timing) - set(STAGES) - {"step"})
    return {
        "median_s": medians.get("timing_s/step", median(result["times_s"])),
        "tokens_per_s": medians.get("perf/throughput"),
        "tokens_per_step": medians.get("perf/total_num_tokens"),
        "mean_response_length": medians.get("response_length/mean"),
        "stages_s": {s: timing[s] for s in order},
        **result["info"],
    }
