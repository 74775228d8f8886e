"""The surrogate over the OpenAI HTTP API, so any OpenAI client can use it (aiohttp).

Endpoints:

- ``POST /v1/chat/completions``: ``messages`` (string content, or OpenAI's list of text parts),
  ``n``, ``seed``, ``temperature``, ``max_tokens`` (or ``max_completion_tokens``), ``stop``,
  ``stream`` (server-sent events, with ``stream_options.include_usage``); answers with
  ``choices``, ``finish_reason`` and ``usage``. Other OpenAI fields (``top_p``, penalties...) are
  accepted and ignored. Any ``model`` name is accepted; replies carry the served name.
- ``GET /v1/models`` and ``GET /v1/models/{id}``.
- ``GET /health``; ``GET /metrics`` (Prometheus: requests, latency, tokens).

Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: 400 for bad
requests (naming the field), 404 for unknown paths and models, 503 when the sandbox cannot run
code. ``latency_ms`` delays every completion (simulated model latency).

:class:`SurrogateServer` is an async context manager (port 0 picks a free port); ``aflowrl
surrogate serve`` runs one until SIGINT/SIGTERM (:func:`serve_until_signal`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
import uuid
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from aflowrl.common.metrics import ComponentMetrics, metrics_handler, new_registry, start_http
from aflowrl.errors import InvalidInputError
from aflowrl.executor.surrogate.executor import Completion, SurrogateExecutor
from aflowrl.sandbox import SandboxUnavailableError

logger = logging.getLogger(__name__)

_ROLES = frozenset({"system", "user", "assistant", "developer", "tool"})
_STREAM_PIECE_CHARS = 96


class _Metrics:
    """The server's Prometheus metrics (component ``executor``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        metrics = ComponentMetrics("executor", registry)
        self.requests = metrics.counter(
            "surrogate_requests_total", "Chat completion requests, by outcome", ["status"]
        )
        self.latency = metrics.histogram(
            "surrogate_request_duration_seconds", "Time to answer a chat completion request"
        )
        self.tokens = metrics.counter(
            "surrogate_tokens_total", "Approximate tokens processed, by kind", ["kind"]
        )


