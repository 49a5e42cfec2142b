"""reward_model.reward_fns: parsing and its errors, each term on hand-made responses, the weighted sum through
the reward managers, and the extra reward fields as metrics. Expected values are computed by hand."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from verl.config import ConfigError, TrainerConfig, load_config
from verl.config.reward_fns import RewardTerm, parse_reward_fns
from verl.errors import InputError
from verl.protocol import DataProto
from verl.trainer.metrics import compute_validation_metrics, reward_extra_metrics
from verl.workers.reward import load_reward_manager
from verl.workers.reward.combine import (
    RewardFunction,
    check_format_sources,
    check_reward_inputs,
    length_penalty,
    needs_rule_fields,
)
from verl.workers.reward.factory import build_reward_fns
from verl.workers.reward.formats import ANSWER_FORMATS, format_score, register_answer_format

CHARS = "0123456789 x#=-"
PAD = 0


class CharTokenizer:
    """id 0 pads; id k > 0 is CHARS[k - 1]."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(CHARS[i - 1] for i in list(ids) if i != PAD)


def make_batch(
    responses: list[str], truths: list[Any], source: str = "arithmetic", width: int = 4
) -> DataProto:
    ids = torch.zeros((len(responses), width), dtype=torch.long)
    mask = torch.zeros((len(responses), width), dtype=torch.long)
    for row, text in enumerate(responses):
        ids[row, : len(text)] = torch.tensor([CHARS.index(c) + 1 for c in text])
        mask[row, : len(text)] = 1
    return DataProto.from_dict(
        tensors={"responses": ids, "response_mask": mask},
        non_tensors={
            "data_source": [source] * len(responses),
            "reward_model": [{"ground_truth": t} for t in truths],
        },
    )


def config(*, reward_fns: Any = (), max_response_length: int = 4, **reward_model: Any) -> Any:
    """A typed TrainerConfig with the reward settings the workers read."""
    sections = {
        "data": {"max_response_length": max_response_length},
        "reward_model": {"reward_fns": list(reward_fns), **reward_model},
    }
    return OmegaConf.merge(OmegaConf.structured(TrainerConfig), OmegaConf.create(sections))


def reward_fn(cfg: Any) -> Any:
    return build_reward_fns(cfg, CharTokenizer(), torch.device("cpu"))[0]


# ------------------------------------------------------------------------------------------------ parsing
def test_items_are_names_or_mappings_with_a_default_weight() -> None:
    terms = parse_reward_fns(["correctness", {"name": "format", "weight": 0.5}, "my/file.py:brevity", "x.py"])
    assert terms[0] == RewardTerm("correctness", 1.0)
    assert terms[1] == RewardTerm("format", 0.5)
    assert (terms[2].name, terms[2].path, terms[2].function) == ("brevity", "my/file.py", "brevity")
    assert (terms[3].name, terms[3].path) == ("compute_score", "x.py")
    assert [t.per_batch for t in parse_reward_fns(["length", "reward_model", "format"])] == [
        True,
        True,
        False,
    ]
    assert parse_reward_fns([]) == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (["formt"], "reward_model.reward_fns[0]='formt': unknown reward term; did you mean 'format'?"),
        ([{"name": "correctnes"}], "did you mean 'correctness'?"),
        (
            [{"name": "format", "weight": -1}],
            "reward_model.reward_fns[0].weight must be a number >= 0; got -1",
        ),
        ([{"name": "format", "weight": "high"}], "weight must be a number >= 0; got 'high'"),
        ([{"name": "format", "weight": True}], "weight must be a number >= 0; got True"),
        ([{"name": "format", "wieght": 2}], "unknown key 'wieght'; did you mean 'weight'?"),
        (["format", "format"], "a second term named 'format'"),
        (
            [{"name": "length", "kwargs": {"treshold": 3}}],
            "the length term takes no 'treshold' (it takes: threshold)",
        ),
        ([3], "expected a term name or {name: ..., weight: ..., kwargs: ...}"),
    ],
)
def test_bad_items_are_errors_naming_the_key(spec: list, message: str) -> None:
    with pytest.raises(ConfigError, match="reward_model.reward_fns") as info:
        parse_reward_fns(spec)
    assert message in str(info.value)


