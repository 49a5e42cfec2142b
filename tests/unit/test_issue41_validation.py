"""Issue 41: ``trainer.test_freq=-1`` means no validation during training (verl's rule), the last step included;
the end-of-run summary then has no "after RL" number to show."""

from __future__ import annotations

import pytest

from verl.cli_commands import _headline_line
from verl.trainer.rl_trainer import validates_after


@pytest.mark.parametrize("test_freq", [-1, 0])
def test_test_freq_off_never_validates_not_even_at_the_last_step(test_freq: int) -> None:
    assert [step for step in range(1, 11) if validates_after(step, 10, test_freq)] == []


def test_test_freq_validates_periodically_and_at_the_last_step() -> None:
    assert [step for step in range(1, 8) if validates_after(step, 7, 3)] == [3, 6, 7]
    assert [step for step in range(1, 7) if validates_after(step, 6, 3)] == [3, 6]  # the last one once
    assert [step for step in range(1, 3) if validates_after(step, 2, 100)] == [2]  # longer than the run


def test_summary_without_a_validation_after_training_claims_no_after_number() -> None:
    line = _headline_line("val-core/arithmetic/acc/mean@1", 0.135, None)
    assert line == "held-out val-core/arithmetic/acc/mean@1: before RL 13.5%"
