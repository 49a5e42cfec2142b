"""verl 0.9.1 parity of the config: its generated ppo_trainer config loads whole, its ``reward.*`` namespace acts
(with the legacy top-level keys as aliases, a conflict between the two named), its new keys act or are refused
with the reason, and its V1-trainer and on-policy-distillation launch scripts resolve with ``--print-config``
(distillation on, its teachers' settings read or reported).

Fixtures: ``tests/data/verl_configs/v0.9.1_ppo_trainer.yaml`` (verl 0.9.1's
``verl/trainer/config/_generated_ppo_trainer.yaml``, from the PyPI wheel) and ``tests/data/verl_scripts/v09/``
(the scripts' recorded command lines; see that folder's README).
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from _verl_scripts import PATHS

from verl.config import ConfigError, TrainerConfig, load_config
from verl.config.loader import schema_fields
from verl.config.overrides import parse_override
from verl.config.verl_compat import notices, renamed, rule_for, verl_keys
from verl.protocol import DataProto
from verl.workers.reward import load_reward_manager
from verl.workers.reward.limited import TIMEOUT_KEY, RateLimitedRewardManager, TokenBucket

DATA = Path(__file__).resolve().parent.parent / "data"
GENERATED = DATA / "verl_configs" / "v0.9.1_ppo_trainer.yaml"
SCRIPTS = DATA / "verl_scripts" / "v09"
ARR = "actor_rollout_ref"


def ppo(*overrides: str):
    """verl's defaults with overrides, as ``python -m verl.trainer.main_ppo`` loads them."""
    return load_config("ppo_trainer", list(overrides))


def _leaves(node: dict, prefix: str = "") -> dict:
    out: dict = {}
    for key, value in node.items():
        if isinstance(value, dict) and value:
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# ------------------------------------------------------------------------------ the generated config, whole
def test_the_generated_091_config_loads_whole_and_its_values_are_read() -> None:
    cfg = load_config(GENERATED)
    assert cfg.compat.no_effect == {} and cfg.compat.deprecated == {}  # nothing set away from verl's defaults
    assert dict(cfg.compat.mapped) == {"reward_model.num_workers": 8, "trainer.n_gpus_per_node": 8}
    assert cfg.reward_model.reward_manager == "naive" and cfg.reward_model.enable is False
    assert cfg.custom_reward_function.name == "compute_score"
    assert cfg.algorithm.filter_groups.metric == "seq_reward"  # verl 0.9.1's "reward": the pre-KL reward
    assert cfg[ARR].rollout.calculate_log_probs is True
    assert cfg.trainer.v1.separate_async.parameter_sync_step == 4
    assert cfg.trainer.v1.sampler.max_off_policy_threshold == 8
    # with Ray, verl's eight reward workers are eight here
    assert load_config(GENERATED, ["trainer.backend=ray"]).reward_model.num_workers == 8


def test_every_091_key_is_ours_or_has_a_rule_and_the_key_list_knows_the_release() -> None:
    ours = schema_fields(TrainerConfig)
    keys = _leaves(yaml.safe_load(GENERATED.read_text()))
    assert len(keys) == 898
    assert [k for k in keys if k not in ours and rule_for(k) is None] == []
    table = verl_keys("ppo_trainer")
    assert all(k in table and table[k]["until"] is None for k in keys)
    assert table["trainer.checkpoint_callback_class"]["since"] == "v0.9.1"
    assert table["algorithm.filter_groups.metric"]["default"] == "reward"
    assert (
        table[f"{ARR}.actor.router_replay.mode"]["until"] == "1dda039b9"
    )  # gone from the FSDP config in 0.9.1
    assert table["reward.timeout"]["default"] == 300.0  # read by verl's code, not in its generated config


