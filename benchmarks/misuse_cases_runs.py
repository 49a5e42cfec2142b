"""Cases of the hostile-user round: ``checkpoints`` (run directories, resume) and ``export`` (see
misuse_cases.py; reward and signals are in misuse_cases_reward.py)."""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.misuse_cases import latest_is, marker, run, steps_logged, trained, write
from benchmarks.misuse_round import RUN_DIR, Case, Cmd, Ctx, Fixtures, Signal, error, hash_paths, ok

SAVE1 = "trainer.save_freq=1"
RD = RUN_DIR  # ckpt_dir

# ------------------------------------------------------------------------------------------------ checkpoints


def copy_run(tmp: Path, fx: Fixtures) -> None:
    """The shared 2-step run (global_step_1, global_step_2, metrics.jsonl) as the case's ckpt_dir."""
    fx.copy_run(tmp / RD)


def _ckpt(id: str, what: str, cmd: Any, expect: Any, **kw: Any) -> Case:
    return Case(f"ckpt-{id}", "checkpoints", what, cmd, expect, limit_s=kw.pop("limit_s", 120), **kw)


def _moved_aside(ctx: Ctx) -> str | None:
    moved = sorted(p for p in ctx.tmp.iterdir() if p.name.startswith(f"{RD}.moved-"))
    if len(moved) != 1:
        return f"expected one sibling {RD}.moved-<timestamp>, found {[p.name for p in moved]}"
    for rel, digest in ctx.before.items():
        if "lock" in Path(rel).name:
            continue
        new = moved[0] / Path(rel).relative_to(RD)
        if hash_paths(ctx.tmp, [str(new.relative_to(ctx.tmp))]).get(str(new.relative_to(ctx.tmp))) != digest:
            return f"{rel} is not in {moved[0].name} unchanged"
    return trained(2)(ctx)


def _immutable(tmp: Path, fx: Fixtures) -> None:
    (tmp / RD).mkdir()
    if subprocess.run(["chattr", "+i", str(tmp / RD)], capture_output=True).returncode != 0:
        (tmp / RD).chmod(0o555)  # works when not root


def _mutable(tmp: Path) -> None:
    if (tmp / RD).exists():
        subprocess.run(["chattr", "-i", str(tmp / RD)], capture_output=True)
        (tmp / RD).chmod(0o755)


def _set_marker(text: str):
    def setup(tmp: Path, fx: Fixtures) -> None:
        copy_run(tmp, fx)
        (tmp / RD / "latest_checkpointed_iteration.txt").write_text(text)

    return setup


def _break(rel: str, content: bytes | None):
    """setup: the shared run with ``rel`` overwritten (None: removed)."""

    def setup(tmp: Path, fx: Fixtures) -> None:
        copy_run(tmp, fx)
        path = tmp / RD / rel
        if content is None:
            path.unlink()
        else:
            path.write_bytes(content)

    return setup


def _stale_tmp(tmp: Path, fx: Fixtures) -> None:
    copy_run(tmp, fx)
    write(tmp / RD / "global_step_3.tmp" / "actor" / "model.safetensors", b"half")


def _model_copy(tmp: Path, fx: Fixtures) -> None:
    copy_run(tmp, fx)
    fx.copy_model(tmp / "model_copy")


def _train_copy(tmp: Path, fx: Fixtures) -> None:
    copy_run(tmp, fx)
    shutil.copy(fx.train, tmp / "train_copy.parquet")


def _continued(to: int, *mentions: str):
    """Check: resumed from step 2 and went on to ``to``; the first run's metrics are kept."""

    def check(ctx: Ctx) -> str | None:
        why = latest_is(to, *mentions)(ctx)
        if why:
            return why
        logged = steps_logged(ctx.run_dir)
        if sorted(logged) != list(range(1, to + 1)):
            return f"metrics.jsonl steps {logged}, expected 1..{to} once each"
        return None

    return check


