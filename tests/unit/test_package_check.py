"""A run is refused at its start when a package it needs is missing, too old or broken (``PackageError``,
exit code 7), as ``verl doctor`` would report it; the rest of the run's checks come first."""

from __future__ import annotations

import pytest

import verl.doctor.packages as packages
from tests.unit.test_doctor import GOOD, FakeMetadata
from verl.cli import main
from verl.config import load_config
from verl.doctor.packages import check_packages
from verl.errors import PackageError

ARR = "actor_rollout_ref"


def test_a_package_older_than_verl_requires_is_refused() -> None:
    old_torch = FakeMetadata({**GOOD, "torch": "2.5.1"})
    with pytest.raises(PackageError, match=r"torch 2.5.1 is too old: pip install -U 'torch>="):
        check_packages(load_config("grpo", []), gguf=False, meta=old_torch)


def test_an_optional_package_is_needed_only_by_the_runs_that_use_it() -> None:
    without_peft = FakeMetadata(GOOD)
    check_packages(load_config("grpo", []), gguf=False, meta=without_peft)  # no LoRA: fine
    with pytest.raises(PackageError, match=r"LoRA .* needs peft, which is not installed"):
        check_packages(load_config("grpo", [f"{ARR}.model.lora_rank=8"]), gguf=False, meta=without_peft)


def test_verl_run_stops_before_building_anything(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("VERL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(
        packages, "InstalledMetadata", lambda: FakeMetadata({**GOOD, "transformers": "4.40.0"})
    )
    code = main(["run", f"trainer.default_local_dir={tmp_path / 'run'}"])
    assert code == PackageError.exit_code == 7
    assert "package error: transformers 4.40.0 is too old" in capsys.readouterr().err
    assert not (tmp_path / "home").exists() and not (tmp_path / "run").exists()
