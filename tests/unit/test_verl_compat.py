"""verl's command line and keys: Hydra override forms, renames, keys with no effect, refusals, machine mapping."""

from __future__ import annotations

import pytest

from verl.config import ConfigError, TrainerConfig, load_config
from verl.config.loader import schema_fields
from verl.config.overrides import parse_override
from verl.config.verl_compat import notices, rule_for, verl_keys
from verl.config.verl_rules import PPO_RULES

ARR = "actor_rollout_ref"


def ppo(*overrides: str):
    """verl's defaults (the ppo_trainer recipe) with overrides, as `python -m verl.trainer.main_ppo` loads them."""
    return load_config("ppo_trainer", list(overrides))


# ------------------------------------------------------------------------------------------------ the key table
def test_every_verl_key_is_ours_or_has_a_rule() -> None:
    ours = schema_fields(TrainerConfig)
    missing = [k for k in verl_keys("ppo_trainer") if k not in ours and rule_for(k) is None]
    assert missing == []


def test_every_rule_is_used_by_a_verl_key_or_a_plus_key() -> None:
    """A rule no verl key reaches is dead text (the ``+`` keys verl's scripts add are listed here)."""
    plus_keys = [
        "reward_model.reward_kwargs.overlong_buffer_cfg.log",
        "reward.reward_kwargs.overlong_buffer_cfg.log",
        "reward_model.reward_kwargs.overlong_buffer_cfg.len",
        "reward.reward_kwargs.overlong_buffer_cfg.len",
        "reward_model.reward_kwargs.max_resp_len",
        "reward.reward_kwargs.max_resp_len",
        "reward_model.reward_kwargs.other",
        "reward.reward_kwargs.other",
        "model_engine",  # a Hydra group verl's scripts select by name
        "hydra.run.dir",
        "critic.fsdp.mixed_precision.param_dtype",  # verl >= 0.8's engine config: mixed_precision is null
    ]
    ours = schema_fields(TrainerConfig)
    used = {rule_for(k).pattern for k in [*verl_keys("ppo_trainer"), *plus_keys] if k not in ours}
    assert [r.pattern for r in PPO_RULES if r.pattern not in used] == []


def test_every_sft_key_is_ours_or_has_a_rule_and_every_rule_is_used() -> None:
    from verl.config.sft_schema import SFTConfig
    from verl.config.verl_rules import SFT_RULES

    ours = schema_fields(SFTConfig)
    keys = [k for k in verl_keys("sft_trainer") if k not in ours]
    assert [k for k in keys if rule_for(k, SFT_RULES) is None] == []
    used = {
        rule_for(k, SFT_RULES).pattern for k in [*keys, "engine", "model", "optim", "profiler", "hydra.run"]
    }
    assert [r.pattern for r in SFT_RULES if r.pattern not in used] == []


def test_rename_targets_are_our_keys() -> None:
    ours = schema_fields(TrainerConfig)
    for rule in PPO_RULES:
        if rule.kind == "rename":
            target = rule.target.rstrip("*").rstrip(".")
            assert target in ours, rule


# ------------------------------------------------------------------------------------------------ override grammar
@pytest.mark.parametrize(
    ("text", "op", "key", "value"),
    [
        ("a.b=1", "set", "a.b", 1),
        ("+a.b=1e-6", "add", "a.b", 1e-6),
        ("++a.b=x", "force_add", "a.b", "x"),
        ("~a.b", "delete", "a.b", None),
        ("~a.b=3", "delete", "a.b", 3),
        ("a.b=['/x.parquet', '/y.parquet']", "set", "a.b", ["/x.parquet", "/y.parquet"]),
        ('a.b=["console","wandb"]', "set", "a.b", ["console", "wandb"]),
        ("a.b=", "set", "a.b", ""),
        ("a.b=null", "set", "a.b", None),
        ("a.b=True", "set", "a.b", True),
        ("a.b=uv -v run --frozen", "set", "a.b", "uv -v run --frozen"),
        ("a-b.c_d=http://h:1/x?y=2", "set", "a-b.c_d", "http://h:1/x?y=2"),
        # Hydra's grammar, not YAML 1.1's: these stay strings
        ("a=yes", "set", "a", "yes"),
        ("a=on", "set", "a", "on"),
        ("a=010", "set", "a", "010"),
        ("a=1:30", "set", "a", "1:30"),
        ("a=x #y", "set", "a", "x #y"),
        ("a=1_000", "set", "a", 1000),
        ("a=.5", "set", "a", 0.5),
        ("a=FALSE", "set", "a", False),
        ("a=${b.c}", "set", "a", "${b.c}"),
    ],
)
def test_parse_override(text: str, op: str, key: str, value: object) -> None:
    ov = parse_override(text)
    assert (ov.op, ov.key, ov.value) == (op, key, value)


