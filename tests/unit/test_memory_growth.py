"""benchmarks/memory_growth.py's summary: growth counted from the first sample at or after the warm-up."""

from __future__ import annotations

import pytest

from benchmarks.memory_growth import summary


def test_growth_is_measured_from_the_warm_up_to_the_last_sample():
    samples = {0: 500.0, 100: 900.0, 500: 1000.0, 1000: 1010.0, 2000: 1020.0}
    result = summary(samples, warmup=500)
    assert (result["from_step"], result["to_step"]) == (500, 2000)
    assert result["growth_pct"] == pytest.approx(2.0)
    assert result["mb_per_step"] == pytest.approx(20 / 1500)
    # the least-squares line through (500, 1000), (1000, 1010), (2000, 1020): mean step 3500/3, mean RSS
    # 1010, so the RSS deviations are -10, 0, +10 and the slope is sum(dx * dy) / sum(dx^2)
    dx = [500 - 3500 / 3, 1000 - 3500 / 3, 2000 - 3500 / 3]
    slope = (dx[0] * -10 + dx[2] * 10) / sum(d * d for d in dx)
    assert result["fitted_mb_per_step"] == pytest.approx(slope)
    assert result["fitted_growth_pct"] == pytest.approx(100 * slope * 1500 / 1010)


def test_a_warm_up_between_samples_starts_at_the_next_one_and_past_the_end_at_the_last():
    samples = {0: 500.0, 50: 600.0, 100: 660.0}
    assert summary(samples, warmup=60)["from_step"] == 100
    assert summary(samples, warmup=60)["growth_pct"] == 0.0
    assert summary(samples, warmup=60)["fitted_mb_per_step"] == 0.0  # one sample: no line
    assert summary(samples, warmup=500)["from_step"] == 100
