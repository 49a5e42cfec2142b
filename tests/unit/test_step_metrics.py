"""verl's per-token timing metrics of a step (``timing_per_token_ms/<section>``)."""

from __future__ import annotations

import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.metrics import compute_timing_per_token_metrics


def test_generation_is_timed_per_response_token_and_the_passes_per_token_of_the_sequence() -> None:
    # two rows: prompts of 2 and 3 real tokens (left padded), responses of 2 and 4 (right padded)
    attention_mask = torch.tensor([[0, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
    response_mask = attention_mask[:, 3:].clone()
    batch = DataProto.from_dict(tensors={"attention_mask": attention_mask, "response_mask": response_mask})
    timing = {"gen": 0.3, "reward": 0.5, "update_actor": 1.1, "step": 2.0}

    metrics = compute_timing_per_token_metrics(batch, timing)

    # 6 response tokens, 11 tokens in all; sections verl does not report per token (reward, step) are left out,
    # and so are sections the step did not run (ref, values, adv, update_critic)
    assert metrics == {
        "timing_per_token_ms/gen": pytest.approx(300 / 6),
        "timing_per_token_ms/update_actor": pytest.approx(1100 / 11),
    }


def test_a_batch_without_tokens_does_not_divide_by_zero() -> None:
    attention_mask = torch.zeros(1, 4, dtype=torch.long)
    batch = DataProto.from_dict(
        tensors={"attention_mask": attention_mask, "response_mask": attention_mask[:, 2:]}
    )
    assert compute_timing_per_token_metrics(batch, {"gen": 0.2}) == {
        "timing_per_token_ms/gen": pytest.approx(200.0)
    }


def test_the_scripts_that_import_no_torch_skip_the_same_wall_clock_metrics() -> None:
    import importlib.util
    from pathlib import Path

    from verl.trainer.metrics import WALL_CLOCK_PREFIXES

    benchmarks = Path(__file__).resolve().parents[2] / "benchmarks"
    for name, constant in (("compare_metrics", "SKIP"), ("gpu_check", "WALL_CLOCK_PREFIXES")):
        spec = importlib.util.spec_from_file_location(name, benchmarks / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert getattr(module, constant) == WALL_CLOCK_PREFIXES, name