@pytest.mark.parametrize("text", ["a.b", "=1", "a..b=1", "+=1", "a b=1", "a.b=[1,2"])
def test_malformed_overrides_name_themselves(text: str) -> None:
    with pytest.raises(ConfigError, match="override"):
        parse_override(text)


def test_plus_and_delete_on_our_keys() -> None:
    cfg = ppo(
        "+trainer.total_training_steps=3", "++data.train_batch_size=512", "trainer.logger=[console,wandb]"
    )
    assert (cfg.trainer.total_training_steps, cfg.data.train_batch_size) == (3, 512)
    # ~key: back to the entry point's default (verl's, under main_ppo), before any override
    cfg = ppo("trainer.total_training_steps=3", "~trainer.total_training_steps")
    assert cfg.trainer.total_training_steps is None
    cfg = ppo(
        "algorithm.adv_estimator=grpo",
        "~algorithm.adv_estimator",
        "trainer.project_name=p",
        "~trainer.project_name",
    )
    assert (cfg.algorithm.adv_estimator, cfg.trainer.project_name) == ("gae", "verl_examples")
    assert ppo("data.train_batch_size=512", "~data.train_batch_size=512").data.train_batch_size == 1024
    with pytest.raises(ConfigError, match="data.train_batch_size is 1024, not 512"):
        ppo("~data.train_batch_size=512")
    # a verl key is forgotten
    assert (
        ppo(
            f"{ARR}.actor.fsdp_config.forward_prefetch=True", f"~{ARR}.actor.fsdp_config.forward_prefetch"
        ).compat.no_effect
        == {}
    )


def test_logger_as_one_word() -> None:
    assert list(ppo("trainer.logger=console").trainer.logger) == ["console"]


# ------------------------------------------------------------------------------------------------ dispositions
def test_no_effect_keys_are_recorded_and_reported_once_grouped_by_reason() -> None:
    cfg = ppo(
        f"{ARR}.actor.fsdp_config.forward_prefetch=True",
        f"{ARR}.ref.fsdp_config.forward_prefetch=True",
        f"{ARR}.rollout.scheduling_policy=priority",
        "+ray_kwargs.ray_init.runtime_env.py_executable=uv run",
    )
    assert dict(cfg.compat.no_effect) == {
        f"{ARR}.actor.fsdp_config.forward_prefetch": True,
        f"{ARR}.ref.fsdp_config.forward_prefetch": True,
        f"{ARR}.rollout.scheduling_policy": "priority",
        "ray_kwargs.ray_init.runtime_env.py_executable": "uv run",
    }
    lines = [line for line in notices(cfg) if line.startswith("no effect here")]
    fsdp = [line for line in lines if "forward_prefetch" in line]
    assert len(fsdp) == 1 and "actor.fsdp_config" in fsdp[0] and "ref.fsdp_config" in fsdp[0]
    assert "FSDP2 gathers the next layer" in fsdp[0]
    assert any("scheduling_policy=priority" in line and "inference-server" in line for line in lines)


def test_dapo_spellings() -> None:
    cfg = ppo(
        "reward_model.reward_manager=dapo",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len=64",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False",
        "+reward_model.reward_kwargs.max_resp_len=512",
    )
    assert dict(cfg.reward_model.overlong_buffer) == {"enable": True, "len": 64, "penalty_factor": 0.5}
    # the newer spelling under reward.*
    cfg = ppo("reward.reward_manager.name=dapo", "+reward.reward_kwargs.overlong_buffer_cfg.enable=True")
    assert cfg.reward_model.reward_manager == "dapo" and cfg.reward_model.overlong_buffer.enable
    with pytest.raises(ConfigError, match=r"max_resp_len=100: .*data.max_response_length \(512\)"):
        ppo("reward_model.reward_manager=dapo", "+reward_model.reward_kwargs.max_resp_len=100")


