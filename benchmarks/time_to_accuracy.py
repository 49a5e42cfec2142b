"""verl against TRL's GRPOTrainer: wall-clock time to a held-out accuracy gain on the SmolLM2 recipe.

    python benchmarks/time_to_accuracy.py --side both --seeds 1,2 --target-gain 30 --max-minutes 60 \\
        --out benchmarks/results/time_to_accuracy.json
    python benchmarks/time_to_accuracy.py --side both --seeds 1 --max-minutes 3 --val-limit 20 \\
        --ours-override trainer.test_freq=2 --idle-wait-s 0                    # a smoke check

Needs TRL (``python -m pip install -c constraints-cpu.txt trl==1.16.0``) and the recipe's packages (its YAML
names them). Both sides train what ``verl run --config smollm2_arithmetic`` trains: SmolLM2-135M-Instruct with
LoRA (r 16, alpha 32, all-linear), GRPO on reasoning-gym basic_arithmetic, 16 prompts x 4 samples per step, up
to 24 new tokens at temperature 1.0, one optimizer step per RL step, no KL. Held-out accuracy is greedy
accuracy on the recipe's 269 held-out problems (``--val-limit N``: the first N), scored by the scorer the
recipe resolves to (``verl.workers.reward.scorers.default_compute_score``: reasoning-gym's verifier on the
response's last number; ``acc`` is 1 for full marks), before training and every ``trainer.test_freq`` steps.

verl's side is ``verl run --config smollm2_arithmetic trainer.seed=S`` in a subprocess (plus
``--ours-override`` keys); its accuracies are read from its ``metrics.jsonl`` as the run writes it. That file
records no clock time (only ``timing_s/*`` durations, none for the validation before training), so each
validation's time is the file's modification time when its line appears (polled every 0.2 s; the line is
written right after the validation). TRL's side is ``GRPOTrainer`` in a child process of this script, with the
``peft.LoraConfig`` verl builds (``verl.models.lora.lora_config``) and the GRPOConfig ``vs_trl.py`` derives
from verl's resolved config (:func:`benchmarks.vs_trl.trl_shared_args`: batch geometry, lr, warm-up, betas,
weight decay, gradient clip, clip ratio, temperature, ``beta=0``, ``loss_type`` from ``loss_agg_mode``, the
seed); TRL 1.16's CPU defaults otherwise (bf16 autocast around the loss, gradient checkpointing, fp32
``generate``; ``--trl-arg`` sets any field). Its train and held-out prompts are verl's ``RLDataset``'s (the
same chat template and token ids; the child checks TRL's own tokenisation of the first batch against them),
its train rows come in verl's order (verl's ``EpochSampler``, same seed; ``shuffle_dataset=False``; the reward
function checks each step's prompts against that order), its reward is the same scorer's ``score``. A
TrainerCallback evaluates at step 0 and every ``test_freq`` steps (and the last): greedy, 24 new tokens,
batches of ``data.val_batch_size`` (100), through TRL's generation path (``unwrap_model_for_generation``,
adapters active), writing each result with its clock time.

Not equal, and cannot be: the LoRA A matrices start from different random draws (each framework's own RNG
stream from the same seed), and so do the samples; verl generates in bf16 on a CPU with bf16 instructions, TRL
in fp32, so greedy answers (and start accuracies) differ a little. Each side's target is its own start +
``--target-gain`` points. Times run from the launch of each side's process (imports, model loading and the
step-0 evaluation count on both sides). A run stops at its target, after ``--max-minutes`` or at
``trainer.total_training_steps``. The table: start and best accuracy, minutes and steps to the target, median
step seconds (verl: ``timing_s/step``; TRL: ``on_step_begin`` to ``on_step_end``), then TRL's minutes over
verl's per seed and overall (geometric mean over the seeds where both reached it). Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import vs_trl  # noqa: E402

RECIPE = "smollm2_arithmetic"
POLL_S = 0.2
OURS_INFO = {"torch_threads": "torch threads: ", "actor_compute": "actor computes "}
"""what the notes under the table quote from verl's log: the rest of the line that starts so"""


