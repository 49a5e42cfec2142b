"""The reward model (reward_model.enable): a tiny sequence-classification model made here, scored by the reward
worker's scorer and, for comparison, by a direct transformers call on the same chat-formatted texts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from verl.config import ConfigError, TrainerConfig, load_config
from verl.errors import InputError
from verl.models.tiny import build_tiny_tokenizer, make_tiny_model, tiny_model_config
from verl.protocol import DataProto
from verl.workers.reward.combine import RewardFunction
from verl.workers.reward.factory import build_reward_fns
from verl.workers.reward.model import RewardModelScorer, check_reward_model_inputs

QUESTIONS = ["1+2=", "13+30=", "7+8=", "40+2=", "9+9="]
ANSWERS = ["3", "43 and so on", "15", "", "18 18 18 18"]


def save_tiny_reward_model(out: Path, pad_in_config: bool = True, chat_template: bool = True) -> Path:
    """A 2-layer Qwen2 with a one-label score head, saved with its tokenizer."""
    tokenizer = build_tiny_tokenizer()
    if not chat_template:
        tokenizer.chat_template = None
    config = tiny_model_config(
        tokenizer, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, num_labels=1,
    )  # fmt: skip
    config.architectures = ["Qwen2ForSequenceClassification"]
    if not pad_in_config:
        config.pad_token_id = None
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    with torch.no_grad():  # a visible score head: its default init is tiny
        model.score.weight.normal_(0, 1.0)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory) -> Path:
    return save_tiny_reward_model(tmp_path_factory.mktemp("tiny-rm"))


@pytest.fixture(scope="module")
def policy_tokenizer(rm_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(rm_dir)  # the same tokenizer as the policy's tiny model


def section(path: Path | str | None, **kwargs: Any) -> Any:
    reward_model = {"enable": True, "model": {"path": str(path) if path else None}, **kwargs}
    cfg = OmegaConf.merge(
        OmegaConf.structured(TrainerConfig), OmegaConf.create({"reward_model": reward_model})
    )
    return cfg


def make_batch(tokenizer: Any, width: int = 16) -> DataProto:
    """Responses as the rollout writes them: right-padded, the eos token after each answer."""
    eos, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id
    responses = torch.full((len(ANSWERS), width), pad)
    mask = torch.zeros((len(ANSWERS), width), dtype=torch.long)
    for row, answer in enumerate(ANSWERS):
        ids = [*tokenizer(answer, add_special_tokens=False)["input_ids"], eos]
        assert len(ids) < width  # a whole answer, then padding
        responses[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = 1
    return DataProto.from_dict(
        tensors={"responses": responses, "response_mask": mask},
        non_tensors={
            "raw_prompt": [[{"role": "user", "content": q}] for q in QUESTIONS],
            "data_source": ["arithmetic"] * len(ANSWERS),
            "reward_model": [{"ground_truth": "3"}] * len(ANSWERS),
        },
    )


def direct_scores(rm_dir: Path, answers: list[str] = ANSWERS) -> list[float]:
    """One input at a time (no padding at all), texts written out by hand in the tiny tokenizer's ChatML."""
    tokenizer = AutoTokenizer.from_pretrained(rm_dir)
    model = AutoModelForSequenceClassification.from_pretrained(rm_dir).eval()
    scores = []
    for question, answer in zip(QUESTIONS, answers, strict=True):
        text = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n{answer}<|im_end|>\n"
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            scores.append(model(input_ids=ids).logits[0, 0].item())
    return scores


@pytest.mark.parametrize("micro_batch", [1, 3, None])
def test_scores_equal_a_direct_call_on_the_chat_texts(rm_dir, policy_tokenizer, micro_batch) -> None:
    scorer = RewardModelScorer(
        section(rm_dir, micro_batch_size_per_gpu=micro_batch).reward_model,
        policy_tokenizer,
        torch.device("cpu"),
        max_length=64,
    )
    scores = scorer(make_batch(policy_tokenizer))
    assert scores.dtype == torch.float32 and scores.shape == (len(ANSWERS),)
    assert scores.tolist() == pytest.approx(direct_scores(rm_dir), abs=1e-5)
    assert len(set(scores.tolist())) > 1  # the inputs differ, and so do their scores


