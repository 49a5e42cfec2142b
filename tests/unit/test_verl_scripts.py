"""verl's own launch scripts, with only model and data paths changed, through ``python -m verl.trainer.main_ppo
--print-config``: every script resolves, and every key of ours it sets takes its value.

The command lines are in ``tests/data/verl_scripts/*.json``, each with the verl commit and script it was taken
from (the script run with its default environment, its ``python3`` replaced by a recorder of argv).
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml
from _verl_scripts import PPO_SCRIPTS, SCRIPTS, SFT_SCRIPTS, script_argv

from verl.config import TrainerConfig
from verl.config.loader import schema_fields
from verl.config.overrides import parse_override
from verl.config.verl_compat import renamed, rule_for


def print_config(argv: list[str]) -> tuple[int, str, str]:
    from verl.trainer.main_ppo import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(["--print-config", *argv])
    return rc, out.getvalue(), err.getvalue()


def _select(cfg: dict, key: str):
    node = cfg
    for part in key.split("."):
        node = node[part]
    return node


# Scripts refused on purpose, and the message that says why.
REFUSED = {
    # RLOO with verl's default rollout.n=1, where verl quietly drops the baseline (the script sets no n)
    "rollout_correction": "algorithm.adv_estimator=rloo compares the responses to each prompt with each other",
}


def test_the_recorded_scripts_cover_the_issue_list() -> None:
    wanted = {"grpo", "ppo", "rloo", "reinforce_plus_plus", "remax", "gspo", "dapo", "lora", "quickstart"}
    assert wanted <= set(PPO_SCRIPTS)


@pytest.mark.parametrize("name", PPO_SCRIPTS)
def test_a_verl_script_resolves_and_its_keys_take_effect(name: str, tmp_path: Path) -> None:
    argv = script_argv(name, tmp_path)
    rc, out, err = print_config(argv)
    if name in REFUSED:
        assert rc == 2 and REFUSED[name] in err, err
        return
    assert rc == 0, err
    cfg = yaml.safe_load(out)
    mapped = cfg["compat"]["mapped"]
    fields = schema_fields(TrainerConfig)
    for text in argv:
        ov = parse_override(text)
        if ov.key not in fields or fields[ov.key].section or ov.key in mapped:
            continue
        value = _select(cfg, ov.key)
        expected = [ov.value] if isinstance(value, list) and isinstance(ov.value, str) else ov.value
        if isinstance(expected, str) and expected.startswith("~"):
            expected = str(Path(expected).expanduser())
        assert value == expected or str(value) == str(expected), (text, value)
    # every verl key that is not ours is read onto ours (a rename) or accounted for in the printed report
    for text in argv:
        ov = parse_override(text)
        parts = ov.key.split(".")
        if any(".".join(parts[:i]) in fields for i in range(1, len(parts) + 1)):
            continue
        rule = rule_for(ov.key)
        if rule is not None and rule.kind == "rename" and not rule.deprecated:
            assert _select(cfg, renamed(ov.key, rule)) == ov.value, text
        else:  # reported: the key, or the verl key holding it when verl's value there is a whole mapping
            report = "\n".join(line for line in out.splitlines() if line.startswith("# verl:"))
            assert any(f"{'.'.join(parts[:i])}=" in report for i in range(len(parts), 1, -1)), ov.key


def test_verls_rollout_correction_script_runs_bypass_reinforce_once_it_has_groups(tmp_path: Path) -> None:
    argv = [*script_argv("rollout_correction", tmp_path), "actor_rollout_ref.rollout.n=4"]
    rc, out, err = print_config(argv)
    assert rc == 0, err
    correction = yaml.safe_load(out)["algorithm"]["rollout_correction"]
    assert correction == {
        "rollout_is": "sequence",
        "rollout_is_threshold": 2.0,
        "rollout_is_batch_normalize": True,
        "rollout_rs": None,
        "rollout_rs_threshold": None,
        "bypass_mode": True,
        "loss_type": "reinforce",
    }


SFT_ENTRIES = {"verl.trainer.fsdp_sft_trainer": "fsdp_sft_trainer", "verl.trainer.sft_trainer": "sft_trainer"}


@pytest.mark.parametrize("name", SFT_SCRIPTS)
def test_a_verl_sft_script_resolves(name: str, tmp_path: Path) -> None:
    from verl.trainer.sft_entry import run_verl_sft

    module = json.loads((SCRIPTS / f"{name}.json").read_text())["module"]
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = run_verl_sft(["--print-config", *script_argv(name, tmp_path)], SFT_ENTRIES[module])
    assert rc == 0, err.getvalue()
    cfg = yaml.safe_load(out.getvalue())
    assert cfg["model"]["path"] == f"{tmp_path}/model"
    if name == "v05_sft_gemma":  # verl's old field selection: extra_info + prompt_dict_keys=[question]
        assert (cfg["data"]["prompt_key"], cfg["data"]["response_key"]) == (
            "extra_info.question",
            "extra_info.answer",
        )
        assert cfg["trainer"]["default_local_dir"] == f"{tmp_path}/out"
    if name == "sft_qwen05":  # verl's engine-based SFT reads whole chats
        assert cfg["data"]["messages_key"] == "messages" and cfg["optim"]["lr"] == pytest.approx(1e-4)