def test_the_config_is_checked_at_load() -> None:
    with pytest.raises(
        ConfigError, match=r"reward_fns\[1\]='lenght': unknown reward term; did you mean 'length'"
    ):
        load_config("grpo", ["reward_model.reward_fns=[correctness,lenght]"])
    with pytest.raises(
        ConfigError, match="names the reward_model term, which needs reward_model.enable=true"
    ):
        load_config("grpo", ["reward_model.reward_fns=[reward_model]"])
    with pytest.raises(ConfigError, match=r"kwargs.threshold must be a number of tokens in \[0, "):
        load_config("grpo", ["reward_model.reward_fns=[{name: length, kwargs: {threshold: 10000}}]"])
    with pytest.raises(ConfigError, match="reward_model.enable=true needs reward_model.model.path"):
        load_config("grpo", ["reward_model.enable=true"])
    # Settings only the correctness term reads, with a list that leaves it out, would change nothing.
    for setting in ("custom_reward_function.path=my.py", "reward_model.overlong_buffer.enable=true"):
        with pytest.raises(
            ConfigError, match=f"has no correctness term, so {setting}.* would change nothing"
        ):
            load_config("dapo", ["reward_model.reward_fns=[length]", setting])
    cfg = load_config("grpo", ["reward_model.reward_fns=[correctness,{name: format, weight: 0.5}]"])
    assert OmegaConf.to_container(cfg.reward_model.reward_fns) == [
        "correctness",
        {"name": "format", "weight": 0.5},
    ]


# ------------------------------------------------------------------------------------------------ each term
@pytest.mark.parametrize(
    ("source", "response", "expected"),
    [
        ("openai/gsm8k", "so #### 72", 1.0),
        ("openai/gsm8k", "so 72", 0.0),
        ("gsm8k", "#### -3", 1.0),
        ("DigitalLearningGmbH/MATH-lighteval", "it is \\boxed{\\frac{1}{2}}", 1.0),
        ("HuggingFaceH4/MATH-500", "it is 1/2", 0.0),
        ("lighteval/MATH", "\\boxed{1", 0.0),  # never closed: no answer
        ("arithmetic", " 42 and more", 1.0),
        ("arithmetic", "-7", 1.0),
        ("arithmetic", "so 42", 0.0),
        ("reasoning_gym/leg_counting", "think... <answer>12</answer>", 1.0),
        ("reasoning_gym/leg_counting", "<answer>12", 0.0),
    ],
)
def test_the_format_term(source: str, response: str, expected: float) -> None:
    assert format_score(source, response) == expected


def test_the_format_term_reads_a_reasoning_gym_rows_own_format() -> None:
    from verl.workers.reward.scorers.reasoning_gym import TASK_KEY, make_task_record

    entry = {"question": "1 + 2 =", "answer": "3", "metadata": {}}
    number = {TASK_KEY: make_task_record("chain_sum", entry, answer_format="number")}
    tag = {TASK_KEY: make_task_record("chain_sum", entry)}
    source = "reasoning_gym/chain_sum"
    # the row's format is in its extra_info; its ground truth is the plain answer
    assert format_score(source, "1 + 2 = 3", "3", number) == 1.0
    assert format_score(source, "three", "3", number) == 0.0
    assert format_score(source, "1 + 2 = 3", "3", tag) == 0.0
    assert format_score(source, "<answer>3</answer>", "3", tag) == 1.0
    # rows written before the record moved to extra_info carried it as their ground truth
    assert format_score(source, "1 + 2 = 3", number[TASK_KEY]) == 1.0


def test_an_unknown_format_is_an_error_naming_the_source_and_the_known_ones() -> None:
    with pytest.raises(ValueError, match="no answer format for data_source 'my_task'; known: .*arithmetic"):
        format_score("my_task", "x")
    register_answer_format("my_task")(lambda text, ground_truth: text.endswith("!"))
    try:
        assert format_score("my_task", "done!") == 1.0 and format_score("my_task", "done") == 0.0
    finally:
        del ANSWER_FORMATS["my_task"]
    with pytest.raises(ConfigError, match="reward_model.reward_fns has the format term, but .*'my_task'"):
        check_format_sources(config(reward_fns=["format"]), ["arithmetic", "my_task"])
    check_format_sources(config(reward_fns=["correctness"]), ["my_task"])  # no format term: nothing to check


