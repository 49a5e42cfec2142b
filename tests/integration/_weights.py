"""Comparing the weights of two runs that differ only by float rounding (shared by the integration tests)."""

from __future__ import annotations


def assert_same_adam_update(after_a, after_b, lr, optimizer_steps, close=1e-5, rtol=1e-5, max_outliers=1e-3):
    """Two runs that differ only by float rounding in their gradients end with the same weights, to the
    precision AdamW allows.

    Error analysis: Adam moves each weight by lr * m / (sqrt(v) + eps) per step, about lr * sign(g) for
    a weight whose gradient is far from zero, whatever its size. A rounding-level change of g changes
    that step by a rounding-level amount, so such weights agree to ``close``. A weight whose gradient is
    itself at rounding level (near zero) can get a step of either sign: it may differ by up to
    2 * lr per optimizer step. Those weights must be rare (at most ``max_outliers`` of the elements),
    and none may differ by more than Adam's bound; which few they are depends on the CPU's float
    kernels, so the test does not pin them.
    """
    bound = 2 * lr * optimizer_steps * 1.01
    total = outliers = 0
    for key, a in after_a.items():
        diff = (after_b[key] - a).abs()
        assert diff.max().item() <= bound, f"{key}: {diff.max().item():.3g} exceeds Adam's bound {bound:.3g}"
        outliers += int((diff > close + rtol * a.abs()).sum())
        total += a.numel()
    assert outliers <= max(1, max_outliers * total), (
        f"{outliers} of {total} weights differ by more than {close}"
    )