def test_inputs_are_cut_from_the_right_at_max_length(rm_dir, policy_tokenizer) -> None:
    scorer = RewardModelScorer(
        section(rm_dir).reward_model, policy_tokenizer, torch.device("cpu"), max_length=6
    )
    chats = scorer.chats(make_batch(policy_tokenizer))
    full = scorer.tokenizer(scorer.texts(chats)[1], add_special_tokens=False)["input_ids"]
    assert (
        scorer.encode(scorer.texts(chats))[1] == full[:6]
    )  # the start is kept, as verl's truncation="right"


def test_the_chat_and_its_fallbacks(tmp_path, rm_dir, policy_tokenizer) -> None:
    scorer = RewardModelScorer(
        section(rm_dir).reward_model, policy_tokenizer, torch.device("cpu"), max_length=64
    )
    chats = scorer.chats(make_batch(policy_tokenizer))
    assert chats[1] == [
        {"role": "user", "content": "13+30="},
        {"role": "assistant", "content": "43 and so on"},  # the eos is a special token: skipped
    ]
    plain = save_tiny_reward_model(tmp_path / "plain", pad_in_config=False, chat_template=False)
    scorer = RewardModelScorer(
        section(plain).reward_model, policy_tokenizer, torch.device("cpu"), max_length=64
    )
    assert scorer.texts(chats[:1]) == ["1+2=3"]  # no chat template: prompt then response
    assert scorer.model.config.pad_token_id == scorer.tokenizer.pad_token_id  # set for the model's pooling


def test_bad_reward_model_paths_name_the_key(tmp_path) -> None:
    with pytest.raises(ConfigError, match="reward_model.enable=true needs reward_model.model.path"):
        load_config("grpo", ["reward_model.enable=true"])
    with pytest.raises(InputError, match="reward_model.model.path=.*does not exist"):
        check_reward_model_inputs(section(tmp_path / "nope"))
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "empty_dir" / "weights.bin").write_text("")
    with pytest.raises(InputError, match="reward_model.model.path=.*no config.json"):
        check_reward_model_inputs(section(tmp_path / "empty_dir"))


def test_verls_new_spellings_map_onto_ours(rm_dir) -> None:
    cfg = load_config(
        "ppo_trainer",
        ["reward.reward_model.enable=true", f"reward.reward_model.model_path={rm_dir}", "data.train_files=x"],
        check=False,
    )
    assert cfg.reward_model.enable is True and cfg.reward_model.model.path == str(rm_dir)


def test_the_reward_model_replaces_the_rule_score_or_is_one_term(rm_dir, policy_tokenizer) -> None:
    data = make_batch(policy_tokenizer)
    rm = direct_scores(rm_dir)
    last = data.batch["response_mask"].sum(-1) - 1
    alone = build_reward_fns(section(rm_dir), policy_tokenizer, torch.device("cpu"))[0]
    assert isinstance(alone, RewardFunction)
    out = alone(data, return_dict=True)
    assert out["reward_tensor"][torch.arange(len(rm)), last].tolist() == pytest.approx(rm, abs=1e-5)
    assert out["reward_tensor"].sum().item() == pytest.approx(sum(rm), abs=1e-4)  # nothing else: it replaces
    assert out["reward_extra_info"]["rm_score"] == pytest.approx(rm, abs=1e-5)
    terms = ["correctness", {"name": "reward_model", "weight": 0.5}]
    both = build_reward_fns(section(rm_dir, reward_fns=terms), policy_tokenizer, torch.device("cpu"))[0]
    out = both(data, return_dict=True)
    correct = [1.0, 0.0, 0.0, 0.0, 0.0]  # ground truth 3: only the first answer
    expected = [c + 0.5 * r for c, r in zip(correct, rm, strict=True)]
    assert out["reward_tensor"].sum(-1).tolist() == pytest.approx(expected, abs=1e-5)
    assert out["reward_extra_info"]["correctness"] == correct


def test_a_causal_lm_is_not_a_reward_model(tmp_path) -> None:
    path = make_tiny_model(tmp_path / "lm", hidden_size=16, num_hidden_layers=1, intermediate_size=32)
    with pytest.raises(
        InputError, match="reward_model.model.path=.*not a reward model checkpoint: no weights"
    ):
        RewardModelScorer(section(path).reward_model, None, torch.device("cpu"), max_length=8)
