"""``python -m verl.trainer.main_ppo``: verl's launch command, running this repository's trainer.

verl's launch scripts start PPO-family training with this module and Hydra-style overrides
(``key=value``, ``+key=value``, ``~key``, ``--config-path`` / ``--config-name``). It is ``verl run`` with
verl's defaults (the ``ppo_trainer`` recipe: PPO with GAE, as in verl) instead of the GRPO demo recipe;
``--print-config`` (or Hydra's ``--cfg job``) prints the resolved config and how each of verl's keys was read.
"""

from __future__ import annotations

import sys

VERL_CONFIG = "ppo_trainer"
"""the recipe holding verl's ppo_trainer.yaml defaults"""


def main(argv: list[str] | None = None) -> int:
    """Run verl's PPO command line; returns the exit code (see :func:`verl.cli.main`)."""
    from verl.cli import run_verl_command

    return run_verl_command("run", VERL_CONFIG, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
