"""Reward managers written for verl run in the reward workers: verl's classic shape (``cls(tokenizer, num_examine,
compute_score, reward_fn_key)``, ``__call__(data, return_dict)``) and verl 0.9's reward-loop shape (a
``RewardManagerBase`` with ``async run_single``), selected by a registered name or by verl 0.9.1's
``reward.reward_manager.source=importlib`` + ``module.path``. A reward function that raises is named with its
sample, as the managers here do."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from verl.config import ConfigError, load_config
from verl.protocol import DataProto
from verl.utils.imports import import_file
from verl.workers.reward import RewardFunctionError, get_reward_manager_cls
from verl.workers.reward_worker import RewardWorker

CLASSIC = '''
import torch
from verl.workers.reward_manager import AbstractRewardManager, register


@register("{name}")
class MyClassic(AbstractRewardManager):
    """verl <= 0.7's shape, as its NaiveRewardManager is written."""

    def __init__(self, tokenizer, num_examine, compute_score, reward_fn_key="data_source", **kwargs):
        self.tokenizer, self.compute_score, self.key = tokenizer, compute_score, reward_fn_key

    def __call__(self, data, return_dict=False):
        reward = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
        prompt_len = data.batch["prompts"].shape[-1]
        lengths = data.batch["attention_mask"][:, prompt_len:].sum(-1)
        scores = []
        for i in range(len(data)):
            item = data[i]
            text = self.tokenizer.decode(item.batch["responses"][: lengths[i]], skip_special_tokens=True)
            truth = item.non_tensor_batch["reward_model"]["ground_truth"]
            score = self.compute_score(data_source=item.non_tensor_batch[self.key], solution_str=text,
                                       ground_truth=truth, extra_info=None)
            reward[i, lengths[i] - 1] = score
            scores.append(score)
        extra = {{"doubled": [2 * s for s in scores]}}
        return {{"reward_tensor": reward, "reward_extra_info": extra}} if return_dict else reward
'''

LOOP = '''
from verl.experimental.reward_loop.reward_manager import register
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase


@register("{name}")
class MyLoop(RewardManagerBase):
    """verl 0.9's shape, as its reward-loop NaiveRewardManager is written."""

    def __init__(self, config, tokenizer, compute_score, **kwargs):
        super().__init__(config, tokenizer, compute_score)

    async def run_single(self, data):
        assert len(data) == 1
        item = data[0]
        length = int(item.batch["attention_mask"][-item.batch["responses"].shape[-1]:].sum())
        text = await self.loop.run_in_executor(
            None, lambda: self.tokenizer.decode(item.batch["responses"][:length], skip_special_tokens=True)
        )
        score = self.compute_score(data_source=item.non_tensor_batch["data_source"], solution_str=text,
                                   ground_truth=item.non_tensor_batch["reward_model"]["ground_truth"])
        return {{"reward_score": score, "reward_extra_info": {{"acc": score, "chars": len(text)}}}}
