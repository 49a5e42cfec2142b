"""Unit tests for rule-based rewards: scorers, dispatch, NaiveRewardManager and custom loading.

Expectations are hand-computed; the tokenizer is a tiny char-level fake (no downloads).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.config import ConfigError, TrainerConfig
from verl.errors import InputError
from verl.protocol import DataProto
from verl.workers.reward import (
    SCORERS,
    NaiveRewardManager,
    RewardFunctionError,
    default_compute_score,
    load_custom_reward_function,
    load_reward_manager,
    register_scorer,
)
from verl.workers.reward.manager import RewardSample, score_samples
from verl.workers.reward.scorers import arithmetic, gsm8k
from verl.workers.reward.timeout import TimeLimit

# ---------------------------------------------------------------------------------------------
# arithmetic


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("12", 12, 1.0),
        (" 12 apples", 12, 1.0),
        ("1 2", 12, 0.0),  # first integer is 1
        ("-3", -3, 1.0),
        ("-3", 3, 0.0),
        ("", 5, 0.0),
        ("no digits", 5, 0.0),
        ("42+1=43", "42", 1.0),  # string ground truth; first integer wins
        ("7 then 12", 12, 0.0),
    ],
)
def test_arithmetic(response: str, truth: str | int, expected: float) -> None:
    assert arithmetic.compute_score(response, truth) == expected


# ---------------------------------------------------------------------------------------------
# gsm8k


@pytest.mark.parametrize(
    ("response", "strict", "flexible"),
    [
        ("so the answer is #### 72", "72", "72"),
        ("#### 1,234", "1234", "1,234"),  # strict strips commas; flexible keeps them (as verl)
        ("#### $1,234", "1234", "1,234"),
        ("#### 5\nwait, actually\n#### 7", "7", "7"),  # last #### wins
        ("#### -3", "-3", "-3"),
        ("The answer is 72", None, "72"),
        ("costs 5 .", None, "5"),  # a bare "." is skipped
        ("The answer is 72.", None, "72."),  # verl parity: trailing dot kept
        ("no numbers here", None, None),
        ("####72", None, "72"),  # strict requires "#### " with the space
    ],
)
def test_gsm8k_extract(response: str, strict: str | None, flexible: str | None) -> None:
    assert gsm8k.extract_solution(response, method="strict") == strict
    assert gsm8k.extract_solution(response, method="flexible") == flexible


def test_gsm8k_only_last_300_chars_searched() -> None:
    assert gsm8k.extract_solution("#### 72" + "x" * 293) == "72"  # exactly 300 chars: all searched
    assert gsm8k.extract_solution("#### 72" + "x" * 294) is None  # the '#' falls outside the tail
    assert gsm8k.compute_score("#### 72" + "x" * 400, "72") == 0.0
    assert gsm8k.compute_score("y" * 1000 + "#### 72", "72") == 1.0


def test_gsm8k_compute_score() -> None:
    assert gsm8k.compute_score("#### 72", "72") == 1.0
    assert gsm8k.compute_score("#### 72", 72) == 1.0
    assert gsm8k.compute_score("#### 72", " 72 ") == 1.0
    assert gsm8k.compute_score("#### 71", "72") == 0.0
    assert gsm8k.compute_score("#### 71", "72", format_score=0.1) == 0.1
    assert gsm8k.compute_score("72", "72", format_score=0.1) == 0.0  # no #### -> no answer -> 0
    assert gsm8k.compute_score("72", "72", method="flexible") == 1.0
    assert gsm8k.compute_score("#### 72", "72", score=2.0) == 2.0
    with pytest.raises(ValueError):
        gsm8k.extract_solution("#### 1", method="lenient")


# ---------------------------------------------------------------------------------------------
# dispatch


def test_default_compute_score_dispatch() -> None:
    # the arithmetic score is correctness, reported as acc too (validation shows val-core/arithmetic/acc)
    assert default_compute_score("arithmetic", "12", 12) == {"score": 1.0, "acc": 1.0}
    assert default_compute_score("arithmetic", "13", 12) == {"score": 0.0, "acc": 0.0}
    assert default_compute_score("openai/gsm8k", "#### 8", "8") == 1.0
    assert default_compute_score("gsm8k", "8", "8") == 0.0  # strict
    with pytest.raises(NotImplementedError, match="arithmetic") as info:
        default_compute_score("nope", "1", "1")
    assert "nope" in str(info.value) and "openai/gsm8k" in str(info.value)


def test_register_scorer() -> None:
    @register_scorer("unit_test_len")
    def _len_scorer(solution_str: str, ground_truth, extra_info=None) -> float:
        return float(len(solution_str) == int(ground_truth))

    try:
        assert default_compute_score("unit_test_len", "abc", "3") == 1.0
        register_scorer("unit_test_len")(_len_scorer)  # the same function again is a no-op
        with pytest.raises(ValueError, match="already registered"):
            register_scorer("unit_test_len")(lambda s, g, extra_info=None: 0.0)
        register_scorer("unit_test_len", overwrite=True)(lambda s, g, extra_info=None: 0.5)
        assert default_compute_score("unit_test_len", "abc", "3") == 0.5
    finally:
        SCORERS.pop("unit_test_len", None)


# ---------------------------------------------------------------------------------------------
# manager

PAD = 0
_CHARS = "0123456789 +-=abcdefghijklmnopqrstuvwxyz#$.,"


class CharTokenizer:
    """id 0 is a special pad token; id k>0 is _CHARS[k-1]."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return "".join(
            "<pad>" if i == PAD else _CHARS[i - 1] for i in ids if not (skip_special_tokens and i == PAD)
        )


