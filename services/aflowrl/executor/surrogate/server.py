"""The surrogate over the OpenAI HTTP API, so any OpenAI client can use it (aiohttp).

Endpoints:

- ``POST /v1/chat/completions``: the request is read by :mod:`.protocol`, which implements
  ``model``, ``messages``, ``n``, ``seed``, ``temperature``, ``max_tokens`` (or
  ``max_completion_tokens``), ``stop`` and ``stream`` (server-sent events, with
  ``stream_options.include_usage``), and answers 400 for every parameter it does not implement
  (``logprobs``, ``tools``, ``response_format`` other than text...) rather than ignoring it;
  replies carry ``choices``, ``finish_reason`` and ``usage``.
- ``GET /v1/models`` and ``GET /v1/models/{id}``: the served names (``--model``, which may be
  given several times, e.g. ``surrogate`` and ``gpt-4o-mini``).
- ``GET /health``; ``GET /metrics`` (Prometheus: requests, latency, tokens).

Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: 400 for bad or
unsupported requests (naming the parameter as the client sent it), 404 ``model_not_found`` for a
model it does not serve, 404 "Invalid URL (METHOD /path)" for an unknown route and 405 for a
known route with the wrong method, 413 for a body over 64 MiB (decompressed), 503 when the
sandbox cannot run code. The body is read by :func:`.protocol.read_body` (content encodings
undone here, within the size bound, not by aiohttp; nesting and numbers bounded), so no request
body reaches an unbounded parser; an unexpected exception is still answered in OpenAI's shape
(500 ``server_error``), never as aiohttp's plain-text page. A client that hangs up, even in the
middle of a streamed answer, is normal: one debug line, no error. ``latency_ms`` delays every
completion (simulated model latency).

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
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any

from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError
from prometheus_client import CollectorRegistry

from aflowrl.common.metrics import ComponentMetrics, metrics_handler, new_registry, start_http
from aflowrl.errors import InvalidInputError
from aflowrl.executor.surrogate.executor import Completion, SurrogateExecutor
from aflowrl.executor.surrogate.protocol import (
    ApiError,
    ChatRequest,
    error_body,
    model_not_found,
    parse_chat_request,
    read_body,
)
from aflowrl.sandbox import SandboxUnavailableError

logger = logging.getLogger(__name__)

_STREAM_PIECE_CHARS = 96
MAX_BODY_BYTES = 64 * 1024 * 1024
"""The largest request body, as sent and decompressed."""
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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


def _error(error: ApiError) -> web.Response:
    return web.json_response(error.body(), status=error.status)


@web.middleware
async def _openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own errors (no route, wrong method, body too large) in OpenAI's shape, and
    anything unexpected as a 500 in the same shape (logged once, as the bug it is)."""
    try:
        return await handler(request)
    except ApiError as exc:
        return _error(exc)
    except (RequestPayloadError, HttpProcessingError) as exc:  # a body that broke off
        message = f"The request body could not be read ({type(exc).__name__})."
        return web.json_response(error_body(message, kind="invalid_request_error"), status=400)
    except web.HTTPException as exc:
        if exc.status == 404:
            message = f"Invalid URL ({request.method} {request.path})"
        elif exc.status == 405:
            message = f"Method not allowed ({request.method} {request.path})"
        else:
            message = exc.reason
        kind = "invalid_request_error" if exc.status < 500 else "server_error"
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return web.json_response(error_body(message, kind=kind), status=exc.status, headers=headers)
    except asyncio.CancelledError:
        raise
    except ConnectionResetError:  # the client hung up mid-answer: normal, nothing to answer
        logger.debug("surrogate server: the client hung up on %s %s", request.method, request.path)
        return web.Response(status=499, reason="Client Closed Request")  # nginx's; nobody reads it
    except Exception:
        logger.exception(
            "surrogate server: unexpected error on %s %s", request.method, request.path
        )
        message = "The server had an error while processing your request."
        return web.json_response(error_body(message, kind="server_error"), status=500)