# ------------------------------------------------------------------------------ reward.* and its aliases
@pytest.mark.parametrize(
    ("new", "legacy", "ours", "value"),
    [
        ("reward.num_workers=3", "reward_model.num_workers=3", "reward_model.num_workers", 3),
        (
            "reward.reward_manager.name=dapo",
            "reward_model.reward_manager=dapo",
            "reward_model.reward_manager",
            "dapo",
        ),
        (
            "reward.custom_reward_function.path=/x.py",
            "custom_reward_function.path=/x.py",
            "custom_reward_function.path",
            "/x.py",
        ),
        (
            "reward.custom_reward_function.name=fn",
            "custom_reward_function.name=fn",
            "custom_reward_function.name",
            "fn",
        ),
        (
            "reward.reward_model.model_path=/rm",
            "reward_model.model.path=/rm",
            "reward_model.model.path",
            "/rm",
        ),
        ("+reward.timeout=30", "+reward_model.timeout=30", "reward_model.timeout_s", 30),
        ("+reward.max_rpm=120", "reward_model.max_rpm=120", "reward_model.max_rpm", 120),
    ],
)
def test_a_reward_key_and_its_legacy_alias_set_the_same_setting(
    new: str, legacy: str, ours: str, value
) -> None:
    from omegaconf import OmegaConf

    limited = ["reward_model.reward_manager=limited"] if ours.startswith("reward_model.max_") else []
    for spelling in (new, legacy, f"{new} {legacy}"):
        cfg = ppo("trainer.backend=ray", *limited, *spelling.split())
        assert OmegaConf.select(cfg, ours) == value, spelling


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("reward_model.enable=true", "reward.reward_model.enable=false"),
        ("custom_reward_function.path=/a.py", "reward.custom_reward_function.path=/b.py"),
        ("reward.reward_manager.name=dapo", "reward_model.reward_manager=naive"),
        ("+reward_model.timeout=5", "+reward.timeout=30"),
        ("reward_model.timeout_s=5", "+reward.timeout=30"),
    ],
)
def test_an_alias_and_its_new_key_with_different_values_is_an_error_naming_both(
    first: str, second: str
) -> None:
    with pytest.raises(ConfigError) as info:
        ppo(first, second)
    message = str(info.value)
    for text in (first, second):
        assert text.lstrip("+").split("=")[0] in message
    assert "two spellings of one setting" in message


def test_spellings_in_one_file_conflict_and_a_legacy_null_yields(tmp_path: Path) -> None:
    verls = "defaults:\n  - ppo_trainer\n  - _self_\n"  # on verl's defaults, as verl's own files are
    both = tmp_path / "both.yaml"
    both.write_text(verls + "reward_model:\n  enable: true\nreward:\n  reward_model:\n    enable: false\n")
    with pytest.raises(ConfigError, match="reward_model.enable=true and reward.reward_model.enable=false"):
        load_config(both)
    # verl's files write null for a legacy alias it does not use: the new key decides
    null = tmp_path / "null.yaml"
    null.write_text(
        verls + "custom_reward_function:\n  path: null\nreward:\n  custom_reward_function:\n    path: /x.py\n"
    )
    assert load_config(null).custom_reward_function.path == "/x.py"
    # a later source overrides an earlier one, whichever spelling each uses
    dapo = tmp_path / "dapo.yaml"
    dapo.write_text(verls + "reward_model:\n  reward_manager: dapo\n")
    assert load_config(dapo, ["reward.reward_manager.name=naive"]).reward_model.reward_manager == "naive"


class CharTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(str(i) for i in ids)


def _batch(n: int = 2) -> DataProto:
    return DataProto.from_dict(
        tensors={"responses": torch.ones(n, 3, dtype=torch.long), "response_mask": torch.ones(n, 3)},
        non_tensors={
            "data_source": np.array(["x"] * n, dtype=object),
            "reward_model": np.array([{"ground_truth": "1"}] * n, dtype=object),
        },
    )


def test_reward_keys_act_a_custom_function_and_the_limited_manager(tmp_path: Path) -> None:
    scorer = tmp_path / "score.py"
    scorer.write_text(
        "def my_fn(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.25\n"
    )
    cfg = ppo(
        f"reward.custom_reward_function.path={scorer}",
        "reward.custom_reward_function.name=my_fn",
        "reward.reward_manager.name=limited",
        "+reward.timeout=30",
        "+reward.max_rpm=120",
        "+reward.max_tpm=6000",
        "+reward.estimated_tokens_per_request=50",
        "+reward.max_concurrent=4",
    )
    assert "reward.max_concurrent" in cfg.compat.no_effect
    manager = load_reward_manager(cfg, CharTokenizer())
    assert isinstance(manager, RateLimitedRewardManager)
    assert manager.time_limit.timeout_s == 30 and manager.error_policy == "zero"
    assert (manager.requests.rate, manager.tokens.rate, manager.estimated_tokens_per_request) == (
        2.0,
        100.0,
        50,
    )
    out = manager(_batch(), return_dict=True)
    assert out["reward_tensor"][:, -1].tolist() == [0.25, 0.25]
    assert out["reward_extra_info"][TIMEOUT_KEY] == [False, False]