def enc(text: str) -> list[int]:
    return [_CHARS.index(c) + 1 for c in text]


def make_batch(
    prompts: list[str],
    responses: list[str],
    truths: list,
    sources: list[str],
    *,
    resp_len: int = 6,
    prompt_len: int = 5,
    left_pad_responses: bool = False,
    use_response_mask: bool = False,
    extra_info: list | None = None,
) -> DataProto:
    """Prompts left-padded, responses right-padded (or left-padded) to fixed widths."""
    p_ids, p_mask, r_ids, r_mask = [], [], [], []
    for p, r in zip(prompts, responses, strict=True):
        pt, rt = enc(p), enc(r)
        p_ids.append([PAD] * (prompt_len - len(pt)) + pt)
        p_mask.append([0] * (prompt_len - len(pt)) + [1] * len(pt))
        pad = [PAD] * (resp_len - len(rt))
        if left_pad_responses:
            r_ids.append(pad + rt)
            r_mask.append([0] * len(pad) + [1] * len(rt))
        else:
            r_ids.append(rt + pad)
            r_mask.append([1] * len(rt) + [0] * len(pad))
    prompts_t, responses_t = torch.tensor(p_ids), torch.tensor(r_ids)
    tensors = {
        "prompts": prompts_t,
        "responses": responses_t,
        "input_ids": torch.cat([prompts_t, responses_t], dim=1),
    }
    if use_response_mask:
        tensors["response_mask"] = torch.tensor(r_mask)
        # attention_mask deliberately wrong on the response part: response_mask must win.
        tensors["attention_mask"] = torch.cat([torch.tensor(p_mask), torch.ones_like(responses_t)], dim=1)
    else:
        tensors["attention_mask"] = torch.cat([torch.tensor(p_mask), torch.tensor(r_mask)], dim=1)
    non_tensors = {
        "data_source": np.array(sources, dtype=object),
        "reward_model": np.array([{"ground_truth": t, "style": "rule"} for t in truths], dtype=object),
    }
    if extra_info is not None:
        non_tensors["extra_info"] = np.array(extra_info, dtype=object)
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def test_tokenizer_roundtrip() -> None:
    assert CharTokenizer().decode([PAD, *enc("1+2=")]) == "1+2="


def test_manager_right_padding() -> None:
    data = make_batch(
        ["1+2=", "5+7="],
        ["3 ok", "13"],
        [3, 12],
        ["arithmetic", "arithmetic"],
    )
    reward = NaiveRewardManager(CharTokenizer())(data)
    expected = torch.zeros(2, 6)
    expected[0, 3] = 1.0  # "3 ok" -> last valid token index 3, correct
    expected[1, 1] = 0.0  # "13" != 12, last valid index 1
    assert reward.dtype == torch.float32
    assert torch.equal(reward, expected)


def test_manager_left_padded_response_mask() -> None:
    data = make_batch(
        ["1+1=", "2+2="],
        ["2", "4 x"],
        [2, 4],
        ["arithmetic", "arithmetic"],
        left_pad_responses=True,
        use_response_mask=True,
    )
    reward = NaiveRewardManager(CharTokenizer())(data)
    expected = torch.zeros(2, 6)
    expected[0, 5] = 1.0
    expected[1, 5] = 1.0
    assert torch.equal(reward, expected)