def _apply_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    cut = min((text.find(s) for s in stops if s in text), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


class SurrogateServer:
    """``async with SurrogateServer(executor, port=0) as server``: ``server.base_url``.

    ``models``: the names it serves (default: the executor's); requests for any other model
    get 404 ``model_not_found``, as from OpenAI."""

    def __init__(
        self,
        executor: SurrogateExecutor,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        models: Sequence[str] = (),
        registry: CollectorRegistry | None = None,
    ) -> None:
        names = tuple(dict.fromkeys(m.strip() for m in models if m.strip()))
        if len(names) != len(models):
            raise InvalidInputError("model names must be non-empty and distinct", field="model")
        self.executor = executor
        self.host = host
        self.port = port
        self.models = names or (executor.model,)
        self.registry = registry if registry is not None else new_registry()
        self.metrics = _Metrics(self.registry)
        self.created = int(time.time())
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``http://host:port/v1``)."""
        return f"http://{self.host}:{self.port}/v1"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_openai_errors])
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model}", self._model)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", metrics_handler(self.registry))
        return app

    async def __aenter__(self) -> SurrogateServer:
        self._runner, self.port = await start_http(
            self.app(), self.host, self.port, backlog=1024, auto_decompress=False
        )
        logger.info("surrogate executor serving on %s (models %s)", self.base_url, self.models)
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

    def _model_card(self, name: str) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": self.created,
            "owned_by": "aflow-rl",
            "imitates": self.executor.calibration.name,
            "calibration": self.executor.calibration.fingerprint,
        }

    async def _models(self, _request: web.Request) -> web.Response:
        cards = [self._model_card(name) for name in self.models]
        return web.json_response({"object": "list", "data": cards})

    async def _model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name not in self.models:
            return _error(model_not_found(name))
        return web.json_response(self._model_card(name))

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            body = read_body(
                await request.read(),
                content_encoding=request.headers.get(hdrs.CONTENT_ENCODING),
                charset=request.charset,
                max_bytes=MAX_BODY_BYTES,
            )
            chat = parse_chat_request(body, self.models)
            completion = await self.executor.complete(
                chat.contents,
                n=chat.n,
                temperature=chat.temperature,
                max_tokens=chat.max_tokens,
                seed=chat.seed,
            )
        except ApiError as exc:
            outcome = {400: "bad_request", 404: "not_found", 413: "too_large"}.get(exc.status)
            self.metrics.requests.labels(outcome or "bad_request").inc()
            return _error(exc)
        except InvalidInputError as exc:
            self.metrics.requests.labels("bad_request").inc()
            return _error(ApiError(400, str(exc), param=exc.field))
        except SandboxUnavailableError as exc:
            self.metrics.requests.labels("unavailable").inc()
            return _error(
                ApiError(503, f"the code sandbox is unavailable: {exc}", kind="server_error")
            )
        texts, reasons = [], []
        for full, reason in zip(completion.texts, completion.finish_reasons, strict=True):
            text, stopped = _apply_stop(full, chat.stops)
            texts.append(text)
            reasons.append("stop" if stopped else reason)
        self.metrics.requests.labels("ok").inc()
        self.metrics.tokens.labels("prompt").inc(completion.usage.prompt_tokens)
        self.metrics.tokens.labels("completion").inc(completion.usage.completion_tokens)
        self.metrics.latency.observe(time.perf_counter() - started)
        identity = f"chatcmpl-{uuid.uuid4().hex}"
        if chat.stream:
            choices = list(zip(texts, reasons, strict=True))
            return await self._stream(request, identity, chat, choices, completion)
        return web.json_response(
            self._completion_body(identity, chat.model, texts, reasons, completion)
        )

    def _usage(self, completion: Completion) -> dict[str, int]:
        usage = completion.usage
        return {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        }

    def _completion_body(
        self,
        identity: str,
        model: str,
        texts: list[str],
        reasons: list[str],
        completion: Completion,
    ) -> dict[str, Any]:
        return {
            "id": identity,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
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
        chat: ChatRequest,
        choices: list[tuple[str, str]],
        completion: Completion,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        try:
            await self._write_stream(request, response, identity, chat, (choices, completion))
        except ConnectionResetError:  # aiohttp's ClientConnectionResetError: a normal hang-up
            logger.debug("surrogate server: the client hung up on the stream of %s", identity)
        return response

    async def _write_stream(
        self,
        request: web.Request,
        response: web.StreamResponse,
        identity: str,
        chat: ChatRequest,
        answer: tuple[list[tuple[str, str]], Completion],
    ) -> None:
        choices, completion = answer
        await response.prepare(request)
        created = int(time.time())

        def chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
            body: dict[str, Any] = {
                "id": identity,
                "object": "chat.completion.chunk",
                "created": created,
                "model": chat.model,
                "choices": choices,
            }
            if chat.include_usage:
                body["usage"] = usage
            return f"data: {json.dumps(body)}\n\n".encode()

        async for data in _events(choices, chunk):
            await response.write(data)
        if chat.include_usage:
            await response.write(chunk([], self._usage(completion)))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()


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