'''

SCORE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str.strip() == "boom":
        raise ValueError("cannot parse " + solution_str)
    return float(solution_str.strip() == str(ground_truth))
"""


def _files(tmp_path: Path, name: str) -> tuple[Path, Path, Path]:
    classic, loop, score = tmp_path / "classic.py", tmp_path / "loop.py", tmp_path / "score.py"
    classic.write_text(CLASSIC.format(name=f"classic_{name}"))
    loop.write_text(LOOP.format(name=f"loop_{name}"))
    score.write_text(SCORE)
    return classic, loop, score


def _worker(model_dir: Path, files: tuple, score: Path, *overrides: str) -> RewardWorker:
    train, test = files
    config = load_config(
        "ppo_trainer",
        [
            f"data.train_files={train}",
            f"data.val_files={test}",
            f"actor_rollout_ref.model.path={model_dir}",
            f"custom_reward_function.path={score}",
            "trainer.n_gpus_per_node=1",
            "reward.num_workers=1",
            *overrides,
        ],
    )
    return RewardWorker(config)


def _batch(tokenizer, responses: list[str], truths: list[str], resp_len: int = 6) -> DataProto:
    prompt = tokenizer.encode("1+3=")
    rows, masks = [], []
    for text in responses:
        ids = tokenizer.encode(text)[:resp_len]
        rows.append(ids + [tokenizer.pad_token_id] * (resp_len - len(ids)))
        masks.append([1] * len(ids) + [0] * (resp_len - len(ids)))
    responses_t, prompts_t = torch.tensor(rows), torch.tensor([prompt] * len(rows))
    mask = torch.cat([torch.ones_like(prompts_t), torch.tensor(masks)], dim=1)
    return DataProto.from_dict(
        tensors={
            "prompts": prompts_t,
            "responses": responses_t,
            "input_ids": torch.cat([prompts_t, responses_t], dim=1),
            "attention_mask": mask,
            "response_mask": torch.tensor(masks),
        },
        non_tensors={
            "data_source": np.array(["arithmetic"] * len(rows), dtype=object),
            "reward_model": np.array([{"ground_truth": t} for t in truths], dtype=object),
        },
    )


def _last_tokens(out: DataProto, batch: DataProto) -> list[float]:
    """The score at each response's last valid token, and nothing anywhere else."""
    scores = out.batch["token_level_scores"]
    last = batch.batch["response_mask"].sum(-1) - 1
    picked = scores[torch.arange(len(scores)), last]
    assert float(scores.abs().sum()) == pytest.approx(float(picked.abs().sum()))
    return picked.tolist()


@pytest.mark.parametrize("shape", ["classic", "loop"])
def test_a_verl_manager_registered_by_name_scores_through_the_reward_worker(
    shape: str, tmp_path: Path, tiny_model_dir, arithmetic_files
) -> None:
    classic, loop, score = _files(tmp_path, f"by_name_{shape}")
    module = classic if shape == "classic" else loop
    import_file(module)  # the module registering the name, imported first as verl's users import theirs
    worker = _worker(
        tiny_model_dir, arithmetic_files, score, f"reward.reward_manager.name={shape}_by_name_{shape}"
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = _batch(tokenizer, ["4", "5", "44"], ["4", "4", "44"])
    out = worker.compute_score(batch)
    assert _last_tokens(out, batch) == [1.0, 0.0, 1.0]
    extra = out.non_tensor_batch
    if shape == "classic":
        assert list(extra["doubled"]) == [2.0, 0.0, 2.0]
    else:
        assert list(extra["acc"]) == [1.0, 0.0, 1.0] and list(extra["chars"]) == [1, 1, 2]


@pytest.mark.parametrize("shape", ["classic", "loop"])
def test_verls_importlib_source_loads_the_class_from_module_path(
    shape: str, tmp_path: Path, tiny_model_dir, arithmetic_files
) -> None:
    classic, loop, score = _files(tmp_path, f"importlib_{shape}")
    path, cls = (classic, "MyClassic") if shape == "classic" else (loop, "MyLoop")
    overrides = [
        "reward.reward_manager.source=importlib",
        f"reward.reward_manager.module.path={path}",
        f"reward.reward_manager.name={cls}",
    ]
    config = load_config("ppo_trainer", overrides)
    assert config.reward_model.reward_manager == f"{path}:{cls}"
    assert get_reward_manager_cls(config.reward_model.reward_manager).__name__ == cls
    worker = _worker(tiny_model_dir, arithmetic_files, score, *overrides)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = _batch(tokenizer, ["5", "4"], ["4", "4"])
    assert _last_tokens(worker.compute_score(batch), batch) == [0.0, 1.0]


@pytest.mark.parametrize("shape", ["classic", "loop"])
def test_a_raising_reward_function_is_reported_with_its_sample(
    shape: str, tmp_path: Path, tiny_model_dir, arithmetic_files
) -> None:
    classic, loop, score = _files(tmp_path, f"raises_{shape}")
    path, cls = (classic, "MyClassic") if shape == "classic" else (loop, "MyLoop")
    overrides = [f"reward_model.reward_manager={path}:{cls}"]
    worker = _worker(tiny_model_dir, arithmetic_files, score, *overrides)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = _batch(tokenizer, ["4", "boom"], ["4", "7"])
    with pytest.raises(RewardFunctionError, match=r"raised ValueError: cannot parse boom.*ground_truth='7'"):
        worker.compute_score(batch)
    # error_policy=zero: the sample scores 0 and the run goes on
    zero = _worker(tiny_model_dir, arithmetic_files, score, *overrides, "reward_model.error_policy=zero")
    assert _last_tokens(zero.compute_score(batch), batch) == [1.0, 0.0]


def test_importlib_without_a_module_path_or_with_an_unknown_source_is_refused() -> None:
    with pytest.raises(ConfigError, match="source=importlib needs reward.reward_manager.module.path"):
        load_config("ppo_trainer", ["reward.reward_manager.source=importlib"])
    with pytest.raises(ConfigError, match="verl's sources are register and importlib"):
        load_config("ppo_trainer", ["reward.reward_manager.source=http"])
    # register (verl's default) reads the name; a module.path beside it is unused, as in verl
    cfg = load_config(
        "ppo_trainer", ["reward.reward_manager.source=register", "reward.reward_manager.name=dapo"]
    )
    assert cfg.reward_model.reward_manager == "dapo"


KWARGS_CLASSIC = '''
import torch
from verl.workers.reward_manager import AbstractRewardManager


