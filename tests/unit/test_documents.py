"""The bounded loaders (aflowrl.documents): depth, size, repeated keys, aliases, line numbers.

Adversarial documents answer with a DocumentError naming the source and the line, never with a
RecursionError, a hang or a silently dropped value. None of these tests measures time: a
quadratic scan or an alias expansion would not finish at all within the suite's timeout.
"""

from __future__ import annotations

import json

import pytest

from aflowrl import documents
from aflowrl.documents import DocumentError

# ----------------------------------------------------------------------------------------- JSON


def test_json_within_the_bounds_is_the_standard_parse():
    doc = {"a": [1, 2.5, None, True, {"b": 'x"y[{'}], "c": {"d": []}, "é": "ü"}
    text = json.dumps(doc, ensure_ascii=False)
    assert documents.load_json(text, source="t") == doc
    assert documents.load_json(text.encode(), source="t") == doc


@pytest.mark.parametrize("opening", ["[", '{"k":'])
def test_json_nested_past_the_limit_is_refused_before_parsing(opening):
    closing = "]" if opening == "[" else "}"
    text = opening * 100_000 + "1" + closing * 100_000  # CPython's json: RecursionError
    with pytest.raises(DocumentError) as caught:
        documents.load_json(text, source="req.workflow_json")
    assert str(caught.value) == "req.workflow_json: line 1: nested deeper than 64 levels"


def test_json_depth_counts_structure_not_brackets_inside_strings():
    text = json.dumps({"prompt": "[" * 1000 + "{" * 1000, "escaped": '\\"[[[['})
    assert documents.load_json(text, source="t")["prompt"].startswith("[[[")
    at_limit = "[" * documents.MAX_DEPTH + "]" * documents.MAX_DEPTH
    assert documents.load_json(at_limit, source="t") is not None
    with pytest.raises(DocumentError, match="deeper than 3"):
        documents.load_json('{"a": {"b": [[1]]}}', source="t", max_depth=3)


def test_json_too_deep_names_the_line_where_it_goes_too_deep():
    text = '{\n"a": 1,\n"b":\n' + "[" * 70 + "]" * 70 + "}"
    with pytest.raises(DocumentError) as caught:
        documents.load_json(text, source="t")
    assert caught.value.line == 4


def test_json_repeated_key_names_both_lines():
    text = '{\n  "name": "a",\n  "nodes": [{"id": 1, "id": 2}],\n  "name": "b"\n}'
    with pytest.raises(DocumentError) as caught:
        documents.load_json(text, source="f.json")
    # The first repetition found: the inner object's "id" (same line twice).
    assert str(caught.value) == "f.json: line 3: duplicate key 'id' (first on line 3)"
    text = '{\n  "name": "a",\n  "nodes": [{"name": 1}],\n  "name": "b"\n}'
    with pytest.raises(DocumentError) as caught:
        documents.load_json(text, source="f.json")
    assert str(caught.value) == "f.json: line 4: duplicate key 'name' (first on line 2)"


def test_json_same_key_in_sibling_objects_is_fine():
    assert documents.load_json('[{"a": 1}, {"a": 2}]', source="t") == [{"a": 1}, {"a": 2}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": 1', "line 1: not JSON: Expecting ',' delimiter (column 8)"),
        ("", "line 1: not JSON: Expecting value (column 1)"),
        ("1" * 5000, "not JSON: Exceeds the limit (4300 digits)"),  # ValueError, not a decode one
        (b"\xff\xfe{}", "not UTF-8 (byte 0)"),
        ('\\"' * 50_000, "not JSON"),  # backslashes outside strings: still one linear scan
        ('"' * 100_001, "not JSON"),
        ('["' + "a" * 100_000, "not JSON: Unterminated string"),
    ],
)
def test_json_that_does_not_parse_says_why(text, message):
    with pytest.raises(DocumentError) as caught:
        documents.load_json(text, source="t")
    assert message in str(caught.value)


def test_json_over_the_size_limit_is_refused_before_parsing():
    with pytest.raises(DocumentError, match="t: 12 characters; at most 10"):
        documents.load_json('["aaaaaaaa"]', source="t", max_chars=10)
    with pytest.raises(DocumentError, match="at most 10"):
        documents.load_json(b'["aaaaaaaa"]', source="t", max_chars=10)


# ----------------------------------------------------------------------------------------- YAML


