"""The MATH scorer: last-box extraction, Hendrycks-style answer normalisation, and the data_source dispatch.

Expectations are written by hand from the LaTeX; none is computed by the code under test.
"""

from __future__ import annotations

import pytest

from verl.utils.reward_score import default_compute_score
from verl.workers.reward.scorers import MATH_DATA_SOURCES, SCORERS
from verl.workers.reward.scorers.math_reward import (
    compute_score,
    is_equiv,
    last_boxed_answer,
    normalize_answer,
)

# ---------------------------------------------------------------------------------------------
# extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so $\\boxed{5}$.", "5"),
        ("$\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}"),  # nested braces
        ("$\\boxed{\\sqrt{\\frac{a}{b^{2}}}}$ done", "\\sqrt{\\frac{a}{b^{2}}}"),  # nested twice
        ("first \\boxed{1}, then \\boxed{2}", "2"),  # the last box wins
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),  # escaped braces are not structure
        ("\\boxed{\\left\\{ x \\right.}", "\\left\\{ x \\right."),  # an unpaired escaped brace
        ("The answer is $\\boxed 5$.", "5"),  # brace-less form, up to the closing $
        ("\\boxed {7}", "7"),
        ("\\fbox{3}", "3"),
        ("\\fbox{3} and \\boxed{4}", "4"),  # \boxed preferred over \fbox
        ("\\boxed{unclosed", None),
        ("no box at all: 5", None),
        ("\\boxedx{5}", None),  # another command, not a box
        ("", None),
    ],
)
def test_last_boxed_answer(text: str, expected: str | None) -> None:
    assert last_boxed_answer(text) == expected


# ---------------------------------------------------------------------------------------------
# normalisation


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("\\frac12", "\\frac{1}{2}"),
        ("\\frac1{72}", "\\frac{1}{72}"),
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("\\tfrac{3}{4}", "\\frac34"),
        ("0.5", "\\frac{1}{2}"),  # as Hendrycks et al.
        ("1/2", "\\frac{1}{2}"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("x = 3", "3"),
        ("10\\text{ cm}", "10"),
        ("90^\\circ", "90"),
        ("90^{\\circ}", "90"),
        ("\\$5", "5"),
        ("50\\%", "50"),
        (".5", "0.5"),
        ("5.0", "5"),
        ("2.50", "2.5"),
        ("1,000", "1000"),
        ("10,\\!000", "10000"),
        ("2\\sqrt3", "2\\sqrt{3}"),
        ("2\\sqrt 3", "2\\sqrt{3}"),
        (" 4 \n", "4"),
    ],
)
def test_normalised_equal(a: str, b: str) -> None:
    assert normalize_answer(a) == normalize_answer(b)
    assert is_equiv(a, b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("\\frac{2}{4}", "\\frac{1}{2}"),  # no symbolic equivalence
        ("3", "4"),
        ("(1,2)", "[1,2]"),
        ("1,2", "12"),  # a pair is not a number with a separator
        ("\\text{ (A)}", "\\text{ (B)}"),  # whole-answer text is not cut to nothing
        ("50", "5"),
        ("\\sqrt[3]{2}", "\\sqrt{3}2"),
    ],
)
def test_normalised_different(a: str, b: str) -> None:
    assert not is_equiv(a, b)


def test_normalize_answer_examples() -> None:
    assert normalize_answer("\\left( \\dfrac{1}{2}, 3 \\right)") == "(\\frac{1}{2},3)"
    assert normalize_answer("k = \\frac12") == "\\frac{1}{2}"
    assert normalize_answer("5.0") == "5"


def test_missing_answer_is_never_equal() -> None:
    assert not is_equiv(None, "5")
    assert not is_equiv("5", None)
    assert not is_equiv(None, None)


# ---------------------------------------------------------------------------------------------
# scoring and dispatch


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("So the answer is $\\boxed{\\dfrac{1}{2}}$.", "\\frac{1}{2}", 1.0),
        ("$\\boxed{0.5}$", "\\frac{1}{2}", 1.0),
        ("$\\boxed{\\left(3, 4\\right)}$", "(3,4)", 1.0),
        ("$\\boxed{3}$ no wait $\\boxed{4}$", "3", 0.0),  # the last box is the answer
        ("$\\boxed{4}$", "3", 0.0),
        ("the answer is 3", "3", 0.0),  # no box: no answer
        ("", "3", 0.0),
        ("$\\boxed{12}$", 12, 1.0),  # an integer ground truth
    ],
)
def test_compute_score(response: str, truth: object, expected: float) -> None:
    assert compute_score(response, truth) == expected


@pytest.mark.parametrize(
    "source", ["DigitalLearningGmbH/MATH-lighteval", "lighteval/MATH", "HuggingFaceH4/MATH-500"]
)
def test_registered_for_verls_math_sources(source: str) -> None:
    assert source in SCORERS and source in MATH_DATA_SOURCES
    assert default_compute_score(source, "$\\boxed{\\frac12}$", "\\frac{1}{2}") == {"score": 1.0, "acc": 1.0}
    assert default_compute_score(source, "$\\boxed{2}$", "\\frac{1}{2}") == {"score": 0.0, "acc": 0.0}