def recipe_config(overrides: list[str], build: bool = False) -> Any:
    """The recipe's resolved config with ``overrides``, its prepared paths filled (built when ``build``)."""
    from verl.config import load_config
    from verl.trainer.prepare import prepare_inputs, resolve_inputs

    config = load_config(RECIPE, overrides)
    return prepare_inputs(config, log=lambda _: None) if build else resolve_inputs(config)


def total_steps(config: Any) -> int:
    if not config.trainer.total_training_steps or config.trainer.test_freq <= 0:
        raise SystemExit("needs trainer.total_training_steps set and trainer.test_freq > 0")
    return int(config.trainer.total_training_steps)


def score_of(result: Any, key: str) -> float:
    """``key`` of a scorer's result (a dict), or the result itself when the scorer gives a bare number."""
    return float(result[key]) if isinstance(result, dict) else float(result)


# ---------------------------------------------------------------------------------------------- TRL's side


def trl_data(config: Any, steps: int) -> tuple[Any, Any, list[int]]:
    """verl's train and held-out ``RLDataset`` (prompts chat-templated and tokenised as verl does) and the
    train rows' indices in the order verl's ``EpochSampler`` hands them out over ``steps`` steps."""
    from verl.data.rl_dataset import RLDataset
    from verl.data.sampler import EpochSampler
    from verl.models.loading import tokenizer_for

    data = config.data
    kw = dict(tokenizer=tokenizer_for(config.actor_rollout_ref.model), prompt_key=data.prompt_key)
    kw.update(max_prompt_length=data.max_prompt_length, truncation=data.truncation)
    kw.update(filter_overlong_prompts=data.filter_overlong_prompts)
    kw.update(chat_template_kwargs=dict(data.apply_chat_template_kwargs))
    train = RLDataset(data.train_files, max_samples=data.train_max_samples, **kw)
    val = RLDataset(data.val_files, max_samples=data.val_max_samples, **kw)
    seed = data.seed if data.seed is not None else config.trainer.seed
    sampler = EpochSampler(len(train), data.train_batch_size, shuffle=data.shuffle, seed=seed)
    need, per_epoch = steps * data.train_batch_size, len(sampler) * data.train_batch_size
    epochs = range(-(-need // per_epoch))  # epoch after epoch, as verl's loop draws them
    return train, val, [i for e in epochs for batch in sampler.epoch_batches(e) for i in batch][:need]


def held_out_accuracy(trainer: Any, val: Any, max_new_tokens: int, batch_size: int) -> float:
    """Greedy accuracy on ``val`` (verl's prompt token ids, left-padded, ``batch_size`` at a time) through
    TRL's generation path (adapters active, gradient checkpointing off meanwhile), scored as verl scores."""
    import torch
    from transformers import GenerationConfig
    from trl.models.utils import unwrap_model_for_generation

    from verl.workers.reward.scorers import default_compute_score

    tokenizer, eos = val.tokenizer, trainer.eos_token_ids
    pad = tokenizer.pad_token_id
    greedy = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad, eos_token_id=eos
    )
    checkpointing = trainer.args.gradient_checkpointing_kwargs  # restored as TRL set it, after generating
    wrapped, accelerator = trainer.model_wrapped, trainer.accelerator
    unwrap = unwrap_model_for_generation(wrapped, accelerator, gradient_checkpointing_kwargs=checkpointing)
    accs = []
    with unwrap as model, torch.no_grad():
        for start in range(0, len(val), batch_size):
            prompts = val.prompt_ids[start : start + batch_size]
            width = max(map(len, prompts))
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=greedy)
            for row, completion in zip(val.rows[start:], out[:, width:].tolist(), strict=False):
                # cut after the first EOS, as TRL does
                ends = [k for k, t in enumerate(completion) if t in eos]
                text = tokenizer.decode(completion[: ends[0] + 1 if ends else None], skip_special_tokens=True)
                truth, extra = row["reward_model"]["ground_truth"], row.get("extra_info")
                accs.append(score_of(default_compute_score(row["data_source"], text, truth, extra), "acc"))
    return sum(accs) / len(accs)