class BonusClassic(AbstractRewardManager):
    """A classic manager taking verl's reward_kwargs in its constructor."""

    def __init__(self, tokenizer, num_examine, compute_score, reward_fn_key="data_source", bonus=0.0):
        self.bonus = bonus

    def __call__(self, data, return_dict=False):
        reward = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
        lengths = data.batch["response_mask"].sum(-1)
        reward[torch.arange(len(data)), lengths - 1] = self.bonus
        return {"reward_tensor": reward, "reward_extra_info": {}} if return_dict else reward
'''

KWARGS_LOOP = '''
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase


class BonusLoop(RewardManagerBase):
    """A reward-loop manager reading verl 0.9.1's config.reward.reward_kwargs, as verl's own recipes do."""

    def __init__(self, config, tokenizer, compute_score, **kwargs):
        super().__init__(config, tokenizer, compute_score)
        self.bonus = config.reward.get("reward_kwargs", {}).get("bonus", 0.0)

    async def run_single(self, data):
        return {"reward_score": self.bonus, "reward_extra_info": {}}
'''


@pytest.mark.parametrize("shape", ["classic", "loop"])
def test_verls_reward_kwargs_reach_a_manager_written_for_verl(
    shape: str, tmp_path: Path, tiny_model_dir, arithmetic_files
) -> None:
    code, cls = (KWARGS_CLASSIC, "BonusClassic") if shape == "classic" else (KWARGS_LOOP, "BonusLoop")
    module = tmp_path / f"bonus_{shape}.py"
    module.write_text(code)
    score = tmp_path / "score.py"
    score.write_text(SCORE)
    overrides = [f"reward.reward_manager.name={module}:{cls}", "+reward.reward_kwargs.bonus=0.25"]
    assert load_config("ppo_trainer", overrides).reward_model.manager_kwargs == {"bonus": 0.25}
    worker = _worker(tiny_model_dir, arithmetic_files, score, *overrides)
    batch = _batch(AutoTokenizer.from_pretrained(tiny_model_dir), ["4", "5"], ["4", "4"])
    assert _last_tokens(worker.compute_score(batch), batch) == [0.25, 0.25]


def test_reward_kwargs_for_a_built_in_manager_are_refused_with_the_keys() -> None:
    with pytest.raises(
        ConfigError, match=r"manager_kwargs \(verl's reward.reward_kwargs\) \['bonus'\].*naive"
    ):
        load_config("ppo_trainer", ["+reward.reward_kwargs.bonus=1"])