def test_custom_reward_function_spellings() -> None:
    cfg = ppo("reward.custom_reward_function.path=/x/r.py", "reward.custom_reward_function.name=score")
    assert (cfg.custom_reward_function.path, cfg.custom_reward_function.name) == ("/x/r.py", "score")


def test_renamed_keys() -> None:
    cfg = ppo(
        f"{ARR}.actor.optim.clip_grad=0.5",
        f"{ARR}.actor.optim.warmup_style=cosine",
        f"{ARR}.actor.tau_pos=2.0",
        f"{ARR}.actor.use_remove_padding=False",
    )
    actor = cfg[ARR].actor
    assert (actor.grad_clip, actor.optim.lr_scheduler_type, actor.policy_loss.tau_pos) == (0.5, "cosine", 2.0)
    assert cfg[ARR].model.use_remove_padding is False
    assert (
        f"{ARR}.actor.optim.warmup_style=cosine: verl's deprecated spelling; read as {ARR}.actor.optim.lr_scheduler_type"
        in notices(cfg)
    )


def test_old_global_micro_batch_sizes_are_divided_by_the_ranks() -> None:
    cfg = ppo(f"{ARR}.actor.ppo_micro_batch_size=32", f"{ARR}.rollout.log_prob_micro_batch_size=16")
    assert cfg[ARR].actor.ppo_micro_batch_size_per_gpu == 4  # verl's default: 8 GPUs
    assert cfg[ARR].rollout.log_prob_micro_batch_size_per_gpu == 2
    assert any(
        "read as actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4" in line for line in notices(cfg)
    )
    cfg = ppo("trainer.n_gpus_per_node=2", "critic.ppo_micro_batch_size=8")
    assert cfg.critic.ppo_micro_batch_size_per_gpu == 4
    with pytest.raises(ConfigError, match="both set"):
        ppo(f"{ARR}.actor.ppo_micro_batch_size=32", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=4")
    # floored as verl does (12 // 8); fewer samples than ranks is refused, as verl refuses it
    assert ppo(f"{ARR}.actor.ppo_micro_batch_size=12")[ARR].actor.ppo_micro_batch_size_per_gpu == 1
    with pytest.raises(ConfigError, match="divided over the 8 ranks .* must be an integer >= 8"):
        ppo(f"{ARR}.actor.ppo_micro_batch_size=4")
    # with Ulysses sequence parallelism verl divides by the data-parallel groups: 8 ranks // 2
    cfg = ppo(f"{ARR}.actor.ppo_micro_batch_size=4", f"{ARR}.actor.ulysses_sequence_parallel_size=2")
    assert cfg[ARR].actor.ppo_micro_batch_size_per_gpu == 1
    with pytest.raises(ConfigError, match="trainer.n_gpus_per_node must be an integer >= 1; got 0"):
        ppo("trainer.n_gpus_per_node=0", f"{ARR}.actor.ppo_micro_batch_size=8")


def test_resume_from_path() -> None:
    cfg = ppo("trainer.resume_mode=resume_path", "trainer.resume_from_path=/ck/global_step_5")
    assert cfg.trainer.resume_mode == "/ck/global_step_5"
    assert ppo("trainer.resume_from_path=/ck/global_step_5").trainer.resume_mode == "auto"
    with pytest.raises(ConfigError, match="resume_path needs trainer.resume_from_path"):
        ppo("trainer.resume_mode=resume_path")


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("reward_model.strategy=megatron", "Megatron"),
        ("reward_model.model.override_config={num_labels: 2}", "reward model's HuggingFace config"),
        ("algorithm.use_pf_ppo=True", "PF-PPO"),
        (f"{ARR}.rollout.multi_turn.interaction_config_path=x.yaml", "simulated users"),
        ("trainer.default_hdfs_dir=hdfs://x", "HDFS"),
    ],
)
def test_values_that_would_change_what_is_learned_are_refused(override: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match="accepted here") as info:
        ppo(override)
    assert fragment in str(info.value)
    assert override.split("=")[0] in str(info.value)


