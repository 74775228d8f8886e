"""Loading AFlow's split files: sizes, fields, ids, public tests, errors with file and line."""

from __future__ import annotations

import json

import pytest

from aflowrl.benchmarks import BENCHMARK_NAMES, get_benchmark
from aflowrl.benchmarks.errors import DataNotFoundError, DatasetLineError, UnknownBenchmarkError
from aflowrl.benchmarks.humaneval import aflow_split_indices

SIZES = {
    "gsm8k": (264, 1055),
    "math": (119, 486),
    "humaneval": (33, 131),
    "mbpp": (86, 341),
    "hotpotqa": (200, None),
    "drop": (200, 400),
}


@pytest.mark.parametrize("name", BENCHMARK_NAMES)
def test_aflow_splits_load_with_unique_ids(name, aflow_data_dir):
    benchmark = get_benchmark(name)
    validate_size, test_size = SIZES[name]
    validate = benchmark.load("validate", aflow_data_dir)
    assert len(validate) == validate_size
    ids = {p.problem_id for p in validate}
    if test_size is None:
        with pytest.raises(DataNotFoundError, match=r"hotpotqa_test\.jsonl"):
            benchmark.load("test", aflow_data_dir)
    else:
        test = benchmark.load("test", aflow_data_dir)
        assert len(test) == test_size
        ids |= {p.problem_id for p in test}
        assert len(ids) == validate_size + test_size  # unique across splits (cache keys)
    assert all(p.benchmark == name and p.question and p.gold for p in validate)


def test_problem_fields_are_the_gold_fields_of_the_contract(aflow_data_dir):
    gsm8k = get_benchmark("gsm8k").load("validate", aflow_data_dir)[0]
    assert (gsm8k.problem_id, gsm8k.gold) == ("gsm8k-test-677", "36")
    math = get_benchmark("math").load("test", aflow_data_dir)[0]
    assert math.problem_id == "math-test-0" and "\\boxed{23}" in math.gold
    assert math.question.startswith("Find the smallest positive integer")
    drop = get_benchmark("drop").load("test", aflow_data_dir)[0]
    assert (drop.problem_id, drop.gold) == ("3481", "83")
    assert drop.question.startswith("Passage: The number of entrants")
    hotpot = get_benchmark("hotpotqa").load("validate", aflow_data_dir)[0]
    assert hotpot.gold == "Gesellschaft mit beschränkter Haftung"
    assert hotpot.question.startswith("Context: Constantin Medien AG (formerly")
    assert hotpot.question.endswith(
        "\n\nQuestion: VIVA Media AG changed it's name in 2004. What does their new acronym "
        "stand for?\n\nAnswer:"
    )
    mbpp = get_benchmark("mbpp").load("test", aflow_data_dir)[0]
    assert (mbpp.problem_id, mbpp.entry_point) == ("116", "tuple_to_int")
    assert mbpp.gold.startswith("def check():")
    assert mbpp.public_tests == ("assert candidate((1,2,3))==123",)


def test_humaneval_ids_are_normalised_and_public_tests_attached(aflow_data_dir):
    humaneval = get_benchmark("humaneval")
    test = humaneval.load("test", aflow_data_dir)
    assert test[0].problem_id == "HumanEval/84" and test[0].record["task_id"] == "HumanEval_84"
    assert test[0].entry_point == "solve"
    validate = humaneval.load("validate", aflow_data_dir)
    with_tests = [p for p in validate + test if p.public_tests]
    assert len(with_tests) == 159  # the public test file covers 159 of the 164 problems
    first = next(p for p in test if p.problem_id == "HumanEval/2")
    assert first.public_tests == ("assert candidate(3.5) == 0.5",)


def test_mbpp_public_tests_disambiguate_shared_entry_points(aflow_data_dir):
    mbpp = get_benchmark("mbpp")
    problems = mbpp.load("validate", aflow_data_dir) + mbpp.load("test", aflow_data_dir)
    assert all(p.public_tests for p in problems)
    split = {p.problem_id: p.public_tests for p in problems if p.entry_point == "Split"}
    assert split == {
        "629": ("assert candidate([1,2,3,4,5]) == [2,4]",),
        "554": ("assert candidate([1,2,3,4,5,6]) == [1,3,5]",),
    }


