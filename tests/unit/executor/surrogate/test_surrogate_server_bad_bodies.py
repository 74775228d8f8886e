"""Bodies no OpenAI client sends on purpose: the surrogate server answers each with OpenAI's 400
(or 413) in OpenAI's error shape, naming the parameter as the client sent it, and never with a
500, a plain-text page or a traceback in the log.

The HTTP cases go through a real server on loopback; the random mutations go through
:func:`protocol.read_body` and :func:`protocol.parse_chat_request`, which every body passes
through first, and may raise nothing but :class:`protocol.ApiError`.
"""

from __future__ import annotations

import gzip
import json
import logging
import random
import zlib

import aiohttp
import pytest

from aflowrl.executor.surrogate import protocol
from aflowrl.executor.surrogate.server import MAX_BODY_BYTES, SurrogateServer

_HELLO = [{"role": "user", "content": "Say hello."}]
_SERVED = ("surrogate",)


def _body(**extra: object) -> str:
    return json.dumps({"model": "surrogate", "messages": _HELLO, **extra})


def _with_raw(name: str, raw: str) -> str:
    """A valid body with one more member whose JSON text is ``raw`` (beyond ``json.dumps``)."""
    return _body()[:-1] + f', "{name}": {raw}' + "}"


async def _post_raw(
    surrogate: object, data: bytes, headers: dict[str, str]
) -> tuple[int, str, object]:
    """POST ``data`` as it is to a fresh server: status, content type, JSON answer."""
    async with SurrogateServer(surrogate) as server, aiohttp.ClientSession() as http:  # type: ignore[arg-type]
        url = f"{server.base_url}/chat/completions"
        async with http.post(url, data=data, headers=headers) as response:
            return response.status, response.content_type, await response.json()


def _is_openai_error(answer: object) -> bool:
    if not isinstance(answer, dict) or set(answer) != {"error"}:
        return False
    error = answer["error"]
    return isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}


BAD_BODIES = [
    # nesting beyond any chat request's, at the top, in a message, in an ignored member
    pytest.param("[" * 100_000 + "]" * 100_000, None, id="deep-top-level"),
    pytest.param(_with_raw("metadata", "[" * 50_000 + "]" * 50_000), "metadata", id="deep-meta"),
    pytest.param(
        json.dumps({"model": "surrogate", "messages": [{"role": "user"}]})[:-3]
        + ', "content": '
        + "[" * 3000
        + "]" * 3000
        + "}]}",
        "messages",
        id="deep-content",
    ),
    pytest.param(_with_raw("stop", "[" * 40 + "]" * 40), "stop", id="just-too-deep"),
    # numbers beyond Python's int (digit limit) and float range, in numeric fields
    pytest.param(_with_raw("n", "9" * 5000), "n", id="n-5000-digits"),
    pytest.param(_with_raw("seed", "9" * 400), "seed", id="seed-400-digits"),
    pytest.param(_with_raw("seed", str(2**70)), "seed", id="seed-over-int64"),
    pytest.param(_with_raw("temperature", "1e400"), "temperature", id="temperature-1e400"),
    pytest.param(_with_raw("temperature", "-" + "9" * 4400), "temperature", id="temp-huge-int"),
    pytest.param(_with_raw("max_tokens", "-" + "9" * 400), "max_tokens", id="max-tokens-neg"),
    pytest.param(_with_raw("max_completion_tokens", "1e999"), "max_completion_tokens", id="mct"),
    pytest.param(_with_raw("top_p", "9" * 4400), "top_p", id="top-p-huge"),
    pytest.param(_with_raw("metadata", '{"k": ' + "9" * 5000 + "}"), "metadata.k", id="meta-int"),
    pytest.param(_with_raw("n", "NaN"), None, id="nan-is-not-json"),
    pytest.param(_with_raw("temperature", "-Infinity"), None, id="infinity-is-not-json"),
    # the wrong JSON type inside messages and elsewhere
    pytest.param(
        json.dumps({"model": "surrogate", "messages": [{"role": [], "content": "x"}]}),
        "messages[0].role",
        id="role-array",
    ),
    pytest.param(
        json.dumps({"model": "surrogate", "messages": [{"role": {"a": 1}, "content": "x"}]}),
        "messages[0].role",
        id="role-object",
    ),
    pytest.param(
        json.dumps({"model": "surrogate", "messages": [{"role": "user", "content": 5}]}),
        "messages[0].content",
        id="content-number",
    ),
    pytest.param(
        json.dumps(
            {"model": "surrogate", "messages": [{"role": "user", "content": "x", "name": 5}]}
        ),
        "messages[0].name",
        id="name-number",
    ),
    pytest.param(
        json.dumps(
            {"model": "surrogate", "messages": [{"role": "user", "content": [{"type": {}}]}]}
        ),
        "messages[0].content[0]",
        id="part-type-object",
    ),
    pytest.param(
        json.dumps(
            {
                "model": "surrogate",
                "messages": [{"role": "user", "content": [{"type": "text", "text": ["x"]}]}],
            }
        ),
        "messages[0].content[0].text",
        id="part-text-array",
    ),
    pytest.param(
        json.dumps({"model": "surrogate", "messages": [["user", "hi"]]}),
        "messages[0]",
        id="message-array",
    ),
    pytest.param(json.dumps({"model": "surrogate", "messages": "hi"}), "messages", id="msgs-str"),
    pytest.param(json.dumps({"model": 5, "messages": _HELLO}), "model", id="model-number"),
    pytest.param(_body(n="2"), "n", id="n-string"),
    pytest.param(_body(n=True), "n", id="n-boolean"),
    pytest.param(_body(n=2.5), "n", id="n-fraction"),
    pytest.param(_body(n=0), "n", id="n-zero"),
    pytest.param(_body(n=129), "n", id="n-over-128"),
    pytest.param(_body(temperature=[1]), "temperature", id="temperature-array"),
    pytest.param(_body(temperature=2.5), "temperature", id="temperature-over-2"),
    pytest.param(_body(user=5), "user", id="user-number"),
    pytest.param(_body(metadata=[1]), "metadata", id="metadata-array"),
    pytest.param(_body(stream=True, stream_options=[1]), "stream_options", id="options-array"),
    pytest.param(
        _body(stream=True, stream_options={"include_usage": "yes"}),
        "stream_options.include_usage",
        id="include-usage-string",
    ),
    # the parameter the client sent, not the one the executor calls it
    pytest.param(_body(max_completion_tokens=0), "max_completion_tokens", id="mct-zero"),
    pytest.param(_body(max_tokens=-1, max_completion_tokens=5), "max_tokens", id="both-limits"),
]