def test_the_limited_manager_scores_a_timeout_or_an_error_zero_and_marks_it() -> None:
    import time

    def score(data_source, solution_str, ground_truth, extra_info=None):
        if score.calls == 0:
            score.calls += 1
            time.sleep(0.5)
        elif score.calls == 1:
            score.calls += 1
            raise RuntimeError("judge unavailable")
        return 1.0

    score.calls = 0
    manager = RateLimitedRewardManager(CharTokenizer(), compute_score=score, timeout_s=0.1)
    out = manager(_batch(3), return_dict=True)
    assert out["reward_tensor"][:, -1].tolist() == [0.0, 0.0, 1.0]
    assert out["reward_extra_info"][TIMEOUT_KEY] == [True, False, False]
    assert out["reward_extra_info"]["reward_error"] == [True, True, False]


def test_the_token_bucket_paces_calls_as_verls_does() -> None:
    now, slept = [0.0], []
    bucket = TokenBucket(2.0, clock=lambda: now[0], sleep=slept.append)  # 120 a minute: 2 a second, 2 saved
    assert [bucket.acquire(1.0) for _ in range(3)] == [0.0, 0.0, 0.5]
    now[0] += 10.0  # refilled, but never beyond one second's worth
    assert bucket.acquire(2.0) == 0.0 and bucket.acquire(1.0) == 0.5
    assert bucket.acquire(5.0) == pytest.approx(3.0)  # more than it holds: waits for the deficit
    assert slept == [0.5, 0.5, pytest.approx(3.0)]


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["reward.reward_manager.name=gdpo"], "GDPO"),
        (["reward.reward_manager.name=remote"], "Ray tasks"),
        (["+reward.max_rpm=60"], "rate limits are the limited manager's"),
        (["reward.reward_manager.name=limited", "+reward.max_tpm=0"], "reward_model.max_tpm must be >= 1"),
    ],
)
def test_reward_settings_not_built_are_refused_with_the_reason(overrides: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        ppo(*overrides)


# ------------------------------------------------------------------------------ the other keys of 0.9.1
def test_checkpoint_callback_class_is_read() -> None:
    assert ppo("trainer.checkpoint_callback_class=null").trainer.checkpoint_callback_class is None
    cfg = ppo("trainer.checkpoint_callback_class=my.Callback")
    assert cfg.trainer.checkpoint_callback_class == "my.Callback" and not cfg.compat.no_effect
    with pytest.raises(ConfigError, match="checkpoint_callback_class must be a fully qualified class name"):
        ppo("trainer.checkpoint_callback_class=Callback")


def test_router_and_checkpoint_engine_keys_load_with_their_reason() -> None:
    engine = f"{ARR}.rollout.checkpoint_engine"
    cfg = ppo(
        "trainer.device=cpu",
        f"{ARR}.rollout.router_config_path=router.yaml",
        f"{engine}.backend=nccl",
        f"{engine}.update_weights_bucket_megabytes=1024",
    )
    assert dict(cfg.compat.no_effect) == {f"{ARR}.rollout.router_config_path": "router.yaml"}
    # the weight sync reads the section: nccl needs CUDA, so on the CPU it is mapped to naive and said so
    assert cfg[ARR].rollout.checkpoint_engine.update_weights_bucket_megabytes == 1024
    assert cfg[ARR].rollout.checkpoint_engine.backend == "naive"
    assert cfg.compat.mapped[f"{engine}.backend"] == "nccl"
    text = "\n".join(notices(cfg))
    assert "load balancer" in text and "NCCL needs CUDA GPUs (trainer.device=cpu" in text
    assert "update_weights_bucket_megabytes=1024: read by the weight sync" in text
    kept = ppo("trainer.device=cuda", f"{engine}.backend=nccl")
    assert (
        kept[ARR].rollout.checkpoint_engine.backend == "nccl"
        and f"{engine}.backend" not in kept.compat.mapped
    )
    # verl <= 0.7's spelling of the bucket size, and verl's defaults
    old = ppo(f"{ARR}.rollout.update_weights_bucket_megabytes=512")
    assert old[ARR].rollout.checkpoint_engine.update_weights_bucket_megabytes == 512
    assert dict(old.compat.deprecated) == {f"{ARR}.rollout.update_weights_bucket_megabytes": 512}
    assert dict(ppo()[ARR].rollout.checkpoint_engine) == {
        "backend": "naive",
        "update_weights_bucket_megabytes": 2048,
    }


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("backend=nixl", "backend=nixl: moves the weights with NVIDIA's NIXL library over RDMA"),
        ("backend=mooncake", "Mooncake transfer engine over RDMA"),
        ("backend=kimi_ckpt_engine", "needs its library and NPUs"),
        ("backend=delta_sharded", "needs CUDA GPUs and a disaggregated rollout"),
        ("backend=hccl", "backend must be one of naive, nccl"),
        ("update_weights_bucket_megabytes=0", "update_weights_bucket_megabytes must be >= 1"),
        ("+custom_backend_module=my.engines", "no such registry here"),
    ],
)
def test_checkpoint_engine_backends_not_runnable_here_are_refused_with_why(
    override: str, fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment):
        ppo(
            f"{override[0] if override.startswith('+') else ''}{ARR}.rollout.checkpoint_engine.{override.lstrip('+')}"
        )