class _BadRequest(Exception):
    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def _error(status: int, message: str, *, kind: str, param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return web.json_response(body, status=status)


def _optional_number(body: dict[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _BadRequest(f"{name} must be a number", name)
    if kind is int and not float(value).is_integer():
        raise _BadRequest(f"{name} must be an integer", name)
    return kind(value)


def _contents(messages: object) -> list[str]:
    """The text of each message (OpenAI string content or a list of text parts)."""
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("messages must be a non-empty list", "messages")
    texts: list[str] = []
    for position, message in enumerate(messages):
        where = f"messages[{position}]"
        if not isinstance(message, dict):
            raise _BadRequest(f"{where} must be an object", where)
        if message.get("role") not in _ROLES:
            raise _BadRequest(f"{where}.role must be one of {sorted(_ROLES)}", f"{where}.role")
        content = message.get("content")
        if content is None:
            content = ""
        if isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, dict) and part.get("type") == "text":
                    parts.append(str(part.get("text", "")))
                else:
                    raise _BadRequest(f"{where}.content: only text parts are supported", where)
            content = "\n".join(parts)
        if not isinstance(content, str):
            raise _BadRequest(f"{where}.content must be a string or text parts", where)
        texts.append(content)
    return texts


def _stops(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    values = [stop] if isinstance(stop, str) else stop
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        raise _BadRequest("stop must be a string or a list of strings", "stop")
    return values[:4]


def _apply_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    cut = min((text.find(s) for s in stops if s in text), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


class SurrogateServer:
    """``async with SurrogateServer(executor, port=0) as server``: ``server.base_url``."""

    def __init__(
        self,
        executor: SurrogateExecutor,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model: str | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.executor = executor
        self.host = host
        self.port = port
        self.model = model or executor.model
        self.registry = registry if registry is not None else new_registry()
        self.metrics = _Metrics(self.registry)
        self.created = int(time.time())
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``http://host:port/v1``)."""
        return f"http://{self.host}:{self.port}/v1"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model}", self._model)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", metrics_handler(self.registry))
        return app

    async def __aenter__(self) -> SurrogateServer:
        self._runner, self.port = await start_http(self.app(), self.host, self.port, backlog=1024)
        logger.info("surrogate executor serving on %s (model %r)", self.base_url, self.model)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- handlers ---------------------------------------------------------------------------

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.model,
            "object": "model",
            "created": self.created,
            "owned_by": "aflow-rl",
            "imitates": self.executor.calibration.name,
            "calibration": self.executor.calibration.fingerprint,
        }

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_card()]})

    async def _model(self, request: web.Request) -> web.Response:
        if request.match_info["model"] != self.model:
            return _error(404, f"no model {request.match_info['model']!r}", kind="not_found_error")
        return web.json_response(self._model_card())

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise _BadRequest("the body is not JSON", None) from None
            if not isinstance(body, dict):
                raise _BadRequest("the body must be a JSON object", None)
            contents = _contents(body.get("messages"))
            n = _optional_number(body, "n", int)
            max_tokens = _optional_number(body, "max_completion_tokens", int)
            if max_tokens is None:
                max_tokens = _optional_number(body, "max_tokens", int)
            completion = await self.executor.complete(
                contents,
                n=1 if n is None else n,
                temperature=_optional_number(body, "temperature", float),
                max_tokens=max_tokens,
                seed=_optional_number(body, "seed", int),
            )
            stops = _stops(body)
            stream = bool(body.get("stream", False))
        except _BadRequest as exc:
            self.metrics.requests.labels("bad_request").inc()
            return _error(400, str(exc), kind="invalid_request_error", param=exc.param)
        except InvalidInputError as exc:
            self.metrics.requests.labels("bad_request").inc()
            return _error(400, str(exc), kind="invalid_request_error", param=exc.field)
        except SandboxUnavailableError as exc:
            self.metrics.requests.labels("unavailable").inc()
            return _error(503, f"the code sandbox is unavailable: {exc}", kind="server_error")
        texts, reasons = [], []
        for full, reason in zip(completion.texts, completion.finish_reasons, strict=True):
            text, stopped = _apply_stop(full, stops)
            texts.append(text)
            reasons.append("stop" if stopped else reason)
        self.metrics.requests.labels("ok").inc()
        self.metrics.tokens.labels("prompt").inc(completion.usage.prompt_tokens)
        self.metrics.tokens.labels("completion").inc(completion.usage.completion_tokens)
        self.metrics.latency.observe(time.perf_counter() - started)
        identity = f"chatcmpl-{uuid.uuid4().hex}"
        if stream:
            options = body.get("stream_options")
            usage = isinstance(options, dict) and bool(options.get("include_usage"))
            return await self._stream(
                request, identity, list(zip(texts, reasons, strict=True)), completion, usage
            )
        return web.json_response(self._completion_body(identity, texts, reasons, completion))

    def _usage(self, completion: Completion) -> dict[str, int]:
        usage = completion.usage
        return {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        }

    def _completion_body(
        self, identity: str, texts: list[str], reasons: list[str], completion: Completion
    ) -> dict[str, Any]:
        return {
            "id": identity,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "system_fingerprint": f"surrogate-{self.executor.calibration.fingerprint}",
            "choices": [
                {
                    "index": index,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": reason,
                }
                for index, (text, reason) in enumerate(zip(texts, reasons, strict=True))
            ],
            "usage": self._usage(completion),
        }

    async def _stream(
        self,
        request: web.Request,
        identity: str,
        choices: list[tuple[str, str]],
        completion: Completion,
        include_usage: bool,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        created = int(time.time())

        def chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
            body: dict[str, Any] = {
                "id": identity,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model,
                "choices": choices,
            }
            if include_usage:
                body["usage"] = usage
            return f"data: {json.dumps(body)}\n\n".encode()

        async for data in _events(choices, chunk):
            await response.write(data)
        if include_usage:
            await response.write(chunk([], self._usage(completion)))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def _events(choices: list[tuple[str, str]], chunk: Any) -> AsyncIterator[bytes]:
    """Chunks of each choice: its role, its text in pieces, its finish reason."""
    for index, (text, reason) in enumerate(choices):
        yield chunk([{"index": index, "delta": {"role": "assistant", "content": ""}}])
        for start in range(0, len(text), _STREAM_PIECE_CHARS):
            piece = text[start : start + _STREAM_PIECE_CHARS]
            yield chunk([{"index": index, "delta": {"content": piece}, "finish_reason": None}])
        yield chunk([{"index": index, "delta": {}, "finish_reason": reason}])


async def serve_until_signal(server: SurrogateServer) -> None:
    """Serve until SIGINT or SIGTERM, then stop cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with server:
            print(json.dumps({"base_url": server.base_url, "port": server.port}), flush=True)
            await stop.wait()
            logger.info("surrogate executor: stopping")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