def test_humaneval_without_data_dir_is_aflows_split_from_the_package(aflow_data_dir, monkeypatch):
    monkeypatch.delenv("AFLOWRL_DATA_DIR", raising=False)
    humaneval = get_benchmark("humaneval")
    for split in ("validate", "test"):
        from_package = humaneval.load(split)
        from_files = humaneval.load(split, aflow_data_dir)
        assert [p.problem_id for p in from_package] == [p.problem_id for p in from_files]
        assert [(p.question, p.gold, p.entry_point) for p in from_package] == [
            (p.question, p.gold, p.entry_point) for p in from_files
        ]
        assert all(not p.public_tests for p in from_package)


def test_aflow_split_indices_partition_the_problems():
    validate, test = aflow_split_indices("validate"), aflow_split_indices("test")
    assert validate[:5] == [135, 115, 131, 55, 95]
    assert sorted(validate + test) == list(range(164))


def test_data_dir_from_the_environment(aflow_data_dir, monkeypatch):
    monkeypatch.setenv("AFLOWRL_DATA_DIR", str(aflow_data_dir))
    assert len(get_benchmark("gsm8k").load("validate")) == 264


def test_missing_data_dir_says_how_to_give_one(monkeypatch, tmp_path):
    monkeypatch.delenv("AFLOWRL_DATA_DIR", raising=False)
    with pytest.raises(DataNotFoundError, match="AFLOWRL_DATA_DIR"):
        get_benchmark("gsm8k").load("validate")
    with pytest.raises(DataNotFoundError, match="does not exist"):
        get_benchmark("gsm8k").load("validate", tmp_path / "nope")
    (tmp_path / "gsm8k_test.jsonl").write_text("")
    with pytest.raises(DataNotFoundError, match=r"gsm8k_validate\.jsonl.*gsm8k_test\.jsonl"):
        get_benchmark("gsm8k").load("validate", tmp_path)


def _write(path, lines):
    path.write_bytes(b"\n".join(lines) + b"\n")


GOOD = json.dumps({"question": "1+1?", "answer": "2", "id": "a"}).encode()


