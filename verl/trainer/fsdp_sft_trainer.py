"""``python -m verl.trainer.fsdp_sft_trainer``: verl's SFT launch command (until verl 0.7), running ``verl sft``.

verl's SFT scripts start it under ``torchrun --nproc_per_node=N``; here SFT trains in one process, so rank 0
trains (with the global batch, as verl's data.train_batch_size is) and the other ranks exit at once.
``--print-config`` prints the resolved config and how each of verl's keys was read.
"""

from __future__ import annotations

import sys

from verl.trainer.sft_entry import run_verl_sft

VERL_CONFIG = "fsdp_sft_trainer"
"""the recipe holding verl's fsdp_sft_trainer defaults (prompt_key=question, response_key=answer)"""


if __name__ == "__main__":
    sys.exit(run_verl_sft(sys.argv[1:], VERL_CONFIG))