def child_trl(spec: dict[str, Any]) -> None:
    """TRL's run, appending ``start`` / ``eval`` / ``step`` / ``log`` events to ``spec["progress"]``."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from benchmarks.vs_trl_reward import completion_text
    from verl.models.lora import lora_config
    from verl.workers.reward.scorers import default_compute_score

    progress = open(spec["progress"], "a", encoding="utf-8")  # noqa: SIM115

    def emit(event: str, **fields: Any) -> None:
        progress.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")
        progress.flush()

    config = recipe_config(spec["overrides"])
    data, steps, test_freq = config.data, total_steps(config), config.trainer.test_freq
    train, val, order = trl_data(config, steps)
    keep = ("data_source", "reward_model", "extra_info")  # what the scorer reads
    rows = [
        {"prompt": train.rows[i][data.prompt_key], **{k: train.rows[i].get(k) for k in keep}} for i in order
    ]

    batches: list[bool] = []  # per step: did TRL draw verl's prompts, in verl's order?

    def verl_score(prompts, completions, data_source, reward_model, extra_info, **_):
        step, size = len(batches), data.train_batch_size
        batches.append(prompts[:: len(prompts) // size] == [r["prompt"] for r in rows[step * size :][:size]])
        if step == 0 or not batches[-1]:
            emit("order", step=step + 1, same=batches[-1])
        texts = [completion_text(c) for c in completions]
        return [
            score_of(default_compute_score(s, t, m["ground_truth"], e), "score")
            for s, t, m, e in zip(data_source, texts, reward_model, extra_info, strict=True)
        ]

    class Clock(TrainerCallback):
        trainer: Any = None
        begin = 0.0

        def evaluate(self, step: int) -> None:
            start, size = time.perf_counter(), data.val_batch_size or len(val)
            acc = held_out_accuracy(self.trainer, val, data.max_response_length, size)
            emit("eval", step=step, acc=acc, eval_s=time.perf_counter() - start)

        def on_train_begin(self, args, state, control, **kwargs):
            self.evaluate(0)

        def on_step_begin(self, args, state, control, **kwargs):
            self.begin = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            emit("step", step=state.global_step, step_s=time.perf_counter() - self.begin)
            if state.global_step % test_freq == 0 or state.global_step == steps:
                self.evaluate(state.global_step)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                emit("log", step=state.global_step, reward=logs["reward"])

    clock = Clock()
    with tempfile.TemporaryDirectory(prefix="trl-tta-") as out_dir:
        trainer = GRPOTrainer(
            model=config.actor_rollout_ref.model.path,
            reward_funcs=[verl_score],
            args=GRPOConfig(output_dir=out_dir, **spec["trl_args"]),
            train_dataset=Dataset.from_list(rows),
            peft_config=lora_config(config.actor_rollout_ref.model),
            callbacks=[clock],
        )
        first = order[: data.train_batch_size]
        trl_ids = trainer._tokenize_prompts([r["prompt"] for r in rows[: len(first)]])[0]
        same_ids = [list(x) for x in trl_ids] == [train.prompt_ids[i] for i in first]
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        info = {**vs_trl.trl_info(trainer), "same_prompt_ids": same_ids, "trainable_params": trainable}
        emit("start", info=info)
        clock.trainer = trainer
        trainer.train()
    emit("end", info={"peak_rss_mb": vs_trl.peak_rss_mb()})


# ---------------------------------------------------------------------------------------------- running


def parse_ours(record: dict[str, Any], t_s: float, run: dict[str, Any]) -> None:
    """One line of verl's metrics.jsonl into ``run``: a validation point (at ``t_s``), a step's seconds."""
    accs = [v for k, v in record.items() if k.startswith("val-core/") and k.endswith("/acc/mean@1")]
    if len(accs) > 1:
        raise SystemExit(f"more than one held-out accuracy in metrics.jsonl: {sorted(record)}")
    if accs:
        eval_s = record.get("timing_s/testing")
        run["points"].append({"step": record["step"], "acc": accs[0], "t_s": t_s, "eval_s": eval_s})
    if "timing_s/step" in record:
        reward = record.get("critic/score/mean")
        run["steps"].append({"step": record["step"], "step_s": record["timing_s/step"], "reward": reward})


def parse_trl(record: dict[str, Any], launched: float, run: dict[str, Any]) -> None:
    """One event of TRL's child into ``run``."""
    event, t_s = record.pop("event"), record.pop("time") - launched
    if event == "eval":
        run["points"].append({**record, "t_s": t_s})
    elif event == "step":
        run["steps"].append(record)
    elif event == "log" and run["steps"] and run["steps"][-1]["step"] == record["step"]:
        run["steps"][-1]["reward"] = record["reward"]
    elif event == "order":
        run["info"]["same_train_order"] = run["info"].get("same_train_order", True) and record["same"]
    elif event in ("start", "end"):
        run["info"].update(record["info"], **({"started_s": t_s} if event == "start" else {}))