@pytest.mark.parametrize(
    ("bad", "message", "field"),
    [
        (b'{"question": "x", "answer": ', "not valid JSON", None),
        (b"[1, 2]", "expected a JSON object, got list", None),
        (b'{"answer": "2", "id": "b"}', "missing", "question"),
        (b'{"question": 3, "answer": "2", "id": "b"}', "expected text", "question"),
        (b'{"question": "x", "answer": ["2"], "id": "b"}', "expected text or a number", "answer"),
        (b'{"question": "x", "answer": "2", "id": "a"}', "duplicate problem id 'a'", None),
        (b'{"question": "\xff", "answer": "2"}', "not UTF-8", None),
        (b'{"question": "x", "answer": null, "id": "b"}', "expected text or a number", "answer"),
        (b'{"question": "x", "answer": true, "id": "b"}', "expected text or a number", "answer"),
        (b'{"question": "x", "question": "y", "answer": "2"}', "duplicate key 'question'", None),
        (b'{"question": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested deeper than 64", None),
    ],
)
def test_malformed_line_names_file_line_and_field(tmp_path, bad, message, field):
    path = tmp_path / "gsm8k_validate.jsonl"
    _write(path, [GOOD, b"", bad, GOOD.replace(b'"a"', b'"c"')])
    with pytest.raises(DatasetLineError) as caught:
        get_benchmark("gsm8k").load("validate", tmp_path)
    error = caught.value
    assert (error.path, error.line, error.field) == (path, 3, field)
    assert str(error).startswith(f"{path}:3: ") and message in str(error)


def test_numbers_are_accepted_as_answers_and_ids(tmp_path):
    _write(tmp_path / "gsm8k_validate.jsonl", [b'{"question": "q", "answer": 7, "id": 12}'])
    (problem,) = get_benchmark("gsm8k").load("validate", tmp_path)
    assert (problem.problem_id, problem.gold) == ("12", "7")


# Every benchmark's split file, one bad field at a time: ints, nulls and lists where text is
# expected. A number in a gold field is its text (str(), as AFlow's GSM8K reads its answers);
# anything else names the file, the line and the field.
_RECORDS = {
    "gsm8k": ({"question": "q", "answer": "7", "id": "a"}, ["question"], ["answer", "id"]),
    "math": ({"problem": "p", "solution": "s"}, ["problem"], ["solution"]),
    "drop": ({"id": "a", "context": "c", "ref_text": "r"}, ["context"], ["ref_text", "id"]),
    "hotpotqa": (
        {"_id": "a", "question": "q", "answer": "x", "context": [["t", ["s."]]]},
        ["question"],
        ["answer", "_id"],
    ),
    "mbpp": (
        {"task_id": 1, "prompt": "p", "entry_point": "f", "test": "t", "test_list": ["a"]},
        ["prompt", "entry_point", "test"],
        ["task_id"],
    ),
    "humaneval": (
        {"task_id": "HumanEval/0", "prompt": "p", "entry_point": "f", "test": "t"},
        ["task_id", "prompt", "entry_point", "test"],
        [],
    ),
}


@pytest.mark.parametrize(
    ("name", "field", "value"),
    [
        (name, field, value)
        for name, (_, text_only, numeric) in _RECORDS.items()
        for field in text_only + numeric
        for value in (None, [1], {"a": 1}, False, *((42,) if field in text_only else ()))
    ],
)
def test_a_field_of_the_wrong_type_names_file_line_and_field(tmp_path, name, field, value):
    record = {**_RECORDS[name][0], field: value}
    path = tmp_path / f"{name}_validate.jsonl"
    _write(path, [json.dumps(record).encode()])
    with pytest.raises(DatasetLineError) as caught:
        get_benchmark(name).load("validate", tmp_path)
    assert (caught.value.path, caught.value.line, caught.value.field) == (path, 1, field)


@pytest.mark.parametrize(
    ("name", "field"),
    [(name, field) for name, (_, _, numeric) in _RECORDS.items() for field in numeric],
)
def test_a_number_in_a_gold_or_id_field_is_its_text(tmp_path, name, field):
    record = {**_RECORDS[name][0], field: 1998}
    _write(tmp_path / f"{name}_validate.jsonl", [json.dumps(record).encode()])
    (problem,) = get_benchmark(name).load("validate", tmp_path)
    assert "1998" in (problem.gold if field not in ("id", "_id", "task_id") else problem.problem_id)


def test_a_line_past_the_limit_is_refused_without_reading_it_whole(tmp_path, monkeypatch):
    from aflowrl.benchmarks import _data

    monkeypatch.setattr(_data, "MAX_LINE_BYTES", 100)
    path = tmp_path / "gsm8k_validate.jsonl"
    _write(path, [GOOD, json.dumps({"question": "x" * 200, "answer": "1"}).encode()])
    with pytest.raises(DatasetLineError, match="longer than 100 bytes") as caught:
        get_benchmark("gsm8k").load("validate", tmp_path)
    assert caught.value.line == 2


def test_code_entry_point_must_be_a_name(tmp_path):
    record = {"task_id": "HumanEval/0", "prompt": "p", "entry_point": "not a name", "test": "t"}
    _write(tmp_path / "humaneval_validate.jsonl", [json.dumps(record).encode()])
    with pytest.raises(DatasetLineError, match="entry_point"):
        get_benchmark("humaneval").load("validate", tmp_path)


def test_unknown_benchmark():
    with pytest.raises(UnknownBenchmarkError, match="gsm8k"):
        get_benchmark("mmlu")
    assert get_benchmark(" GSM8K ") is get_benchmark("gsm8k")
