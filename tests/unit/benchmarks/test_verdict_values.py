"""The plain values that cross between the verdict driver and the answer process.

Round trips keep exact types and values (nan, -0.0, big integers, nested containers); the
driver's strict side refuses anything else; the answer's lenient side reads honest subclasses as
their base type and any other object as an opaque value; the parser refuses every malformed
tree or message. A random oracle compares round trips on generated values.
"""

from __future__ import annotations

import collections
import enum
import json
import math
import random
import struct

import pytest

from aflowrl.benchmarks import _verdict
from aflowrl.benchmarks._verdict import AnswerObject, from_tree, to_tree


def _same(a: object, b: object) -> bool:
    """Equal with the same type all the way down (nan equals nan, -0.0 differs from 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )  # type: ignore[arg-type]
    if isinstance(a, complex):
        return _same(a.real, b.real) and _same(a.imag, b.imag)  # type: ignore[attr-defined]
    if isinstance(a, dict):
        return _same(list(a.items()), list(b.items()))  # type: ignore[attr-defined]
    if isinstance(a, set | frozenset):  # (nan elements: matched, not looked up)
        return len(a) == len(b) and all(any(_same(x, y) for y in b) for x in a)  # type: ignore[arg-type,attr-defined]
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]
    return a == b


def _wire(value: object, *, lenient: bool = False) -> object:
    """Through a real message: encode, frame, parse strictly, rebuild."""
    frame = _verdict.encode_message("return", to_tree(value, lenient=lenient))
    (length,) = struct.unpack(">I", frame[:4])
    message = _verdict.decode_message(frame[4 : 4 + length])
    assert message[0] == "return"
    return from_tree(message[1])


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -7,
        2**53,
        -(2**53) - 1,
        10**5000,
        1.5,
        -0.0,
        float("inf"),
        float("-inf"),
        float("nan"),
        5e-324,
        complex(1.5, -0.0),
        "",
        "héllo \ud800 \x00",
        b"\x00\xff",
        [],
        (),
        (1,),
        [1, [2, (3, {4: "x"})]],
        {(1, 2): frozenset({3}), "k": {1.5, None}},
        {True: 1, 2: False},
        set(),
        frozenset(),
    ],
    ids=lambda v: f"{type(v).__name__}-{hex(v)[:12] if type(v) is int else repr(v)[:30]}",
)
def test_plain_values_cross_with_their_exact_types(value):
    assert _same(_wire(value), value)


def _random_value(rng: random.Random, depth: int = 0) -> object:
    scalars = [
        lambda: None,
        lambda: rng.random() < 0.5,
        lambda: rng.randint(-(2**70), 2**70),
        lambda: rng.choice([rng.uniform(-1e9, 1e9), float("nan"), float("inf"), -0.0]),
        lambda: complex(rng.random(), rng.random()),
        lambda: "".join(chr(rng.randint(0, 0x10FFFF)) for _ in range(rng.randint(0, 6))),
        lambda: bytes(rng.randint(0, 255) for _ in range(rng.randint(0, 6))),
    ]
    if depth >= 4 or rng.random() < 0.4:
        return rng.choice(scalars)()
    items = [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    hashable = [i for i in items if _hashable(i)]
    kind = rng.choice(["list", "tuple", "dict", "set", "frozenset"])
    if kind == "list":
        return items
    if kind == "tuple":
        return tuple(items)
    if kind == "dict":
        return {k: v for k, v in zip(hashable, items, strict=False)}
    return (set if kind == "set" else frozenset)(hashable)


def _hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def test_random_values_round_trip_like_a_deep_copy():
    rng = random.Random(13)
    for _ in range(500):
        value = _random_value(rng)
        assert _same(_wire(value), value), value


class _Liar(int):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = int.__hash__


class _Colour(enum.Enum):
    RED = "red"


class _Level(enum.IntEnum):
    HIGH = 3


class _StrColour(enum.StrEnum):
    BLUE = "blue"


def test_the_drivers_side_refuses_anything_but_exact_plain_types():
    for value in (_Liar(3), collections.Counter("ab"), _Level.HIGH, [object()], iter([1])):
        with pytest.raises(TypeError, match="only plain values"):
            to_tree(value)


def test_the_answers_side_reads_honest_subclasses_as_their_base_type():
    point = collections.namedtuple("point", "x y")
    cases = [
        (collections.Counter("aab"), {"a": 2, "b": 1}),
        (collections.OrderedDict(b=1, a=2), {"b": 1, "a": 2}),
        (collections.defaultdict(list, {1: [2]}), {1: [2]}),
        (point(1, 2), (1, 2)),
        (_Level.HIGH, 3),
        (_StrColour.BLUE, "blue"),
        (_Liar(3), 3),
        (bytearray(b"ab"), b"ab"),
    ]
    for value, plain in cases:
        assert _same(_wire(value, lenient=True), plain), value


def test_the_answers_other_objects_keep_only_their_truth():
    generator = _wire((i for i in range(3)), lenient=True)
    assert isinstance(generator, AnswerObject) and bool(generator) is True
    match = _wire(__import__("re").search("a", "cat"), lenient=True)
    assert isinstance(match, AnswerObject) and bool(match) and match.type_name == "re.Match"
    enum_member = _wire(_Colour.RED, lenient=True)
    assert isinstance(enum_member, AnswerObject)
    # It equals nothing but itself, whatever it stood for.
    assert enum_member != _Colour.RED and enum_member != "red" and enum_member == enum_member

    class Undecided:
        def __bool__(self) -> bool:
            raise ValueError("no")

    undecided = _wire(Undecided(), lenient=True)
    with pytest.raises(TypeError, match="no truth value"):
        bool(undecided)


def test_numpy_scalars_cross_as_python_numbers():
    numpy = pytest.importorskip("numpy")
    assert _same(_wire(numpy.int64(7), lenient=True), 7)
    assert _same(_wire(numpy.bool_(True), lenient=True), True)
    assert _same(_wire(numpy.float32(0.5), lenient=True), 0.5)
    assert isinstance(_wire(numpy.arange(3), lenient=True), AnswerObject)


def test_depth_and_size_are_bounded_both_ways(monkeypatch):
    deep: list[object] = []
    for _ in range(_verdict.MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(ValueError, match="deeper"):
        to_tree(deep)
    tree: object = ["l"]
    for _ in range(_verdict.MAX_DEPTH + 5):
        tree = ["l", tree]
    with pytest.raises(ValueError, match="deeper"):
        from_tree(tree)
    shared: list[object] = [0]
    for _ in range(40):  # a DAG of 2**40 leaves in a few objects
        shared = [shared, shared]
    monkeypatch.setattr(_verdict, "MAX_NODES", 10_000)
    with pytest.raises(ValueError, match="parts"):
        to_tree(shared)
    to_tree(list(range(9_000)))
    with pytest.raises(ValueError, match="parts"):
        to_tree([list(range(5_000)), {i: i for i in range(3_000)}])
    with pytest.raises(ValueError, match="parts"):
        from_tree(["l", *range(20_000)])


@pytest.mark.parametrize(
    "tree",
    [
        1.5,
        {"a": 1},
        ["x", 1],
        [],
        [1, 2],
        ["i", 5],
        ["i", "zz"],
        ["f", "0x1.8p+1", "extra"],
        ["b", "abc"],
        ["d", 1],
        ["d", ["l"], 1],
        ["s", ["l"]],
        ["o", "re.Match", 1],
        ["o", 5, True],
    ],
    ids=repr,
)
def test_malformed_trees_are_refused(tree):
    with pytest.raises((ValueError, TypeError)):
        from_tree(tree)


@pytest.mark.parametrize(
    "body",
    [b'{"return": 1}', b'["return", 1.5]', b'["return", NaN]', b"[]", b"[1]", b"\xff", b"[[", b"5"],
    ids=repr,
)
def test_messages_are_json_arrays_without_objects_floats_or_constants(body):
    with pytest.raises(ValueError):
        _verdict.decode_message(body)
    json.loads('["ok"]')  # (the parser itself is the standard one)


def test_free_names_are_what_the_tests_take_from_the_answer():
    sort_third = (
        "def check(candidate):\n"
        "    assert tuple(candidate([1, 2, 3])) == tuple(sort_third([1, 2, 3]))\n"
    )
    assert _verdict.free_names(sort_third, set()) == ["sort_third"]
    tuple_size = "def check():\n    assert tuple_size((1,)) == sys.getsizeof((1,))\n"
    assert _verdict.free_names(tuple_size, {"tuple_size"}) == ["sys"]
    own = (
        "import random\nfrom math import fabs\nMETADATA = {}\n"
        "def check(candidate):\n    for i in range(3):\n        x = fabs(random.random())\n"
        "    try:\n        pass\n    except ValueError as e:\n        print(e)\n"
    )
    assert _verdict.free_names(own, set()) == []
    assert _verdict.imported_modules(own) == ["random", "math"]


def test_builtins_and_dunder_names_are_never_taken_from_the_answer():
    calls_builtins = (
        "def check():\n"
        "    assert set(similar((1, 2), (2, 3))) == set((2,))\n"
        "    assert abs(len(__builtins__) - __custom__) >= 0 and __name__\n"
    )
    assert _verdict.free_names(calls_builtins, set()) == ["similar"]
