"""Shared by the test_config*.py files: the ``actor_rollout_ref`` prefix, a fixture that keeps ``VERL_HOME``
out of the tests, and a helper that writes a YAML recipe."""

from __future__ import annotations

from pathlib import Path

import pytest

ARR = "actor_rollout_ref"


@pytest.fixture(autouse=True)
def _verl_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VERL_HOME", raising=False)


def write(tmp_path: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path