def test_the_length_term() -> None:
    # threshold 6 of 10: 0 up to 6 tokens, then -(L - 6) / 4
    lengths = torch.tensor([0, 4, 6, 8, 10])
    assert length_penalty(lengths, 10, 6).tolist() == [0.0, 0.0, 0.0, -0.5, -1.0]


# ------------------------------------------------------------------------------------------------ the weighted sum
def test_the_weighted_sum_and_one_field_per_term() -> None:
    cfg = config(
        reward_fns=[
            "correctness",
            {"name": "format", "weight": 0.5},
            {"name": "length", "weight": 2.0, "kwargs": {"threshold": 2}},
        ]
    )
    data = make_batch(["12", "x123", "7", "123"], [12, 12, 8, 123])
    out = reward_fn(cfg)(data, return_dict=True)
    # correctness (first integer == truth), format (starts with an integer), length -(L - 2) / (4 - 2) clipped at 0
    #   "12":   1 + 0.5 * 1 + 2 * 0    = 1.5   at position 1
    #   "x123": 0 + 0.5 * 0 + 2 * (-1) = -2.0  at position 3
    #   "7":    0 + 0.5 * 1 + 2 * 0    = 0.5   at position 0
    #   "123":  1 + 0.5 * 1 + 2 * -0.5 = 0.5   at position 2
    assert out["reward_tensor"].tolist() == [
        [0.0, 1.5, 0.0, 0.0],
        [0.0, 0.0, 0.0, -2.0],
        [0.5, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.5, 0.0],
    ]
    extra = out["reward_extra_info"]
    assert extra["correctness"] == [1.0, 0.0, 0.0, 1.0]
    assert extra["acc"] == [1.0, 0.0, 0.0, 1.0]  # the correctness scorer's own field is kept
    assert extra["format"] == [1.0, 0.0, 1.0, 1.0]
    assert extra["length"] == [0.0, -1.0, 0.0, -0.5]


def test_an_empty_list_scores_as_before() -> None:
    data = make_batch(["12", "5"], [12, 6])
    train, val = build_reward_fns(config(), CharTokenizer(), torch.device("cpu"))
    assert not isinstance(train, RewardFunction) and not isinstance(
        val, RewardFunction
    )  # the managers themselves
    out = train(data, return_dict=True)
    assert out["reward_tensor"].tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    assert out["reward_extra_info"] == {"acc": [1.0, 0.0]}
    assert not needs_rule_fields(config(enable=True)) and needs_rule_fields(config())


USER_TERM = """
def brevity(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):
    return {"score": -scale * len(solution_str), "chars": len(solution_str)}

def flaky(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "7":
        raise RuntimeError("boom")
    return 1.0
"""


def test_a_user_function_term_with_kwargs(tmp_path) -> None:
    path = tmp_path / "terms.py"
    path.write_text(USER_TERM)
    cfg = config(
        reward_fns=["correctness", {"name": f"{path}:brevity", "weight": 0.25, "kwargs": {"scale": 2}}]
    )
    out = reward_fn(cfg)(make_batch(["12", "x123"], [12, 12]), return_dict=True)
    # "12": 1 + 0.25 * (-2 * 2) = 0.0; "x123": 0 + 0.25 * (-2 * 4) = -2.0
    assert out["reward_tensor"].sum(-1).tolist() == [0.0, -2.0]
    assert out["reward_extra_info"]["brevity"] == [-4.0, -8.0]
    assert out["reward_extra_info"]["chars"] == [2, 4]
    with pytest.raises(InputError, match=r"reward_model.reward_fns\[0\] path=.*missing.py does not exist"):
        check_reward_inputs(config(reward_fns=[f"{tmp_path}/missing.py:fn"]))
    with pytest.raises(ConfigError, match=r"reward_fns\[0\] function='nope': .* has no such function"):
        check_reward_inputs(config(reward_fns=[f"{path}:nope"]))