def test_yaml_within_the_bounds_is_the_safe_parse():
    text = "a: 1\nb: [x, {c: true}]\nd: |\n  two\n  lines\nanchored: &a {x: 1}\n"
    assert documents.load_yaml(text, source="t") == {
        "a": 1,
        "b": ["x", {"c": True}],
        "d": "two\nlines\n",
        "anchored": {"x": 1},
    }
    assert documents.load_yaml("", source="t") is None


def test_yaml_aliases_are_refused_at_once():
    # Nine levels of nine: 9**9 = 387 million leaves once expanded.
    lines = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for previous, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]")
    with pytest.raises(DocumentError) as caught:
        documents.load_yaml("\n".join(lines), source="run.yaml")
    assert str(caught.value) == (
        "run.yaml: line 2: YAML aliases are not accepted (*a): write the value out"
    )
    with pytest.raises(DocumentError, match="aliases"):
        documents.load_yaml("base: &b {x: 1}\nrun:\n  <<: *b\n", source="t")


def test_yaml_merge_keys_without_aliases_still_merge():
    assert documents.load_yaml("a: {<<: {x: 1, y: 2}, x: 3}", source="t") == {"a": {"x": 3, "y": 2}}


@pytest.mark.parametrize(
    "text",
    ["a: " + "[" * 5000 + "]" * 5000, "a:\n" + "".join("  " * i + "- \n" for i in range(100))],
)
def test_yaml_nested_past_the_limit_is_refused(text):
    with pytest.raises(DocumentError) as caught:
        documents.load_yaml(text, source="t")
    assert caught.value.line is not None
    assert "nest" in str(caught.value)  # ours, or libyaml's own limit on flow nesting


def test_yaml_repeated_key_names_both_lines():
    with pytest.raises(DocumentError) as caught:
        documents.load_yaml("policy:\n  model: a\ntrainer: {}\npolicy:\n  model: b\n", source="r")
    assert str(caught.value) == "r: line 4: duplicate key 'policy' (first on line 1)"
    with pytest.raises(DocumentError, match="line 1: duplicate key 'x' \\(first on line 1\\)"):
        documents.load_yaml("a: {x: 1, x: 2}", source="r")


def test_yaml_too_many_values_or_too_long_is_refused():
    with pytest.raises(DocumentError, match="more than 50 values"):
        documents.load_yaml("[" + ", ".join(["1"] * 100) + "]", source="t", max_nodes=50)
    with pytest.raises(DocumentError, match="at most 10"):
        documents.load_yaml("a: 123456789", source="t", max_chars=10)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: b: c", "line 1: not valid YAML: mapping values are not allowed"),
        ("a: 1\n---\nb: 2\n", "line 2: not valid YAML: expected a single document"),
        ("? [a]\n: 1\n", "line 1: not valid YAML: while constructing a mapping"),
        ("a: !!python/object:os.system x", "not valid YAML"),
    ],
)
def test_yaml_that_does_not_parse_says_why(text, message):
    with pytest.raises(DocumentError) as caught:
        documents.load_yaml(text, source="t")
    assert message in str(caught.value)


# ---------------------------------------------------------------------------------------- files


def test_read_text_refuses_what_is_not_a_small_utf8_file(tmp_path):
    good = tmp_path / "run.yaml"
    good.write_text("a: 1\n")
    assert documents.read_text(good, source="-f", max_bytes=10) == "a: 1\n"
    (tmp_path / "big").write_bytes(b"x" * 11)
    (tmp_path / "latin").write_bytes(b"caf\xe9")
    for path, message in [
        (tmp_path / "missing", "no such file"),
        (tmp_path, "is a directory"),
        (tmp_path / "big", "larger than 10 bytes"),
        (tmp_path / "latin", r"not UTF-8 text \(byte 3\)"),
    ]:
        with pytest.raises(DocumentError, match=message) as caught:
            documents.read_text(path, source="-f", max_bytes=10)
        assert caught.value.field == "-f"


def test_yaml_exponent_floats_without_a_dot_are_numbers_as_kubectl_reads_them():
    doc = documents.load_yaml("a: 1e-08\nb: -2E3\nc: 10\nd: '1e5'\ne: 3e\n", source="x")
    assert doc == {"a": 1e-08, "b": -2000.0, "c": 10, "d": "1e5", "e": "3e"}
    assert isinstance(doc["c"], int)
