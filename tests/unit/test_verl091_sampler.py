"""verl 0.9.1's trainer additions in tiny real runs: ``trainer.checkpoint_callback_class`` (built once, its
``on_save`` called in the driver after each checkpoint save with verl's arguments; an exception stops training)
and the V1 sampler keys of colocate_async (a fractional ``num_warmup_batches`` puts floor(W x train_batch_size)
prompts in flight beyond the step's own; ``max_off_policy_threshold=null`` restarts nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl.config import load_config
from verl.trainer.pool_source import NO_BOUND, PoolSource, source_for
from verl.trainer.ppo.checkpoint_callback import CheckpointCallbackError
from verl.trainer.rl_trainer import RLTrainer

CALLBACK = """
from pathlib import Path

from verl.trainer.ppo.checkpoint_callback import CheckpointCallback

CALLS = []
BUILT = []


class Record(CheckpointCallback):
    def __init__(self, config=None):
        super().__init__(config)
        BUILT.append(config.trainer.experiment_name)

    def on_save(self, trainer, global_step, checkpoint_dir, async_save=False, **kwargs):
        done = (Path(checkpoint_dir) / "trainer_state.pt").is_file()
        CALLS.append((type(trainer).__name__, global_step, checkpoint_dir, async_save, done))


class Fails(CheckpointCallback):
    def on_save(self, trainer, global_step, checkpoint_dir, async_save=False, **kwargs):
        raise OSError("bucket unreachable")
"""


def _run(model_dir: Path, files: tuple, out: Path, *overrides: str):
    train, test = files
    return load_config(
        "grpo",
        [
            f"data.train_files={train}",
            f"data.val_files={test}",
            "data.train_batch_size=4",
            "data.val_max_samples=8",
            "data.max_response_length=6",
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.rollout.n=2",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={out}",
            "prepare.enable=false",
            *overrides,
        ],
    )


def _fit(config) -> RLTrainer:
    trainer = RLTrainer(config)
    try:
        trainer.fit()
    finally:
        trainer.shutdown()
    return trainer


def test_the_checkpoint_callback_runs_after_each_save_with_verls_arguments(
    tmp_path: Path, tiny_model_dir, arithmetic_files, monkeypatch
) -> None:
    (tmp_path / "my_callbacks.py").write_text(CALLBACK)
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_callbacks

    out = tmp_path / "run"
    config = _run(
        tiny_model_dir, arithmetic_files, out,
        "trainer.total_training_steps=3", "trainer.save_freq=2",
        "trainer.checkpoint_callback_class=my_callbacks.Record", "trainer.experiment_name=cb",
    )  # fmt: skip
    _fit(config)
    assert my_callbacks.BUILT == ["cb"]  # once, with the whole config
    # saves at step 2 and at the last step; each checkpoint complete and in place when the hook runs
    assert my_callbacks.CALLS == [
        ("RLTrainer", 2, str(out / "global_step_2"), False, True),
        ("RLTrainer", 3, str(out / "global_step_3"), False, True),
    ]


def test_a_failing_checkpoint_callback_stops_training_naming_it(
    tmp_path: Path, tiny_model_dir, arithmetic_files, monkeypatch
) -> None:
    (tmp_path / "my_callbacks_fail.py").write_text(CALLBACK)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    config = _run(
        tiny_model_dir, arithmetic_files, out,
        "trainer.total_training_steps=3", "trainer.save_freq=1",
        "trainer.checkpoint_callback_class=my_callbacks_fail.Fails",
    )  # fmt: skip
    with pytest.raises(
        CheckpointCallbackError, match=r"Fails: on_save\(global_step=1, .* raised OSError: bucket"
    ):
        _fit(config)
    assert (out / "global_step_1").is_dir() and not (out / "global_step_2").exists()  # stopped after step 1
    with pytest.raises(CheckpointCallbackError, match="has no class 'Nope'"):
        RLTrainer(
            _run(
                tiny_model_dir,
                arithmetic_files,
                tmp_path / "r2",
                "trainer.checkpoint_callback_class=my_callbacks_fail.Nope",
            )
        )


@pytest.mark.parametrize(("warmup", "submitted"), [(1.5, [10, 12]), (1, [8, 12])])
def test_a_fractional_warm_up_keeps_that_many_prompts_in_flight(
    warmup: float, submitted: list[int], tmp_path: Path, tiny_model_dir, arithmetic_files, monkeypatch
) -> None:
    config = _run(
        tiny_model_dir, arithmetic_files, tmp_path / "run",
        "trainer.total_training_steps=3", "trainer.v1.trainer_mode=colocate_async",
        f"trainer.v1.colocate_async.num_warmup_batches={warmup}", "trainer.v1.sampler.max_off_policy_threshold=null",
    )  # fmt: skip
    seen: list[int] = []
    original = PoolSource._submit_prompts

    def record(self, flow, plan, prompts):
        original(self, flow, plan, prompts)
        seen.append(self.submitted)

    monkeypatch.setattr(PoolSource, "_submit_prompts", record)
    trainer = _fit(config)
    source = trainer.plan.source
    assert isinstance(source, PoolSource) and source.extra == int(warmup * 4)
    assert source.max_staleness == NO_BOUND  # null: no unfinished generation is restarted for its age
    # step 1 submits its own 4 prompts and floor(W x 4) more; step 2 tops up to the 12 of the 3 steps
    assert seen == submitted


def test_the_staleness_bound_counts_versions_inclusively_as_verl(
    tiny_model_dir, arithmetic_files, tmp_path
) -> None:
    """verl's span of a prompt is its versions since submission, counted inclusively: threshold 8 lets a first
    token be at most 7 versions older than the policy it trains."""
    config = _run(tiny_model_dir, arithmetic_files, tmp_path, "trainer.v1.trainer_mode=colocate_async")
    trainer = RLTrainer(config)
    try:
        assert source_for(config, trainer.plan).max_staleness == 7
    finally:
        trainer.shutdown()