def test_manager_empty_response_scores_at_position_zero() -> None:
    seen: list[str] = []

    def fn(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(solution_str)
        return 0.25

    data = make_batch(["1+1="], [""], [2], ["arithmetic"])
    reward = NaiveRewardManager(CharTokenizer(), compute_score=fn)(data)
    assert seen == [""]
    assert reward[0, 0].item() == 0.25 and reward.sum().item() == 0.25


def test_manager_dict_scores_and_extra_info() -> None:
    calls = []

    def fn(data_source, solution_str, ground_truth, extra_info=None):
        calls.append((data_source, solution_str, ground_truth, extra_info))
        if solution_str == "b":
            return 0.5  # plain float: its row gets None in extra info
        return {"score": 1.0, "acc": solution_str == "a", "pred": solution_str}

    data = make_batch(
        ["1", "2", "3"],
        ["a", "b", "cc"],
        ["x", "y", "z"],
        ["s1", "s2", "s1"],
        extra_info=[{"k": 0}, {"k": 1}, {"k": 2}],
    )
    out = NaiveRewardManager(CharTokenizer(), compute_score=fn)(data, return_dict=True)
    assert calls == [("s1", "a", "x", {"k": 0}), ("s2", "b", "y", {"k": 1}), ("s1", "cc", "z", {"k": 2})]
    assert out["reward_tensor"][:, :2].tolist() == [[1.0, 0.0], [0.5, 0.0], [0.0, 1.0]]
    assert out["reward_extra_info"] == {"acc": [True, None, False], "pred": ["a", None, "cc"]}


def test_manager_custom_reward_fn_key() -> None:
    data = make_batch(["1"], ["12"], [12], ["ignored"])
    data.non_tensor_batch["ability"] = np.array(["arithmetic"], dtype=object)
    assert NaiveRewardManager(CharTokenizer(), reward_fn_key="ability")(data)[0, 1].item() == 1.0


def test_manager_returns_rm_scores() -> None:
    data = make_batch(["1"], ["12"], [12], ["arithmetic"])
    data.batch["rm_scores"] = torch.full((1, 6), 7.0)
    manager = NaiveRewardManager(CharTokenizer())
    assert manager(data) is data.batch["rm_scores"]
    assert manager(data, return_dict=True)["reward_tensor"] is data.batch["rm_scores"]


def test_manager_prints_num_examine_per_source(capsys: pytest.CaptureFixture[str]) -> None:
    data = make_batch(
        ["1+1=", "2+2=", "3+3="],
        ["2", "4", "6"],
        [2, 4, 6],
        ["arithmetic", "arithmetic", "arith2"],
    )
    SCORERS["arith2"] = SCORERS["arithmetic"]
    try:
        NaiveRewardManager(CharTokenizer(), num_examine=1)(data)
    finally:
        SCORERS.pop("arith2")
    out = capsys.readouterr().out
    assert out.count("[response]") == 2  # one per data source
    assert "[prompt] 1+1=" in out and "[prompt] 3+3=" in out and "2+2=" not in out


def test_manager_raising_scorer() -> None:
    def fn(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "bad":
            raise ZeroDivisionError("boom")
        return 1.0

    data = make_batch(["1", "2"], ["ok", "bad"], ["g0", "g1"], ["src", "src"])
    with pytest.raises(RewardFunctionError) as info:
        NaiveRewardManager(CharTokenizer(), compute_score=fn)(data)
    msg = str(info.value)
    assert "sample 1" in msg and "'bad'" in msg and "'g1'" in msg and "'src'" in msg and "boom" in msg
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert isinstance(info.value, RuntimeError)
    assert info.value.index == 1


def test_manager_long_response_truncated_in_error() -> None:
    err = RewardFunctionError("raised X", data_source="s", index=0, ground_truth=1, response="z" * 1000)
    assert "z" * 200 in str(err) and "z" * 201 not in str(err) and "1000 chars" in str(err)


@pytest.mark.parametrize(
    "bad",
    [float("nan"), float("inf"), None, "1.0", {"acc": 1.0}, {"score": math.nan}, [1.0]],
)
def test_manager_unusable_scores(bad) -> None:
    data = make_batch(["1"], ["resp"], ["g"], ["src"])
    with pytest.raises(RewardFunctionError, match="sample 0") as info:
        NaiveRewardManager(CharTokenizer(), compute_score=lambda **kw: bad)(data)
    assert repr(bad) in str(info.value) or "nan" in str(info.value)


def test_manager_accepts_numpy_and_tensor_scores() -> None:
    data = make_batch(["1", "2"], ["a", "b"], ["g", "g"], ["src", "src"])
    values = iter([np.float32(0.5), torch.tensor(2.0)])
    reward = NaiveRewardManager(CharTokenizer(), compute_score=lambda **kw: next(values))(data)
    assert reward[:, 0].tolist() == [0.5, 2.0]


def test_default_scorer_unknown_source_becomes_reward_error() -> None:
    data = make_batch(["1"], ["12"], [12], ["mystery"])
    with pytest.raises(RewardFunctionError, match="mystery") as info:
        NaiveRewardManager(CharTokenizer())(data)
    assert isinstance(info.value.__cause__, NotImplementedError)


# ---------------------------------------------------------------------------------------------
# loading


CUSTOM = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 3.0

def my_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    return 1.0 + bonus

NOT_CALLABLE = 5
"""


def test_load_custom_reward_function(tmp_path) -> None:
    path = tmp_path / "my_reward.py"
    path.write_text(CUSTOM)
    assert load_custom_reward_function(path)("s", "r", "g") == 3.0
    assert load_custom_reward_function(str(path), "my_score")("s", "r", "g") == 1.0
    with pytest.raises(ConfigError, match="custom_reward_function.name='missing_fn'.*it defines: .*my_score"):
        load_custom_reward_function(path, "missing_fn")
    with pytest.raises(ConfigError, match="it is a int, not a function"):
        load_custom_reward_function(path, "NOT_CALLABLE")
    with pytest.raises(
        InputError, match="custom_reward_function.path=.*absent.py does not exist; .* holds my_reward.py"
    ):
        load_custom_reward_function(tmp_path / "absent.py")
    (tmp_path / "broken.py").write_text("def f(:\n")
    with pytest.raises(InputError, match="importing .*broken.py failed: SyntaxError.*line 1"):
        load_custom_reward_function(tmp_path / "broken.py", "f")
    (tmp_path / "raises.py").write_text("x = 1\nraise RuntimeError('boom')\n")
    with pytest.raises(InputError, match="RuntimeError: boom \\(line 2\\)"):
        load_custom_reward_function(tmp_path / "raises.py", "x")


def test_an_async_custom_reward_function_is_awaited(tmp_path) -> None:
    """verl's signature, ``async def compute_score(data_source, solution_str, ground_truth, extra_info)``."""
    path = tmp_path / "async_reward.py"
    path.write_text(
        "import asyncio\n"
        "async def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    await asyncio.sleep(0)\n"
        "    return {'score': float(solution_str == ground_truth), 'source': data_source}\n"
    )
    fn = load_custom_reward_function(path)
    samples = [
        RewardSample(index=0, data_source="d", response_str="7", ground_truth="7"),
        RewardSample(index=1, data_source="d", response_str="8", ground_truth="7"),
    ]
    assert [r.score for r in score_samples(fn, samples)] == [1.0, 0.0]
    # under reward_model.timeout_s the call runs on a helper thread, with an event loop of its own
    assert [r.score for r in score_samples(fn, samples, time_limit=TimeLimit(5.0))] == [1.0, 0.0]


def trainer_config(**sections) -> Any:
    """A typed TrainerConfig (what the workers receive) with some sections set."""
    return OmegaConf.merge(OmegaConf.structured(TrainerConfig), OmegaConf.create(sections))


def test_load_reward_manager_with_custom_function(tmp_path) -> None:
    path = tmp_path / "my_reward.py"
    path.write_text(CUSTOM)
    config = trainer_config(
        custom_reward_function={"path": str(path), "name": "my_score", "reward_kwargs": {"bonus": 1.5}},
        reward_model={"reward_manager": "naive"},
    )
    manager = load_reward_manager(config, CharTokenizer(), num_examine=0)
    assert isinstance(manager, NaiveRewardManager)
    data = make_batch(["1"], ["abc"], ["g"], ["anything"])
    assert manager(data)[0, 2].item() == 2.5


def test_load_reward_manager_defaults() -> None:
    data = make_batch(["1"], ["12"], [12], ["arithmetic"])
    manager = load_reward_manager(trainer_config(), CharTokenizer())
    assert isinstance(manager, NaiveRewardManager)
    assert manager(data)[0, 1].item() == 1.0
    with pytest.raises(ValueError, match="naive"):
        load_reward_manager(trainer_config(reward_model={"reward_manager": "prime"}), None)
    with pytest.raises(InputError, match="the directory /nonexistent does not exist"):
        load_reward_manager(trainer_config(custom_reward_function={"path": "/nonexistent/x.py"}), None)