def test_filter_groups_metric_reward_reads_the_pre_kl_reward() -> None:
    assert ppo("algorithm.filter_groups.metric=reward").algorithm.filter_groups.metric == "seq_reward"
    assert ppo().algorithm.filter_groups.metric == "seq_reward"  # the default: the same quantity
    assert ppo("algorithm.filter_groups.metric=acc").algorithm.filter_groups.metric == "acc"


def test_calculate_log_probs_is_on_by_default_where_the_engine_returns_them() -> None:
    assert ppo()[ARR].rollout.calculate_log_probs is None  # on: fast / vllm / sglang always return them
    assert ppo(f"{ARR}.rollout.name=hf")[ARR].rollout.calculate_log_probs is None  # hf: only when asked
    assert ppo(f"{ARR}.rollout.name=hf", f"{ARR}.rollout.calculate_log_probs=true")[
        ARR
    ].rollout.calculate_log_probs
    with pytest.raises(ConfigError, match="calculate_log_probs=true has no effect with rollout.name=dummy"):
        ppo(f"{ARR}.rollout.name=dummy", f"{ARR}.rollout.calculate_log_probs=true")


@pytest.mark.parametrize("mode", ["colocate_async", "separate_async"])
def test_num_warmup_batches_whole_as_a_float_is_read_and_a_fraction_in_both_modes(mode: str) -> None:
    key = f"trainer.v1.{mode}.num_warmup_batches"
    cfg = ppo(
        f"trainer.v1.trainer_mode={mode}", f"{key}=2.0", "trainer.v1.separate_async.parameter_sync_step=null"
    )
    assert cfg.trainer.v1[mode].num_warmup_batches == 2 and isinstance(
        cfg.trainer.v1[mode].num_warmup_batches, int
    )
    overrides = (
        f"trainer.v1.trainer_mode={mode}",
        f"{key}=1.5",
        "trainer.v1.separate_async.parameter_sync_step=null",
    )
    assert ppo(*overrides).trainer.v1[mode].num_warmup_batches == 1.5
    with pytest.raises(ConfigError, match=rf"{key} must be >= 0"):
        ppo(*overrides[:1], f"{key}=-0.5", *overrides[2:])