def test_a_failed_sample_is_zeroed_without_its_batch_terms(tmp_path) -> None:
    path = tmp_path / "terms.py"
    path.write_text(USER_TERM)
    cfg = config(
        reward_fns=[f"{path}:flaky", {"name": "length", "kwargs": {"threshold": 0}}], error_policy="zero"
    )
    out = reward_fn(cfg)(make_batch(["12", "7"], [12, 7]), return_dict=True)
    # "12": 1 + -(2 - 0) / 4 = 0.5; "7" raised: scored 0, no length term
    assert out["reward_tensor"].sum(-1).tolist() == [0.5, 0.0]
    assert out["reward_extra_info"]["reward_error"] == [False, True]


BATCHED = """
def judge(data_sources, solution_strs, ground_truths, extra_infos):
    return [{"score": float(s == str(g)), "exact": s == str(g)} for s, g in zip(solution_strs, ground_truths)]
"""


def test_the_batch_and_dapo_managers_combine_too(tmp_path) -> None:
    path = tmp_path / "judge.py"
    path.write_text(BATCHED)
    cfg = config(reward_fns=["correctness", {"name": "format", "weight": 0.5}], reward_manager="batch")
    cfg.custom_reward_function.path, cfg.custom_reward_function.name = str(path), "judge"
    out = reward_fn(cfg)(make_batch(["12", "x12"], [12, 12]), return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.5, 0.0]
    assert out["reward_extra_info"]["exact"] == [True, False]
    # dapo: its overlong penalty (last 2 of 4 tokens) is added on top of the weighted sum, unweighted
    cfg = config(
        reward_fns=["correctness", {"name": "format", "weight": 0.5}],
        reward_manager="dapo",
        overlong_buffer={"enable": True, "len": 2},
    )
    out = reward_fn(cfg)(make_batch(["12", "1234"], [12, 1234]), return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.5, 1.5 - 1.0]


def test_a_reward_fn_passed_in_code_with_terms_is_refused() -> None:
    with pytest.raises(ConfigError, match="a reward_fn passed in code replaces that manager"):
        build_reward_fns(config(reward_fns=["format"]), CharTokenizer(), torch.device("cpu"), reward_fn=print)


def test_load_reward_manager_alone_sums_the_per_sample_terms() -> None:
    manager = load_reward_manager(config(reward_fns=["correctness", "format"]), CharTokenizer())
    assert manager(make_batch(["12"], [12])).sum().item() == 2.0


# ------------------------------------------------------------------------------------------------ metrics
def test_numeric_extra_fields_are_training_metrics() -> None:
    fields = {
        "acc": [True, False, 1, 0.5],
        "format": [1.0, None, 0.0, float("nan")],  # None and NaN skipped
        "pred": ["a", "b", "c", "d"],  # strings: no metric
        "reward_error": [False, True, False, False],  # counted in reward/errors instead
        "uid": ["u"] * 4,  # not a reward field
    }
    metrics = reward_extra_metrics(fields, ["acc", "format", "pred", "reward_error"])
    assert metrics == {"reward_extra/acc/mean": 0.625, "reward_extra/format/mean": 0.5}


def test_validation_names_core_and_auxiliary_metrics_as_verl() -> None:
    extra = {
        "acc": [1.0, 0.0, None, None],
        "format": [1.0, 1.0, 0.0, None],
        "pred": ["1", "2", "3", "4"],
    }
    metrics = compute_validation_metrics(["a", "a", "b", "b"], [2.0, 0.0, 1.0, 3.0], extra, n=2)
    assert metrics == {
        "val-core/a/acc/mean@2": 0.5,  # acc reported: it is the core variable
        "val-aux/a/reward/mean@2": 1.0,
        "val-aux/a/format/mean@2": 1.0,
        "val-core/b/reward/mean@2": 2.0,  # no acc for b: the reward is
        "val-aux/b/format/mean@2": 0.0,
    }
