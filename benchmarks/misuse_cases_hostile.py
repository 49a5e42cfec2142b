"""The hostile-checkpoints group of the hostile-user round (``benchmarks/misuse_round.py``): checkpoints that
carry code (pickles) or were swapped, resumed or exported.

A hostile checkpoint is one a user was handed or had copied in: its ``.pt`` files are pickles, and unpickling
can call any function the file names. Each payload here calls ``os.system("touch <case>/PWNED")``; every case
checks that ``PWNED`` never appears (a ``security`` outcome if it does). The attacker also rewrites ``checkpoint.json``'s checksums to match
(``_rewrite_manifest``), so only reading the files as data stops them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.misuse_cases import latest_is, run, write
from benchmarks.misuse_round import RUN_DIR, SECURITY, Case, Ctx, Expect, Fixtures, error, ok

RD = RUN_DIR
SAVE1 = "trainer.save_freq=1"
MARKER = "PWNED"
"""the file every payload creates (relative to the case directory); no case may let it appear"""
STEP2 = f"{RD}/global_step_2"


class Payload:
    """Unpickled, it runs ``touch <marker>``: what a planted checkpoint file carries."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch '{self.marker}'",))


class NumpyLoadPayload:
    """Unpickled, it calls ``numpy.load(<file>, allow_pickle=True)`` on a ``.npy`` that holds a
    :class:`Payload`: a payload dressed as numpy, which the old-format reader's numpy allowlist must not let by."""

    def __init__(self, npy: Path) -> None:
        self.npy = str(npy)

    def __reduce__(self) -> tuple[Any, ...]:
        return (np.load, (self.npy, None, True))


def _rewrite_manifest(checkpoint: Path) -> None:
    """Make ``checkpoint.json``'s checksums match the files as they are now (what an attacker would do)."""
    from verl.utils.checkpoint import CHECKPOINT_INFO
    from verl.utils.checkpoint_integrity import MANIFEST_KEY, manifest_of

    info = json.loads((checkpoint / CHECKPOINT_INFO).read_text())
    info[MANIFEST_KEY] = manifest_of(checkpoint, skip=(CHECKPOINT_INFO,))
    (checkpoint / CHECKPOINT_INFO).write_text(json.dumps(info, indent=1) + "\n")


def _planted(rel: str, make: Any, manifest: bool = True, where: str = RD):
    """setup: the shared run in ``where`` with ``<where>/<rel>`` replaced by ``make(tmp, path)``'s bytes
    (written by it when it returns None), and the checksums rewritten to match unless not ``manifest``."""

    def setup(tmp: Path, fx: Fixtures) -> None:
        fx.copy_run(tmp / where)
        path = tmp / where / rel
        content = make(tmp, path)
        if content is not None:
            write(path, content)
        if manifest:
            _rewrite_manifest(tmp / where / rel.split("/")[0])

    return setup


def _payload(tmp: Path, path: Path) -> None:
    torch.save(Payload(tmp / MARKER), path)


def _numpy_load_payload(tmp: Path, path: Path) -> None:
    npy = tmp / "innocent.npy"
    np.save(npy, np.array([Payload(tmp / MARKER)], dtype=object), allow_pickle=True)
    torch.save({"global_step": 2, "rng": NumpyLoadPayload(npy)}, path)


def _old_format(change: Any = None):
    """make: the file as verl wrote it before checkpoints were data only: the same state pickled whole,
    numpy arrays and scalars as numpy objects (``change`` edits the state first)."""

    def make(tmp: Path, path: Path) -> None:
        from verl.utils.checkpoint_data import load_data

        state = load_data(path)
        if change is not None:
            change(state)
        torch.save(state, path)

    return make


def _numpy_lrs(optim: dict[str, Any]) -> None:
    schedule = optim["lr_scheduler"]
    schedule["base_lrs"] = [np.float64(v) for v in schedule["base_lrs"]]


