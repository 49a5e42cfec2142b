"""verl's SFT launch commands (``python -m verl.trainer.fsdp_sft_trainer`` and ``verl.trainer.sft_trainer``),
run as ``verl sft`` with verl's defaults."""

from __future__ import annotations

import os
import sys


def run_verl_sft(argv: list[str], verl_config: str) -> int:
    """``verl sft`` with the recipe of verl's defaults unless the command line names a config.

    Under torchrun (WORLD_SIZE > 1) only rank 0 trains: SFT here is one process, and verl's
    data.train_batch_size is the global batch, so one process sees the same batches.
    """
    from verl.cli import run_verl_command

    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world > 1 and rank != 0:
        return 0
    if world > 1:
        print(
            f"torchrun started {world} processes: verl sft trains in one (rank 0) with the global batch "
            "(data.train_batch_size); the other ranks exit",
            file=sys.stderr,
        )
    return run_verl_command("sft", verl_config, argv)