def test_off_policy_bound_and_strategy() -> None:
    sampler = "trainer.v1.sampler"
    off = ppo("trainer.v1.trainer_mode=separate_async", f"{sampler}.max_off_policy_threshold=null",
              "trainer.v1.separate_async.parameter_sync_step=null")  # fmt: skip
    assert off.trainer.v1.sampler.max_off_policy_threshold is None  # a fixed depth: nothing to bound
    assert ppo(f"{sampler}.max_off_policy_strategy=wait").trainer.v1.sampler.max_off_policy_strategy == "wait"
    # verl 0.9.1: null turns the bound off in the pool modes too
    none = ppo("trainer.v1.trainer_mode=colocate_async", f"{sampler}.max_off_policy_threshold=null")
    assert none.trainer.v1.sampler.max_off_policy_threshold is None
    # verl's dropless strategy, in both pool modes: a generation that reached the bound is finished and trained
    wait = f"{sampler}.max_off_policy_strategy=wait"
    assert (
        ppo("trainer.v1.trainer_mode=colocate_async", wait).trainer.v1.sampler.max_off_policy_strategy
        == "wait"
    )
    stream = ppo("trainer.v1.trainer_mode=separate_async", "async_training.staleness_threshold=0.5", wait,
                 "trainer.v1.separate_async.parameter_sync_step=null")  # fmt: skip
    assert stream.trainer.v1.sampler.max_off_policy_strategy == "wait"
    with pytest.raises(ConfigError, match="must be one of drop, wait"):
        ppo(f"{sampler}.max_off_policy_strategy=block")


def test_hybrid_engine_false_only_with_separate_async_and_transfer_queue_loads() -> None:
    cfg = ppo(
        "trainer.v1.trainer_mode=separate_async",
        f"{ARR}.hybrid_engine=false",
        "transfer_queue.enable=true",
        "trainer.v1.separate_async.parameter_sync_step=null",
    )
    assert (
        cfg.compat.no_effect[f"{ARR}.hybrid_engine"] is False
        and cfg.compat.no_effect["transfer_queue.enable"]
    )
    with pytest.raises(ConfigError, match="hybrid_engine=false: .* it is sync"):
        ppo(f"{ARR}.hybrid_engine=false")


def test_every_distillation_key_loads_and_the_teachers_keys_are_read() -> None:
    keys = [k for k in _leaves(yaml.safe_load(GENERATED.read_text())) if k.startswith("distillation.")]
    assert len(keys) > 40
    cfg = ppo(
        "distillation.distillation_loss.loss_mode=k1",  # verl checks the loss only with distillation on
        "distillation.teacher_models.teacher_model.model_path=/teacher",
        "+distillation.teacher_models.gsm8k.inference.tensor_model_parallel_size=2",
        "distillation.n_gpus_per_node=4",
    )
    assert cfg.distillation.teacher_models.teacher_model.model_path == "/teacher"
    assert cfg.distillation.distillation_loss.loss_mode == "k1"
    assert cfg.compat.no_effect["distillation.teacher_models.gsm8k.inference.tensor_model_parallel_size"] == 2
    assert cfg.compat.no_effect["distillation.n_gpus_per_node"] == 4
    assert "inference" not in cfg.distillation.teacher_models.get("gsm8k", {})
    report = "\n".join(notices(cfg))
    assert "distillation.n_gpus_per_node=4" in report and "actor's worker processes" in report


def test_enabling_distillation_checks_the_loss_and_the_teachers_before_any_model_loads() -> None:
    on = ["distillation.enabled=true", f"{ARR}.model.path=/nowhere"]
    teacher = "distillation.teacher_models.teacher_model.model_path=/teacher"
    cfg = ppo(*on, teacher)  # no model is read: the paths are checked where the models load
    assert cfg.distillation.enabled is True
    cases = [
        ([], "distillation.teacher_models.teacher_model.model_path must be set"),
        ([teacher, "distillation.distillation_loss.loss_mode=k1"], "does not depend on the teacher"),
        ([teacher, "distillation.distillation_loss.loss_mode=forward_kl"], "did you mean 'forward_kl_topk'"),
        ([teacher, "distillation.distillation_loss.policy_loss_mode=gspo"], "only vanilla"),
        ([teacher, "+distillation.teacher_models.teacher_model.model_pth=/t"], "a teacher entry takes key"),
        (["+distillation.teacher_models.a.model_path=/a", "+distillation.teacher_models.b.model_path=/b"],
         "distillation.teacher_models.a.key must be set"),
        ([teacher, "distillation.distillation_loss.loss_max_clamp=0"], "loss_max_clamp must be > 0"),
    ]  # fmt: skip
    for extra, message in cases:
        with pytest.raises(ConfigError, match=message):
            ppo(*on, *extra)
    # GRPO's groups need rollout.n >= 2, unless the task's advantages train nothing (verl's OPD scripts)
    one = (*on, teacher, "algorithm.adv_estimator=grpo", f"{ARR}.rollout.n=1")
    with pytest.raises(ConfigError, match="or distil without task rewards"):
        ppo(*one)
    assert ppo(*one, "distillation.distillation_loss.use_task_rewards=false")[ARR].rollout.n == 1