@pytest.mark.parametrize(("raw", "param"), BAD_BODIES)
async def test_a_malformed_body_is_a_400_in_openai_shape_naming_the_parameter(
    surrogate, caplog, raw, param
):
    caplog.set_level(logging.DEBUG)
    status, content_type, answer = await _post_raw(
        surrogate, raw.encode(), {"Content-Type": "application/json"}
    )
    assert status == 400 and content_type == "application/json", answer
    assert _is_openai_error(answer) and isinstance(answer, dict), answer
    assert answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["param"] == param, answer
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data)


def _deflate(data: bytes) -> bytes:
    return zlib.compress(data)


def _raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


BROKEN_ENCODINGS = [
    pytest.param({"Content-Encoding": "gzip"}, b"not gzip at all", 400, id="gzip-garbage"),
    pytest.param({"Content-Encoding": "gzip"}, _gzip(_body().encode())[:-8], 400, id="gzip-cut"),
    pytest.param(
        {"Content-Encoding": "gzip"}, _gzip(_body().encode()) + b"tail", 400, id="gzip-trailing"
    ),
    pytest.param({"Content-Encoding": "deflate"}, b"not deflate", 400, id="deflate-garbage"),
    pytest.param({"Content-Encoding": "br"}, b"not brotli", 400, id="brotli"),
    pytest.param({"Content-Encoding": "zstd"}, b"not zstd", 400, id="zstd"),
    pytest.param({"Content-Encoding": "compress"}, _body().encode(), 400, id="unknown-coding"),
    pytest.param(
        {"Content-Encoding": "gzip, gzip"}, _gzip(_body().encode()), 400, id="gzip-listed-twice"
    ),
    pytest.param(
        {"Content-Type": "application/json; charset=no-such-charset"},
        _body().encode(),
        400,
        id="unknown-charset",
    ),
    pytest.param(
        {"Content-Type": "application/json; charset=rot13"}, _body().encode(), 400, id="rot13"
    ),
    pytest.param({}, b'{"model": "surrogate", "messages": "\xff\xfe"}', 400, id="bad-utf8"),
    pytest.param(
        {"Content-Type": "application/json; charset=utf-16"}, b"\x00\xd8{}", 400, id="bad-utf16"
    ),
    pytest.param(
        {"Content-Encoding": "gzip"},
        _gzip(b" " * (MAX_BODY_BYTES + 1)),
        413,
        id="decompression-bomb",
    ),
]


@pytest.mark.parametrize(("headers", "data", "status"), BROKEN_ENCODINGS)
async def test_a_broken_content_encoding_is_refused_in_openai_shape(
    surrogate, caplog, headers, data, status
):
    caplog.set_level(logging.DEBUG)
    got, content_type, answer = await _post_raw(
        surrogate, data, {"Content-Type": "application/json", **headers}
    )
    assert got == status and content_type == "application/json", answer
    assert _is_openai_error(answer), answer
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]