def watch(cmd: list[str], side: str, progress: Path, log: Path, gain: float, max_s: float) -> dict[str, Any]:
    """Run ``cmd``, following ``progress`` as it grows; stop it at start + ``gain`` points or after max_s."""
    run: dict[str, Any] = {"points": [], "steps": [], "info": {}, "log": str(log)}
    launched, offset, reason = time.time(), 0, None
    with open(log, "w") as out:
        kw = dict(stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=vs_trl.child_env())
        proc = subprocess.Popen(cmd, start_new_session=True, **kw)
    try:  # the child runs in a session of its own: an interrupted parent stops it too
        while reason is None:
            code = proc.poll()  # before reading: a run that has ended has written everything
            if progress.exists():
                with open(progress, "rb") as f:
                    f.seek(offset)
                    chunk, mtime = f.read(), os.fstat(f.fileno()).st_mtime
                lines = chunk[: chunk.rfind(b"\n") + 1]  # whole lines only
                offset += len(lines)
                for line in lines.splitlines():
                    if side == "ours":
                        parse_ours(json.loads(line), mtime - launched, run)
                    else:
                        parse_trl(json.loads(line), launched, run)
            points = run["points"]
            if points and max(p["acc"] for p in points) * 100 >= points[0]["acc"] * 100 + gain - 1e-9:
                reason = "target reached"
            elif code is not None:
                reason = "finished" if code == 0 else f"exit {code}"
            elif time.time() - launched > max_s:
                reason = "time limit"
            else:
                time.sleep(POLL_S)
        wall_s = time.time() - launched  # before stopping it: a stopped run may take seconds to unwind
    finally:
        if proc.poll() is None:
            _stop(proc)
    run.update(stop=reason, wall_s=wall_s)
    text = log.read_text(errors="replace").splitlines()
    if side == "ours":
        for key, start in OURS_INFO.items():
            run["info"].update((key, ln[len(start) :]) for ln in text if ln.startswith(start))
    if reason.startswith("exit"):
        run["log_tail"] = text[-20:]
    return run


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the child's process group (verl unwinds as on Ctrl-C), SIGKILL after 30 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def summarize(run: dict[str, Any], gain: float) -> dict[str, Any]:
    """Start and best accuracy (points); the first validation at start + ``gain``: its minutes and step."""
    points = run["points"]
    start = points[0]["acc"] * 100 if points else math.nan
    hit = next((p for p in points if p["acc"] * 100 >= start + gain - 1e-9), None)
    return {
        "start": start if points else None,
        "best": max(p["acc"] for p in points) * 100 if points else None,
        "minutes": None if hit is None else hit["t_s"] / 60,
        "minutes_after_first_eval": None if hit is None else (hit["t_s"] - points[0]["t_s"]) / 60,
        "step": None if hit is None else hit["step"],
        "median_step_s": vs_trl.median([s["step_s"] for s in run["steps"]]),
        "steps_run": max((s["step"] for s in run["steps"]), default=0),
    }