def test_refused_keys_are_accepted_at_the_values_that_mean_what_happens_here() -> None:
    cfg = ppo("algorithm.use_pf_ppo=False", f"{ARR}.hybrid_engine=True")
    assert "algorithm.use_pf_ppo" in cfg.compat.no_effect


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [
        (f"{ARR}.actor.fsdp_config.param_ofload", f"{ARR}.actor.fsdp_config.param_offload"),
        ("trainer.n_gpu_per_node", "trainer.n_gpus_per_node"),
        (f"{ARR}.rollout.enforce_eagr", f"{ARR}.rollout.enforce_eager"),
    ],
)
def test_unknown_keys_suggest_ours_or_verls(key: str, suggestion: str) -> None:
    with pytest.raises(ConfigError, match=f"unknown config key '{key}'; did you mean '{suggestion}'"):
        ppo(f"{key}=1")


def test_a_plus_key_nobody_reads_is_unknown() -> None:
    with pytest.raises(ConfigError, match="unknown config key 'trainer.my_flag'"):
        ppo("+trainer.my_flag=1")


# ------------------------------------------------------------------------------------------------ this machine
def test_gpu_counts_map_onto_one_local_process() -> None:
    cfg = ppo("trainer.n_gpus_per_node=8", "trainer.nnodes=2", "data.train_batch_size=512")
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (1, 1)
    assert dict(cfg.compat.mapped) == {"trainer.nnodes": 2, "trainer.n_gpus_per_node": 8}
    assert "= 2 x 8 = 16 ranks, with trainer.backend=local: training as 1 process" in notices(cfg)[0]
    # with Ray the ranks are workers, as asked
    cfg = ppo("trainer.n_gpus_per_node=2", "trainer.backend=ray")
    assert cfg.trainer.n_gpus_per_node == 2 and dict(cfg.compat.mapped) == {}


def test_the_grpo_recipe_is_unchanged_by_the_compat_layer() -> None:
    cfg = load_config()
    assert dict(cfg.compat.no_effect) == {} and dict(cfg.compat.mapped) == {}
    assert notices(cfg) == []


# ------------------------------------------------------------------------------------------------ verl-style files
def test_a_verl_style_config_file(tmp_path) -> None:
    from verl.cli import main

    (tmp_path / "my_grpo.yaml").write_text(
        "hydra:\n  searchpath: [file://verl/trainer/config]\n"
        "defaults:\n  - ppo_trainer\n  - _self_\n"
        "algorithm:\n  adv_estimator: grpo\n"
        "actor_rollout_ref:\n  rollout:\n    n: 4\n  actor:\n    fsdp_config:\n      use_orig_params: true\n"
    )
    cfg = load_config(str(tmp_path / "my_grpo.yaml"))
    assert cfg.algorithm.adv_estimator == "grpo" and cfg[ARR].rollout.n == 4
    assert cfg.trainer.project_name == "verl_examples"  # from ppo_trainer
    assert f"{ARR}.actor.fsdp_config.use_orig_params" in cfg.compat.no_effect
    assert main(["run", "--config-path", str(tmp_path), "--config-name", "my_grpo", "--print-config"]) == 0
    assert main(["run", "--config-path", str(tmp_path), "--config-name", "nope", "--print-config"]) == 2


def test_docs_verl_compat_is_generated_from_the_code() -> None:
    from pathlib import Path

    from verl.config.compat_doc import render

    doc = Path(__file__).resolve().parents[2] / "docs" / "verl_compat.md"
    assert doc.read_text() == render(), "run: python scripts/gen_verl_compat_doc.py"