# ------------------------------------------------------------------------------ the scripts
SCRIPT_NAMES = sorted(p.stem for p in SCRIPTS.glob("*.json"))
OPD = {"v09_opd", "v09_mopd"}


def _argv(name: str, tmp: Path) -> list[str]:
    argv = []
    for arg in json.loads((SCRIPTS / f"{name}.json").read_text())["argv"]:
        prefix = arg[: len(arg) - len(arg.lstrip("+~"))]
        key = arg.lstrip("+~").split("=")[0]
        argv.append(f"{prefix}{key}={PATHS[key].format(tmp=tmp, out=tmp / 'out')}" if key in PATHS else arg)
    return argv


def _print_config(argv: list[str]) -> tuple[int, str, str]:
    from verl.trainer.main_ppo import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(["--print-config", *argv])
    return rc, out.getvalue(), err.getvalue()


def test_the_recorded_091_scripts() -> None:
    assert set(SCRIPT_NAMES) == {*OPD, "v09_v1_separate_async", "v09_v1_colocate_async_disrm"}


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_a_091_script_resolves_and_its_keys_take_effect(name: str, tmp_path: Path) -> None:
    argv = _argv(name, tmp_path)
    rc, out, err = _print_config(argv)
    assert rc == 0, err
    cfg = yaml.safe_load(out)
    fields, mapped = schema_fields(TrainerConfig), cfg["compat"]["mapped"]
    report = "\n".join(line for line in out.splitlines() if line.startswith("# verl:"))
    for text in argv:
        ov = parse_override(text)
        rule = rule_for(ov.key)
        key = renamed(ov.key, rule) if ov.key not in fields and rule and rule.kind == "rename" else ov.key
        if key.startswith("distillation.teacher_models.") and rule.kind == "rename":  # read into our mapping
            value = cfg
            for part in key.split("."):
                value = value[part]
            assert value == ov.value, (text, value)
        elif key in fields and not fields[key].section and key not in mapped:
            value = cfg
            for part in key.split("."):
                value = value[part]
            expected = [ov.value] if isinstance(value, list) and isinstance(ov.value, str) else ov.value
            assert value == expected or str(value) == str(expected), (text, value)
        elif key not in fields:  # reported, or under a verl mapping that is reported whole
            parts = key.split(".")
            assert any(f"{'.'.join(parts[:i])}=" in report for i in range(len(parts), 1, -1)), key
    if name == "v09_v1_colocate_async_disrm":
        assert cfg["reward_model"]["enable"] is True and cfg["reward_model"]["reward_manager"] == "dapo"
        assert cfg["trainer"]["v1"]["trainer_mode"] == "colocate_async"
    if name in OPD:  # verl's OPD: one response per prompt, the distillation loss alone, as a reward
        distillation = cfg["distillation"]
        assert distillation["enabled"] is True and cfg[ARR]["rollout"]["n"] == 1
        assert distillation["distillation_loss"]["use_policy_gradient"] is True
        teachers = {
            e["key"]: e["model_path"] for e in distillation["teacher_models"].values() if e["model_path"]
        }
        expected = {None: "Qwen/Qwen3-32B"} if name == "v09_opd" else {
            "openai/gsm8k": "Qwen/Qwen3-32B", "hiyouga/geometry3k": "Qwen/Qwen3-VL-32B-Instruct"}  # fmt: skip
        assert teachers == expected
        assert "timing" not in report and "teacher (" not in report  # (nothing about the step plan here)
    if name == "v09_v1_separate_async":
        assert cfg["trainer"]["v1"]["separate_async"]["parameter_sync_step"] == 4
