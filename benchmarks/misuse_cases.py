"""The cases of the hostile-user round (``benchmarks/misuse_round.py``): helpers, and the ``cli`` and
``config-values`` groups. ``misuse_cases_data.py`` has data, model and sft; ``misuse_cases_runs.py`` has
checkpoints / run directories and export; ``misuse_cases_reward.py`` has reward and signals.

Expectations follow the contract of ``verl.errors`` (2 config error, 3 input error, 4 run directory error,
1 run failed, 130 interrupted), not what the tree does today. ``mentions`` are what the one-line message
must name; a tuple is a set of alternatives.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.misuse_round import BASE, RUN_DIR, Case, Ctx, Fixtures, error

# ------------------------------------------------------------------------------------------------ helpers


def run(*overrides: str, config: str | None = "grpo", flags: Sequence[str] = ()) -> list[str]:
    """``verl run`` with the short-run overrides (2 steps, no validation pass before, ckpt_dir), on the demo
    recipe (named: a case that gives a model or data would otherwise get verl's defaults, grpo_verl)."""
    argv = ["verl", "run", *flags]
    if config:
        argv += ["--config", config]
    return argv + BASE + list(overrides)


def row(a: int, b: int, index: int = 0, **changes: Any) -> dict[str, Any]:
    """One arithmetic row in verl's schema; ``changes`` replace fields (value None: drop the field)."""
    r: dict[str, Any] = {
        "data_source": "arithmetic",
        "prompt": [{"role": "user", "content": f"{a}+{b}="}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(a + b)},
        "extra_info": {"split": "train", "index": index},
    }
    for key, value in changes.items():
        if value is None:
            r.pop(key, None)
        else:
            r[key] = value
    return r


def rows(n: int = 32, **changes: Any) -> list[dict[str, Any]]:
    return [row(i % 10, (i * 7) % 13, i, **changes) for i in range(n)]


def write_parquet(path: Path, data: list[dict[str, Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(data), path)
    return path


def write_jsonl(path: Path, data: list[Any], raw_lines: Sequence[str] = ()) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r, ensure_ascii=False) for r in data] + list(raw_lines)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def steps_logged(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(int(json.loads(line).get("step", -1)))
        except (ValueError, AttributeError):
            continue
    return out


def marker(run_dir: Path) -> int | None:
    path = run_dir / "latest_checkpointed_iteration.txt"
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def whole(ckpt: Path) -> str | None:
    """None when ``ckpt`` looks complete, else what is missing."""
    for part in ("trainer_state.pt", "config.yaml", "actor/model.safetensors", "actor/optim.pt"):
        if not (ckpt / part).is_file():
            return f"{ckpt.name} is not whole: no {part}"
    return None


def trained(steps: int = 2, where: str = RUN_DIR):
    """Check: the run logged metrics for steps 1..steps."""

    def check(ctx: Ctx) -> str | None:
        logged = steps_logged(ctx.tmp / where)
        if sorted(set(logged)) != list(range(1, steps + 1)):
            return f"metrics.jsonl has steps {sorted(set(logged))}, expected 1..{steps}"
        return None

    return check


def latest_is(step: int, *mentions: str, result: str = "graded"):
    """Check: the run directory's latest checkpoint is ``step`` and whole, and the output of the graded
    (or the last ``after``) command names each of ``mentions``."""

    def check(ctx: Ctx) -> str | None:
        m = marker(ctx.run_dir)
        if m != step:
            return f"latest checkpoint is {m}, expected {step}"
        bad = whole(ctx.run_dir / f"global_step_{step}")
        if bad:
            return bad
        res = ctx.result if result == "graded" else ctx.after[-1]
        out = res.output.lower()
        missing = [x for x in mentions if x.lower() not in out]
        return f"the log does not report {', '.join(missing)}" if missing else None

    return check


def setup_files(**files: str | bytes):
    """setup writing text/bytes files (name -> content) in the case dir."""

    def setup(tmp: Path, fx: Fixtures) -> None:
        for name, content in files.items():
            write(tmp / name.replace("__", "/"), content)

    return setup


# ------------------------------------------------------------------------------------------------ cli


def _cli(id: str, what: str, argv: Sequence[str], codes: Any, mentions: Sequence[Any], **kw: Any) -> Case:
    return Case(f"cli-{id}", "cli", what, list(argv), error(codes, mentions), limit_s=60, **kw)


def cli_cases() -> list[Case]:
    return [
        _cli("unknown-subcommand", "verl train", ["verl", "train"], 2, ["train"]),
        _cli("unknown-flag", "verl run --epochs 3", run("--epochs", "3"), 2, ["--epochs"]),
        _cli(
            "flag-typo", "verl run --print-conifg", ["verl", "run", "--print-conifg"], 2, ["--print-conifg"]
        ),
        _cli(
            "override-as-flag",
            "hydra-style --trainer.total_training_steps=2",
            ["verl", "run", "--trainer.total_training_steps=2"],
            2,
            ["trainer.total_training_steps"],
        ),
        _cli(
            "override-no-equals",
            "override without '=' (key and value as two words)",
            run("trainer.save_freq", "5"),
            2,
            ["trainer.save_freq"],
        ),
        _cli(
            "override-empty-value",
            "data.train_batch_size= (empty)",
            run("data.train_batch_size="),
            2,
            ["data.train_batch_size"],
        ),
        _cli("hydra-plus", "hydra append syntax +trainer.foo=1", run("+trainer.foo=1"), 2, ["trainer.foo"]),
        _cli("unknown-section", "typo in a section: trainr.seed=2", run("trainr.seed=2"), 2, ["trainr"]),
        _cli(
            "key-typo",
            "data.train_batch_szie=8",
            run("data.train_batch_szie=8"),
            2,
            ["train_batch_szie", "train_batch_size"],
        ),
        _cli(
            "nested-unknown-key",
            "actor_rollout_ref.actor.optim.learning_rate=1e-5",
            run("actor_rollout_ref.actor.optim.learning_rate=1e-5"),
            2,
            ["learning_rate"],
        ),
        _cli(
            "wrong-type-int",
            "data.train_batch_size=sixteen",
            run("data.train_batch_size=sixteen"),
            2,
            ["data.train_batch_size"],
        ),
        _cli(
            "wrong-type-float",
            "actor_rollout_ref.actor.optim.lr=fast",
            run("actor_rollout_ref.actor.optim.lr=fast"),
            2,
            ["optim.lr"],
        ),
        _cli(
            "wrong-type-bool",
            "trainer.val_before_train=ture",
            run("trainer.val_before_train=ture"),
            2,
            ["val_before_train"],
        ),
        _cli(
            "list-for-scalar",
            "data.train_batch_size=[16]",
            run("data.train_batch_size=[16]"),
            2,
            ["data.train_batch_size"],
        ),
        _cli(
            "scalar-for-section",
            "actor_rollout_ref.actor=5",
            run("actor_rollout_ref.actor=5"),
            2,
            ["actor_rollout_ref.actor"],
        ),
        _cli(
            "unbalanced-bracket",
            "data.train_files=[a.parquet",
            run("data.train_files=[a.parquet"),
            2,
            ["data.train_files"],
        ),
        _cli(
            "logger-typo",
            "trainer.logger=[console,wandbb]",
            run("trainer.logger=[console,wandbb]"),
            2,
            ["wandbb"],
        ),
        _cli(
            "env-interp-unset",
            "${oc.env:...} of an unset variable",
            run("trainer.experiment_name=${oc.env:VERL_MISUSE_UNSET_VAR}"),
            2,
            ["VERL_MISUSE_UNSET_VAR"],
        ),
        _cli("recipe-typo", "--config gpro", run(config="gpro"), 2, ["gpro"]),
        _cli(
            "config-missing-file", "--config nosuch.yaml", run(config="nosuch.yaml"), (2, 3), ["nosuch.yaml"]
        ),
        _cli(
            "config-directory",
            "--config ./myconf/ (a directory)",
            run(config="./myconf/"),
            (2, 3),
            ["myconf"],
            setup=lambda tmp, fx: (tmp / "myconf").mkdir(),
        ),
        _cli(
            "config-list",
            "--config a YAML holding a list",
            run(config="notmap.yaml"),
            2,
            ["notmap.yaml"],
            setup=setup_files(**{"notmap.yaml": "- data\n- trainer\n"}),
        ),
        _cli(
            "config-bad-yaml",
            "--config a YAML with a syntax error",
            run(config="broken.yaml"),
            2,
            ["broken.yaml"],
            setup=setup_files(**{"broken.yaml": "trainer:\n  seed: [1, 2\n  logger: console\n"}),
        ),
        _cli(
            "config-unknown-key",
            "--config YAML with trainer.total_steps",
            run(config="mine.yaml"),
            2,
            ["total_steps"],
            setup=setup_files(**{"mine.yaml": "base: grpo\ntrainer:\n  total_steps: 2\n"}),
        ),
        _cli(
            "config-base-typo",
            "--config YAML whose base: is a recipe typo",
            run(config="mine.yaml"),
            2,
            ["grpoo"],
            setup=setup_files(**{"mine.yaml": "base: grpoo\ntrainer:\n  seed: 3\n"}),
        ),
        _cli(
            "controller-missing-file",
            "--controller nosuch.py:MyController",
            run(flags=["--controller", "nosuch.py:MyController"]),
            (2, 3),
            ["nosuch.py"],
        ),
        _cli("export-no-args", "verl export", ["verl", "export"], 2, ["checkpoint"]),
        _cli(
            "export-bad-part",
            "verl export --part reward",
            ["verl", "export", "a", "b", "--part", "reward"],
            2,
            ["reward"],
        ),
    ]


# ------------------------------------------------------------------------------------------------ config values


def _cv(
    id: str, overrides: Sequence[str], mentions: Sequence[Any], what: str | None = None, **kw: Any
) -> Case:
    codes = kw.pop("codes", 2)
    config = kw.pop("config", "grpo")
    return Case(
        f"cv-{id}",
        "config-values",
        what or " ".join(overrides),
        run(*overrides, config=config),
        error(codes, mentions),
        limit_s=kw.pop("limit_s", 75),
        **kw,
    )


ROLL = "actor_rollout_ref.rollout"
ACT = "actor_rollout_ref.actor"


def config_value_cases() -> list[Case]:
    return [
        _cv(
            "temperature-zero",
            [f"{ROLL}.temperature=0"],
            ["temperature"],
            "rollout.temperature=0 with do_sample",
        ),
        _cv("temperature-negative", [f"{ROLL}.temperature=-0.5"], ["temperature"]),
        _cv("top-p-zero", [f"{ROLL}.top_p=0"], ["top_p"]),
        _cv("top-p-above-one", [f"{ROLL}.top_p=1.5"], ["top_p"]),
        _cv("clip-ratio-zero", [f"{ACT}.clip_ratio=0"], ["clip_ratio"]),
        _cv("clip-ratio-c-one", [f"{ACT}.clip_ratio_c=1.0"], ["clip_ratio_c"]),
        _cv("total-steps-zero", ["trainer.total_training_steps=0"], ["total_training_steps"]),
        _cv("total-steps-negative", ["trainer.total_training_steps=-5"], ["total_training_steps"]),
        _cv(
            "total-epochs-zero",
            ["trainer.total_training_steps=null", "trainer.total_epochs=0"],
            ["total_epochs"],
        ),
        _cv("lr-negative", [f"{ACT}.optim.lr=-1e-4"], ["lr"]),
        _cv("gamma-above-one", ["algorithm.gamma=1.5"], ["gamma"]),
        _cv("gamma-negative", ["algorithm.gamma=-0.1"], ["gamma"]),
        _cv("lam-above-one", ["algorithm.lam=2"], ["lam"]),
        _cv("grpo-n1", [f"{ROLL}.n=1"], ["rollout.n"], "GRPO with rollout.n=1 (no group to compare)"),
        _cv(
            "rloo-n1",
            [f"{ROLL}.n=1"],
            ["rollout.n"],
            "RLOO with rollout.n=1 (no other sample)",
            config="rloo",
        ),
        _cv("rollout-n-zero", [f"{ROLL}.n=0"], ["rollout.n"]),
        _cv(
            "longer-than-model",
            ["data.max_prompt_length=480", "data.max_response_length=64"],
            [("max_prompt_length", "max_response_length", "max_position_embeddings")],
            "prompt 480 + response 64 tokens > the model's 512 positions",
        ),
        _cv("train-batch-zero", ["data.train_batch_size=0"], ["train_batch_size"]),
        _cv("train-batch-negative", ["data.train_batch_size=-16"], ["train_batch_size"]),
        _cv(
            "mini-not-dividing",
            [f"{ACT}.ppo_mini_batch_size=5"],
            ["ppo_mini_batch_size"],
            "train_batch_size 16, ppo_mini_batch_size 5",
        ),
        _cv(
            "mini-above-train",
            [f"{ACT}.ppo_mini_batch_size=32"],
            ["ppo_mini_batch_size"],
            "ppo_mini_batch_size 32 > train_batch_size 16",
        ),
        _cv(
            "micro-not-dividing",
            [f"{ACT}.ppo_micro_batch_size_per_gpu=7"],
            ["ppo_micro_batch_size_per_gpu"],
            "micro batch 7 does not divide 16 prompts x 8 samples",
        ),
        _cv("ppo-epochs-zero", [f"{ACT}.ppo_epochs=0"], ["ppo_epochs"]),
        _cv("max-response-length-negative", ["data.max_response_length=-1"], ["max_response_length"]),
        _cv("save-freq-zero", ["trainer.save_freq=0"], ["save_freq"], "trainer.save_freq=0 (-1 means never)"),
        _cv("test-freq-zero", ["trainer.test_freq=0"], ["test_freq"], "trainer.test_freq=0 (-1 means never)"),
        _cv("kl-coef-negative", [f"{ACT}.use_kl_loss=true", f"{ACT}.kl_loss_coef=-0.1"], ["kl_loss_coef"]),
        _cv("adv-estimator-typo", ["algorithm.adv_estimator=grpoo"], ["grpoo"]),
        _cv("rollout-engine-typo", [f"{ROLL}.name=vlm"], ["vlm"]),
        _cv(
            "device-cuda-absent",
            ["trainer.device=cuda"],
            ["cuda"],
            "trainer.device=cuda on a machine without a GPU",
            codes=(1, 2),
        ),
    ]


# ------------------------------------------------------------------------------------------------ all


def all_cases() -> list[Case]:
    from benchmarks.misuse_cases_data import data_cases, model_cases, sft_cases
    from benchmarks.misuse_cases_hostile import hostile_checkpoint_cases
    from benchmarks.misuse_cases_outputs import output_cases
    from benchmarks.misuse_cases_reward import reward_cases, signal_cases
    from benchmarks.misuse_cases_runs import checkpoint_cases, export_cases
    from benchmarks.misuse_cases_sandbox import sandbox_cases
    from benchmarks.misuse_cases_tools import tool_cases

    return [
        *cli_cases(),
        *config_value_cases(),
        *data_cases(),
        *model_cases(),
        *checkpoint_cases(),
        *export_cases(),
        *reward_cases(),
        *signal_cases(),
        *sft_cases(),
        *sandbox_cases(),
        *hostile_checkpoint_cases(),
        *tool_cases(),
        *output_cases(),
    ]
