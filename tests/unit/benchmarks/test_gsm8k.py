"""GSM8K scoring follows AFlow: last number, commas stripped, |a - b| <= 1e-6, no number = 0."""

from __future__ import annotations

import pytest

from aflowrl.benchmarks import get_benchmark
from aflowrl.benchmarks.gsm8k import extract_number


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("The answer is 42.", 42.0),
        ("first 3 then 7", 7.0),
        ("total: 1,234,567 apples", 1234567.0),
        ("-5 degrees", -5.0),
        ("+3.25", 3.25),
        ("costs $18.00", 18.0),
        ("ratio 1,23", 23.0),  # "1,23" is no thousands group: the last number is 23
        ("1,2345", 5.0),  # "1,234" then "5"
        ("version 2.5.1", 1.0),  # "2.5" then ".1" gives "1" as the last match
        ("no digits here", None),
        ("", None),
        ("١٢٣", 123.0),  # Unicode digits count, as in Python's \d and float()
        ("3.", 3.0),
        (".5", 5.0),
    ],
)
def test_extract_number(text, number):
    assert extract_number(text) == number


@pytest.mark.parametrize(
    ("prediction", "gold", "score"),
    [
        ("so the answer is 69", "69", 1.0),
        ("#### 1,000", "1000", 1.0),
        ("69.0000001", "69", 1.0),
        ("69.00001", "69", 0.0),
        ("68", "69", 0.0),
        ("I don't know", "69", 0.0),
        ("42", "no number", 0.0),
        ("The result: 5. Then 6 more", "6", 1.0),
        ("-3", "3", 0.0),
        ("1e3", "3", 1.0),  # the last number of "1e3" is 3
    ],
)
def test_score_answer(prediction, gold, score):
    assert get_benchmark("gsm8k").score_answer(prediction, gold) == score


@pytest.mark.parametrize(
    ("prediction", "gold", "score"),
    [
        ("the answer is 18", 18, 1.0),
        ("18.0", 18.0, 1.0),
        ("17", 18, 0.0),
        (18, "18", 1.0),
        (None, "18", 0.0),  # str(None) holds no number
        ("18", None, 0.0),
    ],
)
def test_numeric_values_score_as_aflow_scores_them(prediction, gold, score):
    """AFlow's extract_number applies str(): a number (a split file's `"answer": 18`) scores."""
    assert get_benchmark("gsm8k").score_answer(prediction, gold) == score


def test_score_detail_says_why():
    detail = get_benchmark("gsm8k").score_detail("about 12", "13")
    assert detail.value == 0.0 and detail.extracted == "12.0" and "13" in detail.detail
