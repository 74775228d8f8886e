"""The OpenAI chat-completions request as the surrogate server reads it, and OpenAI's errors.

:func:`parse_chat_request` turns a request body into a :class:`ChatRequest` or raises
:class:`ApiError` with OpenAI's status, ``type``, ``param`` and ``code``. Every parameter of
OpenAI's chat-completions API is in exactly one of these groups, so nothing a client sends is
silently ignored:

* implemented: ``model`` (must be a served name, else 404 ``model_not_found``), ``messages``
  (string content or text parts; roles system, developer, user, assistant), ``n``, ``seed``,
  ``temperature``, ``max_tokens`` / ``max_completion_tokens``, ``stop`` (up to 4),
  ``stream``, ``stream_options`` (``include_usage``; only with ``stream``);
* accepted because they change no output: ``user``, ``metadata``, ``safety_identifier``,
  ``prompt_cache_key``;
* accepted only at the value that changes nothing (anything else is a 400 naming the
  parameter, code ``unsupported_value``): ``top_p`` 1, ``frequency_penalty`` and
  ``presence_penalty`` 0, ``logprobs`` false, ``logit_bias`` {}, ``response_format``
  ``{"type": "text"}``, ``tools`` [], ``tool_choice`` and ``function_call`` "none",
  ``functions`` [], ``parallel_tool_calls`` (meaningless without tools), ``modalities``
  ["text"], ``store`` false, ``service_tier`` "auto" or "default";
* not supported (400, code ``unsupported_parameter``): ``top_logprobs``, ``audio``,
  ``prediction``, ``web_search_options``, ``reasoning_effort``, ``verbosity``: the surrogate
  writes whole replies, so it has no token log-probabilities, tools, audio or reasoning tokens;
* anything else: 400 "Unrecognized request argument supplied", as OpenAI answers.

A null value counts as the parameter left out, as in OpenAI's API. Every value is checked for
its JSON type and range before it is used (``n`` 1..128, ``temperature`` 0..2, token limits
from 1, ``seed`` a 64-bit integer, strings where OpenAI takes strings), and errors name the
parameter as the client sent it (``max_completion_tokens``, ``messages[2].content[0].text``).

:func:`read_body` is the bounded reading of the raw body that comes first: content encodings
(identity, gzip, deflate; decompressed to at most the server's body limit, a truncated stream
refused), the charset, then JSON with numbers and nesting bounded (integers of more than
:data:`MAX_INT_DIGITS` digits and floats beyond float range read as infinities, which every
numeric parameter refuses by name; ``NaN`` and ``Infinity`` are not JSON; more than
:data:`MAX_DEPTH` levels of arrays and objects are refused, naming the parameter that holds
them). Used by :mod:`aflowrl.executor.surrogate.server`.
"""

from __future__ import annotations

import codecs
import itertools
import json
import math
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, NoReturn

MAX_STOPS: Final = 4
MAX_CHOICES: Final = 128
"""The most completions one request may ask for (``n``; OpenAI's bound)."""
MAX_TOKENS: Final = 1 << 31
"""The largest ``max_tokens`` / ``max_completion_tokens`` read."""
SEED_RANGE: Final = (-(1 << 63), (1 << 63) - 1)
"""``seed`` is a 64-bit signed integer, as in OpenAI's API."""
MAX_DEPTH: Final = 32
"""The deepest nesting of arrays and objects a body may have (a chat request needs 5)."""
MAX_INT_DIGITS: Final = 300
"""Integers with more digits are read as infinities (every bounded parameter refuses them)."""
ROLES: Final = frozenset({"system", "developer", "user", "assistant"})


class ApiError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {message, type, param, code}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind

    def body(self) -> dict[str, Any]:
        return error_body(self.message, kind=self.kind, param=self.param, code=self.code)


