"""KL estimators between the policy and the reference, and the controllers of their coefficient."""

from __future__ import annotations

from typing import Any

import torch


def _k2(delta: torch.Tensor) -> torch.Tensor:
    return 0.5 * delta.square()


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str = "kl") -> torch.Tensor:
    """Per-token estimate of KL(π‖π_ref) from samples of π (Schulman, "Approximating KL divergence", 2020).

    With Δ = logπ − logπ_ref:
    ``kl``/``k1``: Δ;  ``abs``: |Δ|;  ``mse``/``k2``: ½Δ²;  ``low_var_kl``/``k3``: e^{−Δ} + Δ − 1
    (inputs clamped to ±20, output to [−10, 10]). A ``+`` suffix (``k3+``) keeps the value of the
    chosen estimator but takes the gradient of k2, which is the unbiased gradient of the KL.
    """
    if kl_penalty.endswith("+"):
        value = kl_penalty_forward(logprob, ref_logprob, kl_penalty[:-1])
        grad_path = _k2(logprob - ref_logprob)
        return grad_path + (value - grad_path).detach()
    return kl_penalty_forward(logprob, ref_logprob, kl_penalty)


def kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    delta = logprob - ref_logprob
    if kl_penalty in ("kl", "k1"):
        return delta
    if kl_penalty == "abs":
        return delta.abs()
    if kl_penalty in ("mse", "k2"):
        return _k2(delta)
    if kl_penalty in ("low_var_kl", "k3"):
        delta = torch.clamp(delta, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(-delta) + delta - 1.0, min=-10.0, max=10.0)
    raise ValueError(
        f"unknown kl_penalty {kl_penalty!r}; choose kl/k1, abs, mse/k2, low_var_kl/k3 (or with '+')"
    )


class FixedKLController:
    """A constant KL coefficient β."""

    def __init__(self, kl_coef: float) -> None:
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController:
    """Ziegler et al. 2019 (arXiv 1909.08593): β ← β·(1 + clip(KL/target − 1, ±0.2)·n_steps/horizon)."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = max(-0.2, min(0.2, current_kl / self.target - 1.0))
        self.value *= 1.0 + proportional_error * n_steps / self.horizon


def get_kl_controller(kl_ctrl: Any) -> FixedKLController | AdaptiveKLController:
    if kl_ctrl.type == "fixed":
        return FixedKLController(kl_ctrl.kl_coef)
    if kl_ctrl.type == "adaptive":
        return AdaptiveKLController(kl_ctrl.kl_coef, kl_ctrl.target_kl, kl_ctrl.horizon)
    raise ValueError(f"unknown algorithm.kl_ctrl.type {kl_ctrl.type!r}; choose fixed or adaptive")