@pytest.mark.parametrize("config", ["ppo_trainer", "sft_trainer"])
def test_verls_whole_config_file_loads(config: str, tmp_path) -> None:
    """A user's copy of verl's whole generated config (every key at verl's newest default, interpolations and
    nulls included), extended the Hydra way, loads: each key works, is read onto ours, or has no effect."""
    import yaml

    from verl.config.overrides import nest
    from verl.config.sft_schema import SFTConfig
    from verl.trainer.sft_entry import run_verl_sft

    tree: dict = {}
    for key, entry in verl_keys(config).items():
        if entry["until"] is None:
            node, value = tree, nest(key, entry["default"])
            while isinstance(value, dict) and len(value) == 1 and next(iter(value)) in node:
                name = next(iter(value))
                node, value = node[name], value[name]
            node.update(value)
    tree["hydra"] = {"run": {"dir": "outputs/${now:%Y-%m-%d}"}}
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(tree))
    paths = ["data.train_files=/d/train.parquet", "+data.val_files=null"]
    if config == "ppo_trainer":
        cfg = load_config(
            str(tmp_path / "mine.yaml"), [*paths, f"{ARR}.model.path=/m", f"{ARR}.rollout.name=vllm"]
        )
        assert cfg.algorithm.adv_estimator == "gae" and cfg.trainer.n_gpus_per_node == 1
        assert (
            "hydra.run.dir" not in cfg.compat.no_effect
        )  # an interpolation: verl deriving it, not a setting
    else:
        cfg = load_config(str(tmp_path / "mine.yaml"), [*paths, "model.path=/m"], schema=SFTConfig)
        assert cfg.data.messages_key == "messages"
        rc = run_verl_sft(
            [
                "--config-path",
                str(tmp_path),
                "--config-name",
                "mine",
                "--print-config",
                *paths,
                "model.path=/m",
            ],
            "sft_trainer",
        )
        assert rc == 0


def test_interpolations_in_verl_keys_are_verl_deriving_them_and_are_not_recorded(tmp_path) -> None:
    import yaml

    from verl.config.loader import to_yaml
    from verl.trainer.resume_check import config_changes

    load = f"+{ARR}.actor.checkpoint.load_contents=${{{ARR}.actor.checkpoint.save_contents}}"
    engine = f"+{ARR}.rollout.checkpoint_engine.engine_kwargs.opts={{a: '${{oc.env:HOME}}', b: 1}}"
    cfg = ppo(load, engine)
    assert f"{ARR}.actor.checkpoint.load_contents" not in cfg.compat.no_effect
    # each entry of verl's mapping is a key of its own; the interpolated one is verl deriving it
    assert dict(cfg.compat.no_effect) == {f"{ARR}.rollout.checkpoint_engine.engine_kwargs.opts.b": 1}
    assert any("checkpoint_engine.engine_kwargs.opts.b=1" in line for line in notices(cfg))
    # inside a list, an interpolation is recorded as text that is never resolved
    cfg = ppo(f"+{ARR}.rollout.checkpoint_engine.engine_kwargs.args=[--x, '${{oc.env:HOME}}']")
    assert dict(cfg.compat.no_effect) == {
        f"{ARR}.rollout.checkpoint_engine.engine_kwargs.args": ["--x", "$(oc.env:HOME)"]
    }
    saved = yaml.safe_load(to_yaml(cfg))  # as saved with a checkpoint, and read back on resume
    assert config_changes(saved, cfg) == ([], [])


def test_a_wandb_directory_is_not_wandb(tmp_path, monkeypatch) -> None:
    """wandb writes ./wandb/; found on sys.path it is a namespace package, not the tracker."""
    from verl.utils import trackers

    monkeypatch.setitem(trackers.PACKAGES, "wandb", "wandb_absent")  # as if wandb were not installed
    (tmp_path / "wandb_absent").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = ppo("trainer.logger=[console,wandb]")
    assert list(cfg.trainer.logger) == ["console", "jsonl"]
    assert cfg.compat.mapped["trainer.logger"] == ["console", "wandb"]


def test_verls_command_line_flags_anywhere(capsys) -> None:
    from verl.trainer.main_ppo import main

    assert main(["trainer.total_epochs=2", "--cfg", "job", "trainer.save_freq=3"]) == 0
    out = capsys.readouterr().out
    assert "total_epochs: 2" in out and "save_freq: 3" in out
    assert main(["-c", "job", "trainer.total_epochs=5"]) == 0
    assert "total_epochs: 5" in capsys.readouterr().out
    assert main(["-m", "trainer.seed=1,2"]) == 2
    assert "multirun" in capsys.readouterr().err
    # verl's scripts pass --config-path=config (a directory next to verl's module): the recipe of that name
    assert main(["--config-path=config", "--config-name=ppo_trainer", "--cfg", "job"]) == 0
    assert main(["--config-path=config", "--config-name=ppo_megatron_trainer", "--cfg", "job"]) == 2
    assert "Megatron training is not built here" in capsys.readouterr().err