@pytest.mark.parametrize(
    ("headers", "encode"),
    [
        ({"Content-Encoding": "gzip"}, _gzip),
        ({"Content-Encoding": "x-gzip"}, _gzip),
        ({"Content-Encoding": "deflate"}, _deflate),
        ({"Content-Encoding": "deflate"}, _raw_deflate),
        ({"Content-Encoding": "identity"}, bytes),
        ({"Content-Type": "application/json; charset=latin-1"}, bytes),
    ],
    ids=["gzip", "x-gzip", "deflate", "raw-deflate", "identity", "latin-1"],
)
async def test_well_formed_encodings_are_read(surrogate, headers, encode):
    status, _, answer = await _post_raw(
        surrogate, encode(_body(seed=1).encode()), {"Content-Type": "application/json", **headers}
    )
    assert status == 200 and isinstance(answer, dict), answer
    assert answer["choices"][0]["message"]["role"] == "assistant"


async def test_an_unexpected_error_is_a_500_in_openai_shape(surrogate, monkeypatch, caplog):
    async def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(surrogate, "complete", broken)
    status, content_type, answer = await _post_raw(surrogate, _body().encode(), {})
    assert status == 500 and content_type == "application/json"
    assert _is_openai_error(answer) and isinstance(answer, dict)
    assert answer["error"]["type"] == "server_error"
    assert "a bug" not in answer["error"]["message"]  # the client learns no internals


# -- random mutations of a valid body: ApiError (400, 404 or 413) and nothing else -----------------

_VALUES = [
    None,
    True,
    0,
    -1,
    1,
    2.5,
    10**400,
    -(10**400),
    1e308,
    "",
    "x",
    [],
    [1],
    ["a", None],
    {},
    {"a": []},
    {"type": "text"},
    {"type": "text", "text": 1},
    [[[[[[]]]]]],
]


def _mutate(value: object, rng: random.Random, depth: int = 0) -> object:
    """``value`` with one member or item (at any depth) replaced by a value of another type."""
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice([*value, "role", "content", "text", "type", "name"])
        changed = dict(value)
        changed[key] = _mutate(value.get(key), rng, depth + 1)
        return changed
    if isinstance(value, list) and value and rng.random() < 0.8:
        index = rng.randrange(len(value))
        changed_list = list(value)
        changed_list[index] = _mutate(value[index], rng, depth + 1)
        return changed_list
    replacement = rng.choice(_VALUES)
    if rng.random() < 0.1:
        for _ in range(rng.randrange(30, 70)):
            replacement = [replacement]
    return replacement


def test_random_mutations_of_a_valid_body_raise_only_api_errors():
    rng = random.Random(27)
    base = {
        "model": "surrogate",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
        ],
        "n": 2,
        "seed": 3,
        "temperature": 0.5,
        "max_tokens": 10,
        "stop": ["\n"],
        "stream": True,
        "stream_options": {"include_usage": True},
        "metadata": {"run": "x"},
        "user": "someone",
        "top_p": 1,
        "tools": [],
    }
    outcomes: dict[int, int] = {}
    for _ in range(3000):
        body = _mutate(base, rng)
        for _ in range(rng.randrange(3)):
            body = _mutate(body, rng)
        raw = json.dumps(body).encode()
        try:
            chat = protocol.parse_chat_request(
                protocol.read_body(
                    raw, content_encoding=None, charset=None, max_bytes=MAX_BODY_BYTES
                ),
                _SERVED,
            )
        except protocol.ApiError as exc:
            assert exc.status in (400, 404), exc.message
            missing = "must provide" in exc.message or "Missing required" in exc.message
            if exc.param is not None and not missing:  # a parameter the client sent
                assert exc.param.split(".")[0].split("[")[0] in json.loads(raw), exc.param
            outcomes[exc.status] = outcomes.get(exc.status, 0) + 1
            continue
        assert 1 <= chat.n <= protocol.MAX_CHOICES
        assert chat.temperature is None or 0 <= chat.temperature <= 2
        assert chat.max_tokens is None or chat.max_tokens >= 1
        assert all(isinstance(text, str) for text in chat.contents)
        outcomes[200] = outcomes.get(200, 0) + 1
    assert outcomes.get(400, 0) > 1000 and outcomes.get(200, 0) > 30, outcomes


def test_read_body_bounds_what_it_decodes():
    assert protocol.read_body(
        b'{"a": [1, 2.5]}', content_encoding=None, charset=None, max_bytes=99
    ) == {"a": [1, 2.5]}
    with pytest.raises(protocol.ApiError) as raised:
        protocol.read_body(_gzip(b"[]" * 100), content_encoding="gzip", charset=None, max_bytes=50)
    assert raised.value.status == 413
    huge = protocol.read_body(
        b"[" + b"9" * 5000 + b"]", content_encoding=None, charset=None, max_bytes=10**6
    )
    assert huge == [float("inf")]
    # brackets inside strings are text, not nesting
    text = json.dumps({"messages": "[" * 1000})
    assert protocol.read_body(text.encode(), content_encoding=None, charset=None, max_bytes=10**6)