def render(runs: list[dict[str, Any]], gain: float) -> str:
    head = (
        f"| side | seed | start acc | best acc | minutes to +{gain:g} | steps to +{gain:g} | median step s "
    )
    head += "| stop |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in runs:
        sm, fmt = r["summary"], vs_trl.fmt
        minutes = (
            f"{sm['minutes']:.1f}"
            if sm["minutes"] is not None
            else f"not reached in {r['wall_s'] / 60:.1f} min"
        )
        cells = [r["side"], str(r["seed"]), fmt(sm["start"], 1), fmt(sm["best"], 1), minutes, fmt(sm["step"])]
        cells += [fmt(sm["median_step_s"], 2), f"{r['stop']} ({sm['steps_run']} steps)"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio(trl: dict[str, Any], ours: dict[str, Any]) -> tuple[float | None, str]:
    """TRL's minutes over verl's; a bound (the other side's whole run) when only one side got there."""
    t, o = trl["summary"]["minutes"], ours["summary"]["minutes"]
    if t is not None and o is not None:
        return t / o, f"{t / o:.2f}x"
    if o is not None:
        return None, f"> {trl['wall_s'] / 60 / o:.2f}x (TRL did not reach it)"
    if t is not None:
        return None, f"< {t / (ours['wall_s'] / 60):.2f}x (verl did not reach it)"
    return None, "neither reached it"


def ratios(runs: list[dict[str, Any]], gain: float) -> tuple[list[dict[str, Any]], float | None]:
    """TRL's minutes over verl's per seed (printed), and their geometric mean where both reached."""
    out = []
    for seed in dict.fromkeys(r["seed"] for r in runs):
        pair = {r["side"]: r for r in runs if r["seed"] == seed}
        if "ours" in pair and "trl" in pair:
            value, text = ratio(pair["trl"], pair["ours"])
            out.append({"seed": seed, "trl_over_ours": value, "text": text})
            print(f"- seed {seed}: TRL minutes / verl minutes to +{gain:g}: {text}")
    both = [r["trl_over_ours"] for r in out if r["trl_over_ours"]]
    overall = math.exp(sum(map(math.log, both)) / len(both)) if both else None
    if out:
        mean = "-" if overall is None else f"{overall:.2f}x"
        print(f"- overall: {mean} (geometric mean over the {len(both)} of {len(out)} seeds both reached)")
    return out, overall


def side_command(
    side: str, overrides: list[str], config: Any, run_dir: Path, trl_args: dict[str, Any]
) -> tuple[list[str], Path, dict[str, Any]]:
    """One side's command, the file that grows as it validates, and what the JSON records about it."""
    if side == "ours":
        out = run_dir / "run"
        cmd = [sys.executable, "-m", "verl.cli", "run", "--config", RECIPE, *overrides]
        return [*cmd, f"trainer.default_local_dir={out}"], out / "metrics.jsonl", {}
    data, samples = config.data, config.actor_rollout_ref.rollout.n
    settings = vs_trl.Settings(
        data.train_batch_size, samples, data.max_response_length, 0, total_steps(config)
    )
    extra = {"trl_args": {**vs_trl.trl_shared_args(config, settings), **trl_args}}
    progress, spec = run_dir / "progress.jsonl", run_dir / "spec.json"
    spec.write_text(json.dumps({"overrides": overrides, "progress": str(progress), **extra}))
    return [sys.executable, str(Path(__file__).resolve()), "--child", str(spec)], progress, extra


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--side", default="both", choices=("ours", "trl", "both"))
    p.add_argument("--seeds", default="1,2", help="comma list of trainer.seed values")
    p.add_argument("--target-gain", type=float, default=30.0, help="held-out points over the step-0 accuracy")
    p.add_argument("--max-minutes", type=float, default=60.0, help="limit per run, from its launch")
    p.add_argument("--val-limit", type=int, default=None, help="the first N held-out problems (smoke checks)")
    p.add_argument("--ours-override", action="append", default=[], metavar="KEY=VALUE", help="verl key")
    p.add_argument("--trl-arg", action="append", default=[], metavar="KEY=VALUE", help="GRPOConfig field")
    p.add_argument("--out", default=None, help="write every run (every validation point) as JSON here")
    p.add_argument("--log-dir", default=None, help="keep run directories and logs here (default: a temp dir)")
    p.add_argument("--idle-wait-s", type=float, default=60, help="wait up to this long for idle CPUs per run")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.child:
        child_trl(json.loads(Path(args.child).read_text()))
        return 0
    from verl.bench.common import load_average, machine_info
    from verl.bench.measure import wait_for_idle

    sides = ["ours", "trl"] if args.side == "both" else [args.side]
    trl_version = vs_trl.require_trl() if "trl" in sides else None
    trl_args = vs_trl.parse_kv(args.trl_arg, "--trl-arg")
    vs_trl.parse_kv(args.ours_override, "--ours-override")  # checked here, passed on as given
    work = Path(args.log_dir or tempfile.mkdtemp(prefix="time-to-acc-"))
    work.mkdir(parents=True, exist_ok=True)
    machine = {**machine_info(0), "trl": trl_version}
    machine.pop("torch_threads")
    print(f"machine: {machine['cpu']} ({machine['cpu_count']} CPUs), trl {trl_version}; logs in {work}")
    runs: list[dict[str, Any]] = []
    for seed in [int(s) for s in args.seeds.split(",") if s.strip()]:
        overrides = [f"trainer.seed={seed}", *args.ours_override]
        overrides += [f"data.val_max_samples={args.val_limit}"] if args.val_limit else []
        config = recipe_config(overrides, build=True)  # the model and data, built once if not cached
        for side in sides:
            run_dir = Path(tempfile.mkdtemp(prefix=f"{side}-seed{seed}-", dir=work))
            cmd, progress, extra = side_command(side, overrides, config, run_dir, trl_args)
            busy = wait_for_idle(args.idle_wait_s)
            print(
                f"{run_dir.name}: {total_steps(config)} steps at most, {args.max_minutes:g} min", flush=True
            )
            run = watch(cmd, side, progress, run_dir / "log", args.target_gain, args.max_minutes * 60)
            run.update(side=side, seed=seed, busy_before_pct=busy, load_after=load_average(), **extra)
            run["summary"] = summarize(run, args.target_gain)
            curve = ", ".join(f"{p['step']}: {100 * p['acc']:.1f}" for p in run["points"])
            print(f"  {run['stop']} after {run['wall_s'] / 60:.1f} min; held-out accuracy by step: {curve}")
            runs.append(run)
    print("\n" + render(runs, args.target_gain))
    per_seed, overall = ratios(runs, args.target_gain)
    for r in runs:
        print(f"- {r['side']} seed {r['seed']}: " + ", ".join(f"{k}={v}" for k, v in r["info"].items()))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        result = {"recipe": RECIPE, "args": vars(args), "machine": machine, "runs": runs}
        result.update(ratios=per_seed, overall_trl_over_ours=overall)
        Path(args.out).write_text(json.dumps(result, indent=2))
        print(f"\nJSON: {args.out}")
    return 0 if all(not r["stop"].startswith("exit") for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
