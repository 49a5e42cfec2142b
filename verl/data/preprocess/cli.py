"""``python -m verl.data.preprocess {gsm8k,math} --local_dataset_path PATH --local_save_dir DIR``.

The flags are verl's (``examples/data_preprocess/gsm8k.py`` and ``math_dataset.py``), ``--local_dir``
included as the deprecated name of ``--local_save_dir``, so verl's instructions work unchanged, except
that the dataset must already be on disk.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from verl.data.io import BAD_ROW_POLICIES
from verl.data.preprocess.pipeline import DATASETS, OUTPUT_NAMES, WrittenSplit, preprocess
from verl.data.preprocess.sources import SPLITS
from verl.errors import InputError, UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m verl.data.preprocess",
        description="Convert a local copy of a hub math dataset into verl's train.parquet / test.parquet.",
    )
    parser.add_argument("dataset", choices=sorted(DATASETS), help="which dataset the input holds")
    parser.add_argument(
        "--local_dataset_path",
        help="the raw dataset: a .parquet / .jsonl file, or a directory of train.* / test.* files "
        "(a hub snapshot such as openai/gsm8k's main/train-*.parquet works too)",
    )
    parser.add_argument(
        "--local_save_dir", help="where to write train.parquet / test.parquet (default: ~/data/<dataset>)"
    )
    parser.add_argument("--local_dir", help="deprecated name of --local_save_dir (verl's)")
    parser.add_argument("--overwrite", action="store_true", help="replace existing train/test.parquet files")
    parser.add_argument("--split", choices=SPLITS, help="the split a single input file holds")
    parser.add_argument(
        "--bad_rows",
        choices=BAD_ROW_POLICIES,
        default="fail",
        help="a row that cannot be converted: fail (default) or skip it (counted)",
    )
    return parser


def resolve_save_dir(local_save_dir: str | None, local_dir: str | None) -> str | None:
    """``--local_save_dir``, or the deprecated ``--local_dir`` with a warning; two different dirs is an error."""
    if local_dir is None:
        return local_save_dir
    print("warning: --local_dir is deprecated; use --local_save_dir", file=sys.stderr)
    if local_save_dir is not None and local_save_dir != local_dir:
        raise InputError(
            f"--local_dir {local_dir} and --local_save_dir {local_save_dir} disagree; give --local_save_dir only"
        )
    return local_dir


def report(dataset: str, written: list[WrittenSplit]) -> None:
    """Where each file went and how many rows it holds, and the config overrides that train on them."""
    for out in written:
        skipped = f" ({out.skipped} bad rows skipped)" if out.skipped else ""
        plural = "" if out.rows == 1 else "s"
        print(f"wrote {out.rows} {out.split} row{plural} to {out.path.absolute()}{skipped}")
    save_dir = written[0].path.parent
    by_split = {out.split: out.path.absolute() for out in written}
    for split in SPLITS:
        if split not in by_split:
            kept = save_dir / OUTPUT_NAMES[split]
            state = f"{kept} is left as it was" if kept.exists() else f"no {kept.name} was written"
            print(f"note: the input had no {split} split; {state}")
    keys = {"train": "data.train_files", "test": "data.val_files"}
    overrides = " ".join(f"{keys[split]}={path}" for split, path in by_split.items())
    print(f"data_source {DATASETS[dataset].data_source}; to train on it: {overrides}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit code (0, or the :class:`~verl.errors.UserError`'s, e.g. 3 for input)."""
    args = build_parser().parse_args(argv)
    try:
        save_dir = resolve_save_dir(args.local_save_dir, args.local_dir)
        written = preprocess(
            args.dataset,
            args.local_dataset_path,
            save_dir,
            overwrite=args.overwrite,
            split=args.split,
            bad_rows=args.bad_rows,
        )
    except UserError as error:
        print(f"{error.label}: {error}", file=sys.stderr)
        return error.exit_code
    report(args.dataset, written)
    return 0
