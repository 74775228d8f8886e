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

A null value counts as the parameter left out, as in OpenAI's API. Used by
:mod:`aflowrl.executor.surrogate.server`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

MAX_STOPS: Final = 4
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
        raise ApiError(400, "model must be a string", param="model")
    if model not in served:
        raise model_not_found(model)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ApiError(400, "stream must be a boolean", param="stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise ApiError(
                400,
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                param="stream_options",
            )
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise ApiError(
                400, "stream_options supports only include_usage", param="stream_options"
            )
        usage = options.get("include_usage", False)
        if not isinstance(usage, bool):
            raise ApiError(
                400, "include_usage must be a boolean", param="stream_options.include_usage"
            )
        include_usage = usage
    max_tokens = _optional(body, "max_completion_tokens", int)
    if max_tokens is None:
        max_tokens = _optional(body, "max_tokens", int)
    n = _optional(body, "n", int)
    return ChatRequest(
        model=model,
        contents=_contents(body.get("messages")),
        n=1 if n is None else n,
        temperature=_optional(body, "temperature", float),
        max_tokens=max_tokens,
        seed=_optional(body, "seed", int),
        stops=_stops(body.get("stop")),
        stream=bool(stream),
        include_usage=include_usage,
    )


def _check_parameter(name: str, value: object) -> None:
    known = name in IMPLEMENTED or name in INFORMATIONAL or name in _NEUTRAL or name in UNSUPPORTED
    if not known:
        raise ApiError(400, f"Unrecognized request argument supplied: {name}", param=name)
    if value is None or name in IMPLEMENTED or name in INFORMATIONAL:
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


def _optional(body: dict[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if not _number(value) or not math.isfinite(float(value)):
        raise ApiError(400, f"{name} must be a number", param=name)
    if kind is int and not float(value).is_integer():
        raise ApiError(400, f"{name} must be an integer", param=name)
    return kind(value)


def _contents(messages: object) -> tuple[str, ...]:
    """The text of each message (OpenAI string content or a list of text parts)."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    texts: list[str] = []
    for position, message in enumerate(messages):
        where = f"messages[{position}]"
        if not isinstance(message, dict):
            raise ApiError(400, f"{where} must be an object", param=where)
        role = message.get("role")
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
        raise ApiError(
            400, f"{where}.content must be a string or text parts", param=f"{where}.content"
        )
    parts = []
    for index, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ApiError(
                400,
                f"{where}.content[{index}]: only text parts are supported, not {kind!r}",
                param=f"{where}.content[{index}]",
                code="unsupported_value",
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise ApiError(
                400, "a text part needs a string 'text'", param=f"{where}.content[{index}].text"
            )
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
