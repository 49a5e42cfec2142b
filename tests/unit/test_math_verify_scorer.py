"""The math_verify scorer: symbolic equality by math-verify, boxed or free-form answers, on the reward
manager's helper thread (math-verify's own signal timeouts would fail there), and as a custom reward
function loaded by file path.
"""

from __future__ import annotations

import importlib.machinery
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("math_verify")

from verl.workers.reward.loading import load_custom_reward_function  # noqa: E402
from verl.workers.reward.scorers import default_compute_score  # noqa: E402
from verl.workers.reward.scorers import math_verify as mv_scorer  # noqa: E402

RIGHT = {"score": 1.0, "acc": 1.0}
WRONG = {"score": 0.0, "acc": 0.0}


@pytest.mark.parametrize(
    ("response", "ground_truth", "expected"),
    [
        ("so the answer is $\\boxed{1/2}$", "0.5", RIGHT),
        ("\\boxed{3}", "4", WRONG),
        ("\\boxed{\\frac{2}{4}}", "\\frac12", RIGHT),  # the MATH scorer's string rules say no
        ("\\boxed{(x+1)^2}", "x^2+2x+1", RIGHT),
        ("$\\boxed{\\{1,2,3\\}}$", "\\{3,2,1\\}", RIGHT),
        ("\\boxed{2}", 2, RIGHT),  # a number as the ground truth
        ("\\boxed{4}, and 7 is not it", "4", RIGHT),  # the box wins over later numbers
        # free-form (no box): an answer phrase, else the last expression
        ("The answer is 0.5", "1/2", RIGHT),
        ("I got 3, then 4.", "4", RIGHT),
        ("I got 3, then 4.", "3", WRONG),
        ("I do not know", "3", WRONG),
        ("<answer>12</answer>", "12", WRONG),  # tags are not an answer format math-verify reads
    ],
)
def test_answers(response, ground_truth, expected):
    assert default_compute_score("math_verify", response, ground_truth) == expected


def test_a_whole_reference_solution_as_ground_truth():
    solution = "Half of 1 is $\\boxed{\\frac{1}{2}}$."
    assert mv_scorer.compute_score("\\boxed{0.5}", solution) == RIGHT
    assert mv_scorer.compute_score("\\boxed{2}", solution) == WRONG


@pytest.mark.parametrize(
    ("ground_truth", "message"),
    [("", "cannot read the ground truth ''"), (None, "got a NoneType"), (["1"], "got a list")],
)
def test_bad_ground_truth_is_an_error_not_a_zero(ground_truth, message):
    with pytest.raises(ValueError, match="math_verify scorer") as raised:
        mv_scorer.compute_score("\\boxed{1}", ground_truth)
    assert message in str(raised.value)


def test_scores_on_a_helper_thread():
    """Why the timeouts are off: math-verify's default one needs the main thread's signals."""
    import math_verify

    results: list[object] = []

    def run(fn):
        thread = threading.Thread(target=lambda: results.append(_outcome(fn)))
        thread.start()
        thread.join()
        return results.pop()

    assert run(lambda: mv_scorer.compute_score("\\boxed{1/2}", "0.5")) == RIGHT
    failed = run(lambda: math_verify.parse("\\boxed{1/2}"))
    assert isinstance(failed, ValueError) and "threaded environment" in str(failed)


def _outcome(fn):
    try:
        return fn()
    except Exception as error:
        return error


def test_custom_reward_function_by_path():
    """verl calls a custom reward function with keywords, data_source included; loading this file by path
    puts its directory on sys.path, where it and reasoning_gym.py would shadow the real packages."""
    path = Path(mv_scorer.__file__)
    fn = load_custom_reward_function(str(path), "compute_score")
    kwargs = {
        "data_source": "my_math",
        "solution_str": "\\boxed{1/2}",
        "ground_truth": "0.5",
        "extra_info": None,
    }
    assert fn(**kwargs) == RIGHT
    assert str(path.parent) not in sys.path
    for package in ("math_verify", "reasoning_gym"):
        spec = importlib.machinery.PathFinder.find_spec(package)
        assert spec is None or Path(spec.origin).parent != path.parent


def test_missing_package_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # import math_verify now raises ImportError
    mv_scorer._parse_gold.cache_clear()
    with pytest.raises(
        ImportError, match=r"needs the math-verify package, which is not installed: pip install"
    ):
        default_compute_score("math_verify", "\\boxed{1}", "1")
    mv_scorer._parse_gold.cache_clear()
