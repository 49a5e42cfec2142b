"""Cases of the hostile-user round: ``reward`` (custom reward functions) and ``signals`` (Ctrl-C, SIGTERM;
see misuse_cases.py)."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.misuse_cases import marker, run, trained, whole, write
from benchmarks.misuse_cases_runs import RD, SAVE1
from benchmarks.misuse_round import Case, Cmd, Ctx, Fixtures, Signal, error, ok

# ------------------------------------------------------------------------------------------------ reward

HEAD = "import math\nimport time\n\nCALLS = [0]\n\n\n"


def reward_file(body: str, name: str = "score") -> str:
    return HEAD + f"def {name}(data_source, solution_str, ground_truth, extra_info=None):\n" + body


def _reward(id: str, what: str, code: str | None, overrides: Sequence[str], expect: Any, **kw: Any) -> Case:
    setup = kw.pop("setup", None)
    if code is not None:

        def setup(tmp: Path, fx: Fixtures, code: str = code) -> None:
            write(tmp / "reward.py", code)

    args = ["custom_reward_function.path=reward.py", "custom_reward_function.name=score", *overrides]
    if kw.pop("no_reward_args", False):
        args = list(overrides)
    return Case(
        f"reward-{id}", "reward", what, run(*args), expect, setup=setup, limit_s=kw.pop("limit_s", 90), **kw
    )


def _headline(word: str, absent: str | None = None):
    """Check: the held-out lines at the end name ``word`` and not ``absent``."""

    def check(ctx: Ctx) -> str | None:
        lines = [ln for ln in ctx.result.stdout.splitlines() if ln.startswith("held-out")]
        if not lines:
            return "no held-out line in the output"
        if not any(word in ln for ln in lines):
            return f"held-out line does not name {word}: {lines[0][:100]}"
        if absent and any(absent in ln for ln in lines):
            return f"held-out line names {absent}: {lines[0][:100]}"
        return None

    return check


def reward_cases() -> list[Case]:
    timeout = ("timed out", "timeout", "time limit", "seconds")
    return [
        _reward(
            "raises",
            "the reward function raises ValueError",
            reward_file("    raise ValueError('boom: cannot parse ' + repr(solution_str))\n"),
            [],
            error(1, ["run failed", "sample", "boom"]),
        ),
        _reward(
            "raises-sometimes",
            "raises on its 50th call only",
            reward_file(
                "    CALLS[0] += 1\n    if CALLS[0] == 50:\n        raise KeyError('rare-case')\n"
                "    return float(solution_str.strip() == str(ground_truth))\n"
            ),
            [],
            error(1, ["sample", "rare-case"]),
        ),
        _reward(
            "nan", "returns NaN", reward_file("    return float('nan')\n"), [], error(1, ["sample", "nan"])
        ),
        _reward("none", "returns None", reward_file("    return None\n"), [], error(1, ["sample", "None"])),
        _reward(
            "string",
            "returns the string '1.0'",
            reward_file("    return '1.0'\n"),
            [],
            error(1, ["sample", "str"]),
        ),
        _reward(
            "sleeps-past-timeout",
            "sleeps 30 s, reward_model.timeout_s=2",
            reward_file("    time.sleep(30)\n    return 0.0\n"),
            ["reward_model.timeout_s=2"],
            error(1, ["sample", timeout]),
        ),
        _reward(
            "sleeps-no-timeout-set",
            "sleeps forever, no timeout set (default 60 s must stop it)",
            reward_file("    time.sleep(3600)\n    return 0.0\n"),
            [],
            error(1, ["sample", timeout]),
            limit_s=200,
        ),
        _reward(
            "missing-function",
            "custom_reward_function.name=nope",
            reward_file("    return 0.0\n"),
            ["custom_reward_function.name=nope"],
            error((2, 3), ["nope"]),
        ),
        _reward(
            "file-missing",
            "custom_reward_function.path=nosuch_reward.py",
            None,
            ["custom_reward_function.path=nosuch_reward.py"],
            error((2, 3), ["nosuch_reward.py"]),
            no_create=["nosuch_reward.py"],
            no_reward_args=True,
        ),
        _reward(
            "syntax-error",
            "reward.py has a syntax error",
            HEAD + "def score(data_source, solution_str:\n",
            [],
            error((2, 3), ["reward.py"]),
        ),
        _reward(
            "import-error",
            "reward.py imports a module that does not exist",
            "import no_such_module_xyz\n" + reward_file("    return 0.0\n"),
            [],
            error((2, 3), ["no_such_module_xyz"]),
        ),
        _reward(
            "not-callable",
            "custom_reward_function.name names a number",
            "score = 5\n",
            [],
            error((2, 3), ["score"]),
        ),
        _reward(
            "wrong-signature",
            "score(x) takes one argument",
            "def score(x):\n    return 0.0\n",
            [],
            error((1, 2), ["score"]),
        ),
        _reward(
            "unexpected-kwarg",
            "reward_kwargs.foo=1 that score() does not take",
            reward_file("    return 0.0\n"),
            ["custom_reward_function.reward_kwargs.foo=1"],
            error((1, 2), ["foo"]),
        ),
        _reward(
            "huge-value",
            "returns 1e30 (the headline must not call it an accuracy)",
            reward_file("    return 1e30\n"),
            [],
            ok(_headline("reward", "acc")),
        ),
        _reward(
            "acc-dict",
            "returns {'score': s, 'acc': s} (control: headline names acc)",
            reward_file(
                "    s = float(solution_str.strip() == str(ground_truth))\n    return {'score': s, 'acc': s}\n"
            ),
            [],
            ok(_headline("acc")),
        ),
        _reward(
            "error-policy-zero",
            "raises on every call with reward_model.error_policy=zero (control)",
            reward_file("    raise ValueError('boom')\n"),
            ["reward_model.error_policy=zero"],
            ok(trained(2)),
        ),
    ]


# ------------------------------------------------------------------------------------------------ signals


def _rerun_to_next(ctx: Ctx) -> list[str]:
    """The same run again, to one step past its last complete checkpoint."""
    return run(f"trainer.total_training_steps={(marker(ctx.run_dir) or 0) + 1}", "trainer.save_freq=1")


def _resumed(ctx: Ctx) -> str | None:
    """Check: the interrupted run left a whole latest checkpoint, and the rerun resumed from it."""
    if not ctx.after:
        return "no rerun"
    rerun = ctx.after[-1]
    want = int(rerun.argv[-2].split("=")[1]) if "total_training_steps" in rerun.argv[-2] else None
    if rerun.rc != 0:
        return f"the rerun exited {rerun.rc}: {rerun.stderr.strip().splitlines()[-1:]}"
    m = marker(ctx.run_dir)
    if want is not None and m != want:
        return f"after the rerun the latest checkpoint is {m}, expected {want}"
    bad = whole(ctx.run_dir / f"global_step_{m}")
    if bad:
        return bad
    if "resum" not in rerun.output.lower():
        return "the rerun does not say it resumed"
    return None


def _sig(id: str, what: str, cmd: Cmd, expect: Any, **kw: Any) -> Case:
    return Case(f"sig-{id}", "signals", what, cmd, expect, limit_s=kw.pop("limit_s", 120), **kw)


LONG = ("trainer.total_training_steps=200", "trainer.save_freq=2")
STOPPED = (130, 143, -15)


def signal_cases() -> list[Case]:
    during_save = f"{RD}/global_step_[3-9]*"
    return [
        _sig(
            "int-mid-run",
            "Ctrl-C (SIGINT) 0.5 s after the 2nd checkpoint; then rerun",
            Cmd(run(*LONG), signals=[Signal(signal.SIGINT, when=f"{RD}/global_step_2", delay_s=0.5)]),
            error(130, ["interrupt"], _resumed),
            after=[Cmd(_rerun_to_next)],
        ),
        _sig(
            "term-mid-run",
            "SIGTERM 0.5 s after the 2nd checkpoint; then rerun",
            Cmd(run(*LONG), signals=[Signal(signal.SIGTERM, when=f"{RD}/global_step_2", delay_s=0.5)]),
            error(STOPPED, [], _resumed),
            after=[Cmd(_rerun_to_next)],
        ),
        _sig(
            "int-during-save",
            "resume a 2-step run to 6, Ctrl-C while checkpoint 3 is written; then rerun",
            Cmd(
                run("trainer.total_training_steps=6", SAVE1),
                signals=[Signal(signal.SIGINT, when=during_save)],
            ),
            error(130, ["interrupt"], _resumed),
            prior=[run(SAVE1)],
            protect=[f"{RD}/global_step_1", f"{RD}/global_step_2"],
            after=[Cmd(_rerun_to_next)],
        ),
        _sig(
            "term-during-save",
            "resume a 2-step run to 6, SIGTERM while checkpoint 3 is written; then rerun",
            Cmd(
                run("trainer.total_training_steps=6", SAVE1),
                signals=[Signal(signal.SIGTERM, when=during_save)],
            ),
            error(STOPPED, [], _resumed),
            prior=[run(SAVE1)],
            protect=[f"{RD}/global_step_1", f"{RD}/global_step_2"],
            after=[Cmd(_rerun_to_next)],
        ),
        _sig(
            "int-twice",
            "Ctrl-C twice, 0.3 s apart, after the 2nd checkpoint; then rerun",
            Cmd(
                run(*LONG),
                signals=[
                    Signal(signal.SIGINT, when=f"{RD}/global_step_2", delay_s=0.3),
                    Signal(signal.SIGINT, when=f"{RD}/global_step_2", delay_s=0.6),
                ],
            ),
            error(130, ["interrupt"], _resumed),
            after=[Cmd(_rerun_to_next)],
        ),
        _sig(
            "int-at-startup",
            "Ctrl-C 1.5 s after start (while loading)",
            Cmd(run(*LONG), signals=[Signal(signal.SIGINT, after_s=1.5)]),
            error(130, ["interrupt"]),
            limit_s=90,
        ),
    ]