def _truncated(tmp: Path, path: Path) -> bytes:
    return path.read_bytes()[: path.stat().st_size // 2]


def _huge(tmp: Path, path: Path) -> bytes:
    return b"\x00" * (64 << 20)


def _swap_steps(tmp: Path, fx: Fixtures) -> None:
    """global_step_1 and global_step_2 renamed into each other (the marker still says 2)."""
    fx.copy_run(tmp / RD)
    one, two, aside = (tmp / RD / name for name in ("global_step_1", "global_step_2", "swap"))
    one.rename(aside)
    two.rename(one)
    aside.rename(two)


def _foreign(tmp: Path, fx: Fixtures) -> None:
    """global_step_2 replaced by another run's (a run of the same recipe: only its id differs)."""
    fx.copy_run(tmp / RD)
    info_path = tmp / STEP2 / "checkpoint.json"
    info = json.loads(info_path.read_text())
    info["run_id"] = "0123456789ab"
    info_path.write_text(json.dumps(info, indent=1) + "\n")


def _symlinked_out(tmp: Path, fx: Fixtures) -> None:
    """global_step_2/trainer_state.pt a symbolic link to a file outside the checkpoint (a payload there)."""
    fx.copy_run(tmp / RD)
    outside = tmp / "outside" / "trainer_state.pt"
    outside.parent.mkdir()
    _payload(tmp, outside)
    link = tmp / STEP2 / "trainer_state.pt"
    link.unlink()
    link.symlink_to(outside)
    _rewrite_manifest(tmp / STEP2)


def _dcp_payload(tmp: Path, path: Path) -> None:
    """A DCP directory (the fsdp2 layout) in a part, whose ``.metadata`` pickle is the payload."""
    path.parent.mkdir(parents=True, exist_ok=True)
    import pickle

    path.write_bytes(pickle.dumps(Payload(tmp / MARKER)))


def _exported(ctx: Ctx) -> str | None:
    missing = [n for n in ("config.json", "model.safetensors") if not (ctx.tmp / "out" / n).is_file()]
    return f"out/ lacks {missing}" if missing else None


def _payload_stayed_put(check: Any = None):
    """The case's own check, after the one every case has: the payload never ran (no ``PWNED``), which is
    graded ``security``, not merely ``silent``."""

    def guarded(ctx: Ctx) -> str | None:
        if (ctx.tmp / MARKER).exists():
            return f"{SECURITY}the planted payload ran ({MARKER} was created)"
        return check(ctx) if check else None

    return guarded


def _hostile(id: str, what: str, cmd: Any, expect: Expect, **kw: Any) -> Case:
    expect = Expect(expect.kind, expect.codes, expect.mentions, _payload_stayed_put(expect.check))
    return Case(f"hck-{id}", "hostile-checkpoints", what, cmd, expect, limit_s=kw.pop("limit_s", 150), **kw)


def hostile_checkpoint_cases() -> list[Case]:
    resume3 = run("trainer.total_training_steps=3", SAVE1)
    code = ("run code", "could run")
    return [
        _hostile(
            "payload-trainer-state",
            "global_step_2/trainer_state.pt is a pickle calling os.system, checksums rewritten; resume",
            resume3,
            error(3, ["trainer_state.pt", code]),
            setup=_planted("global_step_2/trainer_state.pt", _payload),
            protect=[RD],
        ),
        _hostile(
            "payload-optim",
            "global_step_2/actor/optim.pt is a pickle calling os.system, checksums rewritten; resume",
            resume3,
            error(3, ["optim.pt", code]),
            setup=_planted("global_step_2/actor/optim.pt", _payload),
            protect=[RD],
        ),
        _hostile(
            "payload-rng",
            "global_step_2/actor/rng_rank0.pt is a pickle calling os.system, checksums rewritten; resume",
            resume3,
            error(3, ["rng_rank0.pt", code]),
            setup=_planted("global_step_2/actor/rng_rank0.pt", _payload),
            protect=[RD],
        ),
        _hostile(
            "payload-unverified",
            "payload in trainer_state.pt, checksums NOT rewritten: the altered checkpoint is passed over",
            resume3,
            ok(latest_is(3)),
            setup=_planted("global_step_2/trainer_state.pt", _payload, manifest=False),
        ),
        _hostile(
            "payload-other-dir",
            "resume_mode=<a handed-on run's global_step_2> whose trainer_state.pt is a payload (checksums match)",
            run("trainer.resume_mode=old/global_step_2", "trainer.total_training_steps=3", SAVE1),
            error(3, ["trainer_state.pt", code]),
            setup=_planted("global_step_2/trainer_state.pt", _payload, where="old"),
            protect=["old"],
            no_create=[RD + "/global_step_3"],
        ),
        _hostile(
            "payload-numpy-load",
            "trainer_state.pt calls numpy.load(allow_pickle=True) on a payload .npy (numpy, but not an array)",
            resume3,
            error(3, ["trainer_state.pt", "numpy.load"]),
            setup=_planted("global_step_2/trainer_state.pt", _numpy_load_payload),
            protect=[RD],
        ),
        _hostile(
            "old-format-trainer-state",
            "global_step_2/trainer_state.pt in the old format (numpy RNG arrays pickled whole); resume to 3",
            resume3,
            ok(latest_is(3)),
            setup=_planted("global_step_2/trainer_state.pt", _old_format()),
            protect=[STEP2],
        ),
        _hostile(
            "old-format-rng",
            "global_step_2/actor/rng_rank0.pt in the old format (numpy RNG arrays pickled whole); resume to 3",
            resume3,
            ok(latest_is(3)),
            setup=_planted("global_step_2/actor/rng_rank0.pt", _old_format()),
            protect=[STEP2],
        ),
        _hostile(
            "old-format-optim",
            "global_step_2/actor/optim.pt pickled whole with numpy scalars (old format); resume to 3",
            resume3,
            ok(latest_is(3)),
            setup=_planted("global_step_2/actor/optim.pt", _old_format(_numpy_lrs)),
            protect=[STEP2],
        ),
        _hostile(
            "swapped-steps",
            "global_step_1 and global_step_2 renamed into each other (marker says 2); resume",
            resume3,
            error((3, 4), ["global_step_2", "step 1"]),
            setup=_swap_steps,
            protect=[RD],
        ),
        _hostile(
            "foreign-checkpoint",
            "global_step_2 is another run's (its checkpoint.json names another run id); resume",
            resume3,
            error((3, 4), ["global_step_2", "another run"]),
            setup=_foreign,
            protect=[RD],
        ),
        _hostile(
            "symlink-outside",
            "resume_mode=global_step_2 whose trainer_state.pt is a symlink to a payload outside it",
            run(f"trainer.resume_mode={STEP2}", "trainer.total_training_steps=3", SAVE1),
            error(3, ["trainer_state.pt", "symbolic link"]),
            setup=_symlinked_out,
            protect=[RD, "outside"],
        ),
        _hostile(
            "truncated-rng",
            "global_step_2/actor/rng_rank0.pt cut in half, checksums rewritten; resume",
            resume3,
            error(3, ["rng_rank0.pt"]),
            setup=_planted("global_step_2/actor/rng_rank0.pt", _truncated),
            protect=[RD],
        ),
        _hostile(
            "huge-optim",
            "global_step_2/actor/optim.pt replaced by 64 MiB of zeros, checksums rewritten; resume",
            resume3,
            error(3, ["optim.pt"]),
            setup=_planted("global_step_2/actor/optim.pt", _huge),
            protect=[RD],
        ),
        _hostile(
            "export-payload-state",
            "verl export of a checkpoint whose trainer_state.pt is a payload (export needs only the weights)",
            ["verl", "export", STEP2, "out"],
            ok(_exported),
            setup=_planted("global_step_2/trainer_state.pt", _payload),
            protect=[RD],
        ),
        _hostile(
            "export-payload-dcp",
            "verl export of a checkpoint with actor/model_optim/.metadata (the sharded layout) a payload",
            ["verl", "export", STEP2, "out"],
            error(3, [".metadata", code]),
            setup=_planted("global_step_2/actor/model_optim/.metadata", _dcp_payload),
            protect=[RD],
            no_create=["out"],
        ),
        _hostile(
            "payload-dcp-resume",
            "resume a checkpoint with actor/model_optim/.metadata a payload, checksums rewritten",
            resume3,
            error(3, [".metadata", code]),
            setup=_planted("global_step_2/actor/model_optim/.metadata", _dcp_payload),
            protect=[RD],
        ),
    ]