def error_body(
    message: str, *, kind: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def model_not_found(name: str) -> ApiError:
    return ApiError(
        404,
        f"The model `{name}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


@dataclass(frozen=True)
class ChatRequest:
    """What the surrogate does with a chat-completions request."""

    model: str
    contents: tuple[str, ...]
    n: int
    temperature: float | None
    max_tokens: int | None
    seed: int | None
    stops: tuple[str, ...]
    stream: bool
    include_usage: bool


IMPLEMENTED: Final = frozenset(
    {
        "model",
        "messages",
        "n",
        "seed",
        "temperature",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "stream",
        "stream_options",
    }
)
INFORMATIONAL: Final = frozenset({"user", "metadata", "safety_identifier", "prompt_cache_key"})
"""Accepted: they label or route a request and change no output."""

_NEUTRAL: Final[dict[str, tuple[Callable[[Any], bool], str]]] = {
    "top_p": (lambda v: _number(v) and v == 1, "1"),
    "frequency_penalty": (lambda v: _number(v) and v == 0, "0"),
    "presence_penalty": (lambda v: _number(v) and v == 0, "0"),
    "logprobs": (lambda v: v is False, "false"),
    "logit_bias": (lambda v: v == {}, "{}"),
    "response_format": (lambda v: v == {"type": "text"}, '{"type": "text"}'),
    "tools": (lambda v: v == [], "[]"),
    "functions": (lambda v: v == [], "[]"),
    "tool_choice": (lambda v: v == "none", '"none"'),
    "function_call": (lambda v: v == "none", '"none"'),
    "parallel_tool_calls": (lambda v: isinstance(v, bool), "true or false"),
    "modalities": (lambda v: v == ["text"], '["text"]'),
    "store": (lambda v: v is False, "false"),
    "service_tier": (lambda v: v in ("auto", "default"), '"auto" or "default"'),
}
"""Accepted only at the value that changes nothing (the value, as the error names it)."""

UNSUPPORTED: Final = frozenset(
    {"top_logprobs", "audio", "prediction", "web_search_options", "reasoning_effort", "verbosity"}
)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _type_name(value: object) -> str:
    """The JSON type of a parsed value, as OpenAI's errors name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _invalid_type(param: str, expected: str, value: object) -> ApiError:
    return ApiError(
        400,
        f"Invalid type for '{param}': expected {expected}, but got {_type_name(value)} instead.",
        param=param,
        code="invalid_type",
    )


# -- the raw body ----------------------------------------------------------------------------------

_DECODERS: Final = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": 0}
_STRING: Final = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_A_BRACKET: Final = re.compile(r"[^\[\]{}]+")
_OPENS: Final = frozenset("[{")
_TOKEN: Final = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


def read_body(
    raw: bytes, *, content_encoding: str | None, charset: str | None, max_bytes: int
) -> object:
    """The JSON value of a request body, read within bounds; :class:`ApiError` (400) for
    anything unreadable, saying what. ``max_bytes`` bounds the decompressed size."""
    data = _decompress(raw, content_encoding or "", max_bytes)
    try:
        text = data.decode(_codec(charset))
    except UnicodeDecodeError as exc:
        raise ApiError(
            400, f"The request body is not valid {charset or 'utf-8'} text ({exc.reason})."
        ) from None
    _check_depth(text)
    try:
        return json.loads(text, parse_int=_bounded_int, parse_float=float, parse_constant=_not_json)
    except (json.JSONDecodeError, _NotJson):
        raise ApiError(400, "The request body is not valid JSON.") from None
    except (RecursionError, MemoryError):  # _check_depth makes these unreachable
        raise ApiError(400, "The request body is too large or too deeply nested.") from None


def _codec(charset: str | None) -> str:
    if charset is None:
        return "utf-8"
    try:
        info = codecs.lookup(charset)
    except LookupError:
        info = None
    if info is None or not getattr(info, "_is_text_encoding", True):
        raise ApiError(400, f"The request body's charset {charset[:40]!r} is not supported.")
    return info.name


def _decompress(raw: bytes, content_encoding: str, max_bytes: int) -> bytes:
    """Undo ``Content-Encoding`` (applied in the order listed, so undone last first)."""
    codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
    data = raw
    for coding in reversed(codings):
        if coding == "identity":
            continue
        if coding not in _DECODERS:
            raise ApiError(
                400,
                f"The request body's Content-Encoding {coding[:40]!r} is not supported "
                "(identity, gzip and deflate are).",
            )
        data = _inflate(data, coding, max_bytes)
    return data


def _inflate(data: bytes, coding: str, max_bytes: int) -> bytes:
    wbits = _DECODERS[coding]
    attempts = (wbits,) if wbits else (zlib.MAX_WBITS, -zlib.MAX_WBITS)  # deflate: zlib or raw
    for bits in attempts:
        inflater = zlib.decompressobj(bits)
        try:
            out = inflater.decompress(data, max_bytes + 1)
        except zlib.error:
            continue
        if len(out) > max_bytes:
            raise ApiError(413, f"The decompressed request body is larger than {max_bytes} bytes.")
        if not inflater.eof:
            raise ApiError(400, f"The request body's {coding} stream is truncated.")
        if inflater.unused_data:
            raise ApiError(400, f"The request body has data after its {coding} stream.")
        return out
    raise ApiError(400, f"The request body is not a valid {coding} stream.")


def _check_depth(text: str) -> None:
    """Refuse a body nesting arrays and objects more than :data:`MAX_DEPTH` deep, before the
    parser recurses into it (a C-speed scan: strings removed, then the brackets counted)."""
    brackets = _NOT_A_BRACKET.sub("", _STRING.sub("", text))
    if not brackets:
        return
    steps = (1 if c in _OPENS else -1 for c in brackets)
    if max(itertools.accumulate(steps)) <= MAX_DEPTH:
        return
    raise ApiError(
        400,
        f"The request body nests arrays and objects more than {MAX_DEPTH} levels deep.",
        param=_deep_parameter(text),
        code="invalid_value",
    )


def _deep_parameter(text: str, budget: int = 100_000) -> str | None:
    """The top-level member that holds the too-deep value (None: not found cheaply)."""
    depth, last_key = 0, None
    for position, match in enumerate(_TOKEN.finditer(text)):
        if position >= budget:
            return None
        token = match.group()
        if token.startswith('"'):
            if depth == 1:
                last_key = token
            continue
        depth += 1 if token in _OPENS else -1
        if depth > MAX_DEPTH:
            if last_key is None:
                return None
            try:
                key = json.loads(last_key)
            except ValueError:
                return None
            return key if isinstance(key, str) else None
    return None


class _NotJson(ValueError):
    pass


def _not_json(constant: str) -> NoReturn:
    raise _NotJson(constant)


def _bounded_int(digits: str) -> int | float:
    """A JSON integer; one too long for Python (or for any parameter) as a signed infinity."""
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        return -math.inf if digits.startswith("-") else math.inf
    return int(digits)


# -- the request -----------------------------------------------------------------------------------


def parse_chat_request(body: object, served: tuple[str, ...]) -> ChatRequest:
    """Validate a chat-completions body against what the surrogate serves."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    for name, value in body.items():
        _check_parameter(str(name), value)
    model = body.get("model")
    if model is None:
        raise ApiError(400, "you must provide a model parameter", param="model")
    if not isinstance(model, str):
        raise _invalid_type("model", "a string", model)
    if model not in served:
        raise model_not_found(model)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _invalid_type("stream", "a boolean", stream)
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise ApiError(
                400,
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                param="stream_options",
            )
        if not isinstance(options, dict):
            raise _invalid_type("stream_options", "an object", options)
        if set(options) - {"include_usage"}:
            raise ApiError(
                400, "stream_options supports only include_usage", param="stream_options"
            )
        usage = options.get("include_usage", False)
        if not isinstance(usage, bool):
            raise _invalid_type("stream_options.include_usage", "a boolean", usage)
        include_usage = usage
    completion_tokens = _integer(body, "max_completion_tokens", 1, MAX_TOKENS)
    max_tokens = _integer(body, "max_tokens", 1, MAX_TOKENS)
    n = _integer(body, "n", 1, MAX_CHOICES)
    return ChatRequest(
        model=model,
        contents=_contents(body.get("messages")),
        n=1 if n is None else n,
        temperature=_temperature(body),
        max_tokens=completion_tokens if completion_tokens is not None else max_tokens,
        seed=_integer(body, "seed", *SEED_RANGE),
        stops=_stops(body.get("stop")),
        stream=bool(stream),
        include_usage=include_usage,
    )


def _check_parameter(name: str, value: object) -> None:
    known = name in IMPLEMENTED or name in INFORMATIONAL or name in _NEUTRAL or name in UNSUPPORTED
    if not known:
        raise ApiError(400, f"Unrecognized request argument supplied: {name}", param=name)
    if value is None or name in IMPLEMENTED:
        return
    if name in INFORMATIONAL:
        _check_informational(name, value)
        return
    if name in UNSUPPORTED:
        raise ApiError(
            400,
            f"Unsupported parameter: '{name}' is not supported by the surrogate executor "
            "(it writes whole replies: no token log-probabilities, tools, audio or reasoning "
            "tokens).",
            param=name,
            code="unsupported_parameter",
        )
    accepts, neutral = _NEUTRAL[name]
    if not accepts(value):
        raise ApiError(
            400,
            f"Unsupported value: '{name}' is not implemented by the surrogate executor; it "
            f"accepts only {neutral} (or null), which changes nothing.",
            param=name,
            code="unsupported_value",
        )


def _check_informational(name: str, value: object) -> None:
    """``user``, ``safety_identifier``, ``prompt_cache_key``: strings; ``metadata``: an
    object of strings (OpenAI's types; their values change nothing here)."""
    if name != "metadata":
        if not isinstance(value, str):
            raise _invalid_type(name, "a string", value)
        return
    if not isinstance(value, dict):
        raise _invalid_type(name, "an object", value)
    for key, item in value.items():
        if not isinstance(item, str):
            raise _invalid_type(f"metadata.{key}", "a string", item)


def _integer(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    sent = body.get(name)
    if sent is None:
        return None
    value = sent
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 5.0 is 5 (an infinity is no integer: refused below)
    if not isinstance(value, int) or isinstance(value, bool):
        if isinstance(value, float) and math.isinf(value):
            raise _out_of_range(name, low, high, sent)
        raise _invalid_type(name, "an integer", sent)
    if not low <= value <= high:
        raise _out_of_range(name, low, high, sent)
    return value


def _temperature(body: dict[str, Any]) -> float | None:
    value = body.get("temperature")
    if value is None:
        return None
    if not _number(value):
        raise _invalid_type("temperature", "a number", value)
    number = float(value) if not isinstance(value, int) or abs(value) < 1 << 64 else math.inf
    if not 0.0 <= number <= 2.0:  # nan and the infinities too
        raise _out_of_range("temperature", 0, 2, value)
    return number


def _out_of_range(name: str, low: int, high: int, value: object) -> ApiError:
    if isinstance(value, float) and math.isinf(value):
        shown = "a number beyond every bound"
    elif isinstance(value, int) and abs(value) >= 10**30:
        shown = "an integer of more than 30 digits"
    else:
        shown = str(value)
    return ApiError(
        400,
        f"Invalid '{name}': expected a value between {low} and {high}, but got {shown} instead.",
        param=name,
        code="invalid_value",
    )


def _contents(messages: object) -> tuple[str, ...]:
    """The text of each message (OpenAI string content or a list of text parts)."""
    if messages is None:
        raise ApiError(400, "Missing required parameter: 'messages'.", param="messages")
    if not isinstance(messages, list):
        raise _invalid_type("messages", "an array", messages)
    if not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    texts: list[str] = []
    for position, message in enumerate(messages):
        where = f"messages[{position}]"
        if not isinstance(message, dict):
            raise _invalid_type(where, "an object", message)
        role = message.get("role")
        if not isinstance(role, str):
            raise _invalid_type(f"{where}.role", "a string", role)
        if role in ("tool", "function"):
            raise ApiError(
                400,
                f"{where}.role: {role!r} messages answer tool calls, which the surrogate "
                "executor does not make",
                param=f"{where}.role",
                code="unsupported_value",
            )
        if role not in ROLES:
            raise ApiError(
                400, f"{where}.role must be one of {sorted(ROLES)}", param=f"{where}.role"
            )
        for key, value in message.items():
            if key not in ("role", "content", "name") and value not in (None, []):
                raise ApiError(
                    400,
                    f"{where}.{key} is not supported by the surrogate executor",
                    param=f"{where}.{key}",
                    code="unsupported_parameter",
                )
        name = message.get("name")
        if name is not None and not isinstance(name, str):
            raise _invalid_type(f"{where}.name", "a string", name)
        texts.append(_content(message.get("content"), role, where))
    return tuple(texts)


def _content(content: object, role: object, where: str) -> str:
    if content is None:
        if role == "assistant":
            return ""
        raise ApiError(400, f"{where}.content is required", param=f"{where}.content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _invalid_type(f"{where}.content", "a string or an array of text parts", content)
    parts = []
    for index, part in enumerate(content):
        at = f"{where}.content[{index}]"
        if not isinstance(part, dict):
            raise _invalid_type(at, "an object", part)
        kind = part.get("type")
        if kind != "text":
            shown = kind if isinstance(kind, str) else _type_name(kind)
            raise ApiError(
                400,
                f"{at}: only text parts are supported, not {shown!r}",
                param=at,
                code="unsupported_value",
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise _invalid_type(f"{at}.text", "a string", text)
        parts.append(text)
    return "\n".join(parts)


def _stops(stop: object) -> tuple[str, ...]:
    if stop is None:
        return ()
    values = [stop] if isinstance(stop, str) else stop
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        raise ApiError(400, "stop must be a string or a list of strings", param="stop")
    if len(values) > MAX_STOPS:
        raise ApiError(400, f"stop takes at most {MAX_STOPS} sequences", param="stop")
    return tuple(values)