def test_verls_v1_trainer_modes() -> None:
    # verl's defaults: 1024 prompts per step, mini-batches of 256, parameter_sync_step 4
    cfg = ppo("trainer.v1.trainer_mode=separate_async", "trainer.v1.separate_async.parameter_sync_step=4")
    assert cfg.trainer.v1.trainer_mode == "separate_async"
    assert ppo("trainer.v1.trainer_mode=colocate_async").trainer.v1.colocate_async.num_warmup_batches == 1
    with pytest.raises(ConfigError, match="colocate_async always continues"):
        ppo("trainer.v1.trainer_mode=colocate_async", "async_training.partial_rollout=false")
    with pytest.raises(ConfigError, match="staleness_threshold=0.5 is for trainer_mode=separate_async"):
        ppo("trainer.v1.trainer_mode=colocate_async", "async_training.staleness_threshold=0.5")
    assert ppo("trainer.v1.trainer_mode=colocate_async", f"{ARR}.rollout.name=hf")[ARR].rollout.name == "hf"
    tools = (f"{ARR}.rollout.multi_turn.enable=true", f"{ARR}.rollout.multi_turn.tool_config_path=calculator")
    assert ppo("trainer.v1.trainer_mode=colocate_async", *tools)[
        ARR
    ].rollout.multi_turn.enable  # the agent pool
    with pytest.raises(ConfigError, match="parameter_sync_step=2"):
        ppo("trainer.v1.trainer_mode=separate_async", "trainer.v1.separate_async.parameter_sync_step=2")
    # what a mode is for: verl's asynchronous trainer with DAPO, LoRA and vLLM in the rollout role
    dapo = ppo("trainer.v1.trainer_mode=colocate_async", "algorithm.filter_groups.enable=true")
    assert dapo.algorithm.filter_groups.enable
    lora = ppo(
        "trainer.v1.trainer_mode=separate_async", f"{ARR}.model.lora_rank=8", f"{ARR}.rollout.name=vllm"
    )
    assert lora[ARR].model.lora_rank == 8


def test_verls_fully_async_keys() -> None:
    """async_training.* (verl's fully-async trainer): streaming within trainer_mode=separate_async."""
    mode = "trainer.v1.trainer_mode=separate_async"
    cfg = ppo(mode, "async_training.staleness_threshold=0.5", "async_training.trigger_parameter_sync_step=4")
    assert cfg.async_training.staleness_threshold == 0.5 and cfg.async_training.partial_rollout
    with pytest.raises(ConfigError, match="needs trainer.v1.trainer_mode=separate_async"):
        ppo("async_training.staleness_threshold=0.5")
    with pytest.raises(ConfigError, match=r"async_training.trigger_parameter_sync_step=2: the weights"):
        ppo(mode, "async_training.trigger_parameter_sync_step=2")
    with pytest.raises(ConfigError, match="name the same thing"):
        ppo(
            mode,
            "async_training.trigger_parameter_sync_step=4",
            "trainer.v1.separate_async.parameter_sync_step=2",
        )
    with pytest.raises(ConfigError, match="require_batches=2: here one ppo mini-batch"):
        ppo(mode, "async_training.require_batches=2")
    # the streaming pool runs on any engine (the others decode in chunks), and the agent loops
    assert (
        ppo(mode, "async_training.staleness_threshold=0.5", f"{ARR}.rollout.name=hf")[ARR].rollout.name
        == "hf"
    )
    tools = (f"{ARR}.rollout.multi_turn.enable=true", f"{ARR}.rollout.multi_turn.tool_config_path=calculator")
    assert ppo(mode, "async_training.staleness_threshold=0.5", *tools)[ARR].rollout.multi_turn.enable
    with pytest.raises(ConfigError, match="staleness_threshold"):
        ppo(mode, "async_training.staleness_threshold=-1")