def _same_run_ok(ctx: Ctx) -> str | None:
    return None if marker(ctx.run_dir) == 2 else f"latest checkpoint {marker(ctx.run_dir)}, expected 2"


def _retention_ok(ctx: Ctx) -> str | None:
    names = sorted(p.name for p in ctx.run_dir.glob("global_step_*"))
    return None if names == ["global_step_3", "global_step_4"] else f"checkpoints left: {names}"


def _all(*checks):
    """Every check passes (the first complaint otherwise)."""

    def check(ctx: Ctx) -> str | None:
        for each in checks:
            why = each(ctx)
            if why:
                return why
        return None

    return check


def _kept_aside(path: str, content: bytes):
    """The damaged file is still there, set aside (``path`` relative to the run directory)."""

    def check(ctx: Ctx) -> str | None:
        kept = ctx.run_dir / path
        if not kept.is_file() or kept.read_bytes() != content:
            return f"{path} was not kept as it was"
        return None

    return check


def checkpoint_cases() -> list[Case]:
    prior2 = [run(SAVE1)]
    refused = [RD]
    changed = "the saved config vs this one"
    return [
        _ckpt(
            "a-retention-wipes-old-run",
            "run 12 steps save_freq=1, then a fresh run (resume_mode=disable, max_actor_ckpt_to_keep=1) same dir",
            run("trainer.resume_mode=disable", "trainer.max_actor_ckpt_to_keep=1", SAVE1),
            error(4, [RD]),
            prior=[run("trainer.total_training_steps=12", SAVE1)],
            protect=[RD],
            limit_s=150,
        ),
        _ckpt(
            "b-second-run-overwrites",
            "second run in the same dir with resume_mode=disable (would overwrite checkpoints, append metrics)",
            run("trainer.resume_mode=disable", SAVE1),
            error(4, [RD]),
            prior=prior2,
            protect=[RD],
        ),
        _ckpt(
            "b-metrics-only",
            "a run without checkpoints left metrics.jsonl; a new run (auto, nothing to resume) in the same dir",
            run(),
            error(4, [RD]),
            prior=[run()],
            protect=[f"{RD}/metrics.jsonl"],
        ),
        _ckpt(
            "c-after-ctrl-c",
            "a run Ctrl-C'd after its 2nd checkpoint, then a fresh run (resume_mode=disable) in the same dir",
            run("trainer.resume_mode=disable", SAVE1),
            error(4, [RD]),
            prior=[
                Cmd(
                    run("trainer.total_training_steps=200", "trainer.save_freq=2"),
                    signals=[Signal(signal.SIGINT, when=f"{RD}/global_step_2", delay_s=0.2)],
                )
            ],
            protect=[RD],
            limit_s=150,
        ),
        _ckpt(
            "d-concurrent-writers",
            "a second run in the directory of a run still going (same command, 4 steps)",
            run("trainer.total_training_steps=4", "trainer.save_freq=2"),
            error(4, [RD, "{bg_pid}", "{host}"]),
            prior=[
                Cmd(
                    run("trainer.total_training_steps=400", "trainer.save_freq=2"),
                    background=True,
                    ready=f"{RD}/global_step_2",
                )
            ],
        ),
        _ckpt(
            "stale-lock-after-kill",
            "a run SIGKILLed after its 2nd checkpoint (lock left behind), then the same command again",
            run("trainer.total_training_steps=3", "trainer.save_freq=1"),
            ok(latest_is(3)),
            prior=[
                Cmd(
                    run("trainer.total_training_steps=200", "trainer.save_freq=2"),
                    signals=[Signal(signal.SIGKILL, when=f"{RD}/global_step_2", delay_s=0.2)],
                )
            ],
            limit_s=150,
        ),
        _ckpt(
            "move-aside",
            "second fresh run with trainer.on_existing_run=move_aside",
            run("trainer.resume_mode=disable", "trainer.on_existing_run=move_aside", SAVE1),
            ok(_moved_aside),
            prior=prior2,
            snapshot=[RD],
        ),
        _ckpt(
            "resume-more-steps",
            "resume (auto) with total_training_steps 2 -> 4",
            run("trainer.total_training_steps=4", SAVE1),
            ok(_continued(4, "total_training_steps")),
            prior=prior2,
            protect=[f"{RD}/global_step_1", f"{RD}/global_step_2"],
        ),
        _ckpt(
            "resume-finished",
            "the same command again after the run finished",
            run(SAVE1),
            ok(_same_run_ok),
            prior=prior2,
            protect=[f"{RD}/global_step_1", f"{RD}/global_step_2"],
        ),
        _ckpt(
            "resume-changed-logger",
            "resume with trainer.logger=[console,jsonl] -> [jsonl] and 3 steps",
            run("trainer.total_training_steps=3", "trainer.logger=[jsonl]", SAVE1),
            ok(latest_is(3, "logger")),
            prior=prior2,
            protect=[f"{RD}/global_step_2"],
        ),
        _ckpt(
            "resume-changed-micro-batch",
            "resume with ppo_micro_batch_size_per_gpu=32 and 3 steps",
            run(
                "trainer.total_training_steps=3",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
                SAVE1,
            ),
            ok(latest_is(3, "ppo_micro_batch_size_per_gpu")),
            prior=prior2,
            protect=[f"{RD}/global_step_2"],
        ),
        _ckpt(
            "resume-changed-lr",
            f"resume with optim.lr 1e-4 -> 5e-4 ({changed})",
            run("actor_rollout_ref.actor.optim.lr=5e-4", "trainer.total_training_steps=3", SAVE1),
            error(4, ["optim.lr"]),
            setup=copy_run,
            protect=refused,
        ),
        _ckpt(
            "resume-changed-recipe",
            "resume the grpo run with --config rloo",
            run("trainer.total_training_steps=3", SAVE1, config="rloo"),
            error(4, ["adv_estimator", "grpo", "rloo"]),
            setup=copy_run,
            protect=refused,
        ),
        _ckpt(
            "resume-changed-model",
            "resume with model.path = a copy of the model elsewhere",
            run("actor_rollout_ref.model.path=model_copy", "trainer.total_training_steps=3", SAVE1),
            error(4, ["model.path"]),
            setup=_model_copy,
            protect=refused,
        ),
        _ckpt(
            "resume-changed-data",
            "resume with data.train_files = another file",
            run(
                "data.train_files=train_copy.parquet",
                "actor_rollout_ref.model.path={model}",
                "trainer.total_training_steps=3",
                SAVE1,
            ),
            error(4, ["train_files"]),
            setup=_train_copy,
            protect=refused,
        ),
        _ckpt(
            "resume-changed-n",
            "resume with rollout.n 8 -> 4",
            run("actor_rollout_ref.rollout.n=4", "trainer.total_training_steps=3", SAVE1),
            error(4, ["rollout.n"]),
            setup=copy_run,
            protect=refused,
        ),
        _ckpt(
            "resume-changed-batch",
            "resume with train_batch_size and ppo_mini_batch_size 16 -> 8",
            run(
                "data.train_batch_size=8",
                "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                "trainer.total_training_steps=3",
                SAVE1,
            ),
            error(4, ["train_batch_size"]),
            setup=copy_run,
            protect=refused,
        ),
        _ckpt(
            "resume-changed-loss",
            "resume with loss_agg_mode token-mean -> seq-mean-token-mean",
            run(
                "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
                "trainer.total_training_steps=3",
                SAVE1,
            ),
            error(4, ["loss_agg_mode"]),
            setup=copy_run,
            protect=refused,
        ),
        _ckpt(
            "resume-path-not-ckpt",
            "trainer.resume_mode=./somedir (an empty directory)",
            run("trainer.resume_mode=./somedir"),
            error(3, ["somedir"]),
            setup=lambda tmp, fx: (tmp / "somedir").mkdir(),
            no_create=[RD + "/global_step_1"],
        ),
        _ckpt(
            "resume-path-missing",
            "trainer.resume_mode=./old/global_step_99 (does not exist)",
            run("trainer.resume_mode=./old/global_step_99"),
            error(3, ["global_step_99"]),
            no_create=["old"],
        ),
        _ckpt(
            "resume-mode-typo",
            "trainer.resume_mode=atuo",
            run("trainer.resume_mode=atuo"),
            error((2, 3), ["atuo"]),
            no_create=["atuo"],
        ),
        _ckpt(
            "corrupt-marker",
            "latest_checkpointed_iteration.txt holds 'abc'",
            run("trainer.total_training_steps=3", SAVE1),
            error((3, 4), ["latest_checkpointed_iteration.txt"]),
            setup=_set_marker("abc\n"),
            protect=[RD],
        ),
        _ckpt(
            "marker-missing-step",
            "the marker says 7, there is no global_step_7",
            run("trainer.total_training_steps=8", SAVE1),
            error((3, 4), ["global_step_7"]),
            setup=_set_marker("7\n"),
            protect=[RD],
        ),
        _ckpt(
            "incomplete-ckpt",
            "global_step_2 without trainer_state.pt (marker says 2)",
            run("trainer.total_training_steps=3", SAVE1),
            error((3, 4), ["global_step_2"]),
            setup=_break("global_step_2/trainer_state.pt", None),
            protect=[RD],
        ),
        _ckpt(
            "corrupt-weights",
            "global_step_2/actor/model.safetensors is garbage: set aside whole (global_step_2.damaged), resumed "
            "from global_step_1",
            run("trainer.total_training_steps=3", SAVE1),
            ok(
                _all(latest_is(3), _kept_aside("global_step_2.damaged/actor/model.safetensors", b"\x00" * 64))
            ),
            setup=_break("global_step_2/actor/model.safetensors", b"\x00" * 64),
            protect=[f"{RD}/global_step_1"],
        ),
        _ckpt(
            "stale-tmp-dir",
            "a half-written global_step_3.tmp left by a crash; resume to 3 steps",
            run("trainer.total_training_steps=3", SAVE1),
            ok(latest_is(3)),
            setup=_stale_tmp,
            protect=[f"{RD}/global_step_2"],
        ),
        _ckpt(
            "retention-own-run",
            "one run, 4 steps, save_freq=1, max_actor_ckpt_to_keep=2 (control)",
            run("trainer.total_training_steps=4", SAVE1, "trainer.max_actor_ckpt_to_keep=2"),
            ok(_retention_ok),
        ),
        _ckpt(
            "resume-from-other-dir",
            "resume_mode=<another run's global_step_2> into a fresh dir, 3 steps",
            run("trainer.resume_mode=old/global_step_2", "trainer.total_training_steps=3", SAVE1),
            ok(latest_is(3)),
            setup=lambda tmp, fx: fx.copy_run(tmp / "old"),
            protect=["old"],
        ),
        _ckpt(
            "read-only-dir",
            "trainer.default_local_dir is a read-only (immutable) directory",
            run(SAVE1),
            error(4, [RD]),
            setup=_immutable,
            teardown=_mutable,
        ),
        _ckpt(
            "dir-is-file",
            "trainer.default_local_dir is an existing file",
            run(SAVE1),
            error(4, [RD]),
            setup=lambda tmp, fx: write(tmp / RD, "my notes\n") and None,
            protect=[RD],
        ),
    ]


# ------------------------------------------------------------------------------------------------ export


def _export(id: str, what: str, args: Sequence[str], expect: Any, setup: Any = copy_run, **kw: Any) -> Case:
    return Case(
        f"export-{id}", "export", what, ["verl", "export", *args], expect, setup=setup, limit_s=75, **kw
    )


def _exported(where: str = "out"):
    def check(ctx: Ctx) -> str | None:
        out = ctx.tmp / where
        missing = [n for n in ("config.json", "model.safetensors") if not (out / n).is_file()]
        return f"{where}/ lacks {missing}" if missing else None

    return check


def _with(*files: tuple[str, str | bytes], base: Any = copy_run):
    def setup(tmp: Path, fx: Fixtures) -> None:
        if base:
            base(tmp, fx)
        for rel, content in files:
            write(tmp / rel, content)

    return setup


def export_cases() -> list[Case]:
    notes = ("out/notes.txt", "my notes\n")
    return [
        _export(
            "nonempty-target",
            "export into a directory holding notes.txt",
            [RD, "out"],
            error((3, 4), ["out"]),
            _with(notes),
            protect=["out"],
        ),
        _export(
            "overwrite-keeps-foreign",
            "export --overwrite into out/ holding notes.txt",
            [RD, "out", "--overwrite"],
            ok(_exported()),
            _with(notes),
            protect=["out/notes.txt"],
        ),
        _export(
            "target-is-file",
            "export to a path that is a file",
            [RD, "out"],
            error((3, 4), ["out"]),
            _with(("out", "a file\n")),
            protect=["out"],
        ),
        _export(
            "into-own-checkpoint",
            "export global_step_2 into its own actor/ directory",
            [f"{RD}/global_step_2", f"{RD}/global_step_2/actor"],
            error((3, 4), ["actor"]),
            protect=[RD],
        ),
        _export(
            "into-run-dir",
            "export into the run directory itself",
            [RD, RD],
            error((3, 4), [RD]),
            protect=[RD],
        ),
        _export(
            "nonexistent-ckpt",
            "export nosuch/global_step_5 out",
            ["nosuch/global_step_5", "out"],
            error(3, ["nosuch"]),
            None,
            no_create=["out", "nosuch"],
        ),
        _export(
            "run-dir-without-ckpt",
            "export a run directory that has metrics but no checkpoint",
            ["rundir", "out"],
            error(3, ["rundir"]),
            _with(("rundir/metrics.jsonl", '{"step": 1}\n'), base=None),
            no_create=["out"],
        ),
        _export(
            "no-critic",
            "export --part critic of a GRPO run (no critic)",
            [RD, "out", "--part", "critic"],
            error(3, ["critic"]),
            no_create=["out"],
        ),
        _export(
            "empty-step-dir",
            "export an empty global_step_5 directory",
            [f"{RD}/global_step_5", "out"],
            error(3, ["global_step_5"]),
            _with((f"{RD}/global_step_5/.keep", "")),
            no_create=["out"],
        ),
        _export(
            "corrupt-weights",
            "export a checkpoint whose model.safetensors is garbage",
            [f"{RD}/global_step_2", "out"],
            error(3, ["model.safetensors"]),
            _break("global_step_2/actor/model.safetensors", b"\x00" * 64),
            no_create=["out"],
        ),
        _export(
            "no-hf-config",
            "export a checkpoint missing actor/huggingface/config.json",
            [f"{RD}/global_step_2", "out"],
            error(3, ["config.json"]),
            _break("global_step_2/actor/huggingface/config.json", None),
            no_create=["out"],
        ),
        _export(
            "marker-missing-step",
            "export a run dir whose marker points at a missing step",
            [RD, "out"],
            error(3, ["global_step_9"]),
            _set_marker("9\n"),
            no_create=["out"],
        ),
        _export(
            "ok-run-dir", "export a run directory into a new out/ (control)", [RD, "out"], ok(_exported())
        ),
        _export(
            "ok-step-dir-unicode",
            "export global_step_1 into 'sortie é/' (control)",
            [f"{RD}/global_step_1", "sortie é"],
            ok(_exported("sortie é")),
        ),
    ]
