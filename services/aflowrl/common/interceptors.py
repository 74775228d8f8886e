"""Server interceptors: request ids, the standard gRPC metrics, bearer-token auth, error mapping.

Most interceptors wrap the method handler's behaviour in an async context manager
(:class:`AroundInterceptor`), so one helper covers the four RPC shapes (unary/stream in and out);
:class:`GrpcMetricsInterceptor` also counts the messages of streams, so it wraps them itself.
Order in the server (outermost first): request id, metrics, auth, error mapping, request
decoding. The error mapping is the only place that turns exceptions into gRPC status codes:

| exception | status |
|---|---|
| InvalidInputError (ConfigError too) | INVALID_ARGUMENT, message names the field |
| request bytes that are not the method's message | INVALID_ARGUMENT, naming the method |
| NotFoundError | NOT_FOUND |
| FailedPreconditionError | FAILED_PRECONDITION |
| OverloadedError | RESOURCE_EXHAUSTED |
| UnavailableError | UNAVAILABLE |
| DeadlineExceededError | DEADLINE_EXCEEDED |
| PermanentError (other) | FAILED_PRECONDITION |
| a field breaking a rule of :mod:`.validation` | INVALID_ARGUMENT, naming the field |
| anything else (a bug; a library's BaseException too) | INTERNAL, logged with the request id |
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import inspect
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
from google.protobuf.message import Message
from grpc import aio

from aflowrl import errors
from aflowrl.common import validation
from aflowrl.common.logging import request_id_var
from aflowrl.common.metrics import GRPC_TYPES, GrpcServerMetrics

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    Context: TypeAlias = aio.ServicerContext[Any, Any]
    Handler: TypeAlias = grpc.RpcMethodHandler[Any, Any]

REQUEST_ID_KEY = "x-request-id"
AUTHORIZATION_KEY = "authorization"
# Kubernetes probes and tooling call these without credentials.
UNAUTHENTICATED_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def _wrap_behavior(
    behavior: Callable[..., Any],
    around: Callable[[Context], Any],
    streaming_response: bool,
) -> Callable[..., Any]:
    # Response streams written with ``context.write`` (e.g. health's Watch) are coroutines, not
    # async generators; they are wrapped like unary behaviours.
    if streaming_response and inspect.isasyncgenfunction(behavior):

        @functools.wraps(behavior)
        async def stream_wrapper(request: Any, context: Context) -> AsyncIterator[Any]:
            async with around(context):
                async for item in behavior(request, context):
                    yield item

        return stream_wrapper

    @functools.wraps(behavior)
    async def unary_wrapper(request: Any, context: Context) -> Any:
        async with around(context):
            return await behavior(request, context)

    return unary_wrapper


_HANDLER_KINDS: tuple[tuple[str, Callable[..., Any], bool], ...] = (
    # (behaviour attribute, handler factory, streams its response)
    ("unary_unary", grpc.unary_unary_rpc_method_handler, False),
    ("unary_stream", grpc.unary_stream_rpc_method_handler, True),
    ("stream_unary", grpc.stream_unary_rpc_method_handler, False),
    ("stream_stream", grpc.stream_stream_rpc_method_handler, True),
)


def wrap_handler(handler: Handler, around: Callable[[Context], Any]) -> Handler:
    """A copy of ``handler`` whose behaviour runs inside ``around(context)``."""
    for attribute, factory, streaming_response in _HANDLER_KINDS:
        behavior = getattr(handler, attribute)
        if behavior is not None:
            wrapped: Handler = factory(
                _wrap_behavior(behavior, around, streaming_response),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
            return wrapped
    return handler


class AroundInterceptor(aio.ServerInterceptor):
    """Base: subclasses implement :meth:`around` as an async context manager."""

    def applies(self, method: str) -> bool:
        return True

    def around(self, method: str, context: Context) -> contextlib.AbstractAsyncContextManager[None]:
        raise NotImplementedError

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not self.applies(method):
            return handler
        return wrap_handler(handler, functools.partial(self.around, method))


def _metadata(context: Context, key: str) -> str | None:
    for item_key, value in context.invocation_metadata() or ():
        if item_key == key:
            return value.decode() if isinstance(value, bytes) else value
    return None


class RequestIdInterceptor(AroundInterceptor):
    """Takes ``x-request-id`` from the call (or makes one), logs with it, echoes it back."""

    @contextlib.asynccontextmanager
    async def around(self, method: str, context: Context) -> AsyncIterator[None]:
        request_id = _metadata(context, REQUEST_ID_KEY) or uuid.uuid4().hex[:16]
        token = request_id_var.set(request_id)
        # Echoed in trailing metadata: sending initial metadata early would commit the call
        # and disable the client's transparent retries.
        context.set_trailing_metadata(((REQUEST_ID_KEY, request_id),))
        try:
            yield
        finally:
            request_id_var.reset(token)


class AuthInterceptor(AroundInterceptor):
    """Requires ``authorization: Bearer <token>`` on every call but health and reflection."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def applies(self, method: str) -> bool:
        return not method.startswith(UNAUTHENTICATED_SERVICES)

    @contextlib.asynccontextmanager
    async def around(self, method: str, context: Context) -> AsyncIterator[None]:
        given = (_metadata(context, AUTHORIZATION_KEY) or "").encode()
        if not hmac.compare_digest(given, self._expected):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        yield


def status_name(code: grpc.StatusCode | int | None) -> str:
    """The name of a status code (``context.code()`` may give the raw integer, or None: OK)."""
    if code is None:
        return grpc.StatusCode.OK.name
    if isinstance(code, grpc.StatusCode):
        return code.name
    return next((c.name for c in grpc.StatusCode if c.value[0] == code), "UNKNOWN")


class GrpcMetricsInterceptor(aio.ServerInterceptor):
    """Records :class:`~aflowrl.common.metrics.GrpcServerMetrics` for every call.

    As go-grpc-prometheus does: started when the handler runs; each request message received
    (one for a unary request, each item of a request stream) and each response message sent
    (one for a unary response that succeeded); handled with the final status code and its
    handling time when the call ends. A response stream written with ``context.write`` instead of
    ``yield`` is counted as handled, not per message.
    """

    def __init__(self, metrics: GrpcServerMetrics) -> None:
        self.metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        service, _, method = handler_call_details.method.lstrip("/").rpartition("/")
        kind = GRPC_TYPES[(handler.request_streaming, handler.response_streaming)]
        labels = (kind, service, method)
        for attribute, factory, _streaming_response in _HANDLER_KINDS:
            behavior = getattr(handler, attribute)
            if behavior is not None:
                wrapped: Handler = factory(
                    self._wrap(behavior, labels, handler.request_streaming),
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
                return wrapped
        return handler

    def _wrap(
        self, behavior: Callable[..., Any], labels: tuple[str, str, str], request_streaming: bool
    ) -> Callable[..., Any]:
        metrics = self.metrics
        received = metrics.msg_received.labels(*labels)
        sent = metrics.msg_sent.labels(*labels)

        async def counted(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
            async for request in requests:
                received.inc()
                yield request

        def begin(request: Any) -> Any:
            metrics.started.labels(*labels).inc()
            if request_streaming:
                return counted(request)
            received.inc()
            return request

        if inspect.isasyncgenfunction(behavior):

            @functools.wraps(behavior)
            async def stream_wrapper(request: Any, context: Context) -> AsyncIterator[Any]:
                async with self._handled(labels, context):
                    async for item in behavior(begin(request), context):
                        sent.inc()
                        yield item

            return stream_wrapper

        @functools.wraps(behavior)
        async def unary_wrapper(request: Any, context: Context) -> Any:
            async with self._handled(labels, context):
                response = await behavior(begin(request), context)
            # ``context.write`` streams return None; a unary reply is one message sent.
            if response is not None and status_name(context.code()) == "OK":
                sent.inc()
            return response

        return unary_wrapper

    @contextlib.asynccontextmanager
    async def _handled(self, labels: tuple[str, str, str], context: Context) -> AsyncIterator[None]:
        start = time.perf_counter()
        code = "OK"
        try:
            yield
            code = status_name(context.code())
        except aio.AbortError:
            code = status_name(context.code() or grpc.StatusCode.UNKNOWN)
            raise
        except asyncio.CancelledError:
            # The client cancelled (or went away): gRPC cancels the handler's task, sometimes
            # before ``context.cancelled()`` says so.
            code = "CANCELLED"
            raise
        except BaseException:
            code = "CANCELLED" if context.cancelled() else "UNKNOWN"
            raise
        finally:
            self.metrics.handled.labels(*labels, code).inc()
            self.metrics.handling.labels(*labels).observe(time.perf_counter() - start)


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status code a domain error maps to (INTERNAL for anything unexpected)."""
    table: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
        (errors.InvalidInputError, grpc.StatusCode.INVALID_ARGUMENT),
        (errors.NotFoundError, grpc.StatusCode.NOT_FOUND),
        (errors.FailedPreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
        (errors.CorruptStateError, grpc.StatusCode.DATA_LOSS),
        (errors.OverloadedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (errors.UnavailableError, grpc.StatusCode.UNAVAILABLE),
        (errors.DeadlineExceededError, grpc.StatusCode.DEADLINE_EXCEEDED),
        (errors.PermanentError, grpc.StatusCode.FAILED_PRECONDITION),
        (errors.RetryableError, grpc.StatusCode.UNAVAILABLE),
    )
    for kind, code in table:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


class ErrorMappingInterceptor(AroundInterceptor):
    """Turns domain errors into status codes; logs unexpected ones with their traceback."""

    @contextlib.asynccontextmanager
    async def around(self, method: str, context: Context) -> AsyncIterator[None]:
        try:
            yield
        except (aio.AbortError, aio.UsageError):
            raise
        except errors.AflowRLError as exc:
            code = status_for(exc)
            logger.info("%s failed with %s: %s", method, code.name, exc)
            await context.abort(code, str(exc))
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except BaseException:  # libraries raise BaseException subclasses too
            # (torch.distributed.checkpoint's CheckpointException): let none escape the handler,
            # where gRPC would drop the call and leave the client waiting for its deadline.
            if context.cancelled():
                raise
            logger.exception("%s failed with an unexpected error", method)
            request_id = request_id_var.get()
            await context.abort(
                grpc.StatusCode.INTERNAL,
                f"internal error (request id {request_id}); see server log",
            )


_STREAMING_REQUESTS = ("stream_unary", "stream_stream")


class _Undecodable:
    """What the request deserializer gives for bytes that do not parse as the request message."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _decode_error(method: str, request: _Undecodable) -> errors.InvalidInputError:
    return errors.InvalidInputError(
        f"the request does not parse as the method's message ({request.reason})", field=method
    )


def _valid(request: Any, method: str) -> Any:
    """A decoded request, checked by the one validation layer (:mod:`.validation`)."""
    if isinstance(request, _Undecodable):
        raise _decode_error(method, request)
    if isinstance(request, Message):
        validation.check(request, prefix=validation.prefix_for(method))
    return request


async def _decoded_stream(requests: AsyncIterator[Any], method: str) -> AsyncIterator[Any]:
    async for request in requests:
        yield _valid(request, method)


class RequestDecodingInterceptor(aio.ServerInterceptor):
    """Bytes that are not the method's request message become INVALID_ARGUMENT naming it, and
    so does a decoded message a field of which breaks :mod:`aflowrl.common.validation`'s rules
    (naming the field).

    gRPC's own handling is UNKNOWN with a traceback in the log. The deserializer is wrapped to
    return a marker instead of raising; the behaviour (inside the error mapping) turns the marker
    into an :class:`~aflowrl.errors.InvalidInputError`, for single requests and streams alike.
    """

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method
        deserialize = handler.request_deserializer

        def tolerant(data: bytes) -> Any:
            try:
                return deserialize(data)
            except Exception as exc:  # noqa: BLE001 - any failure to decode is the request's
                return _Undecodable(str(exc) or type(exc).__name__)

        for attribute, factory, _ in _HANDLER_KINDS:
            behavior = getattr(handler, attribute)
            if behavior is not None:
                checked = _checked(
                    behavior, method, streaming_request=attribute in _STREAMING_REQUESTS
                )
                wrapped: Handler = factory(
                    checked,
                    request_deserializer=tolerant,
                    response_serializer=handler.response_serializer,
                )
                return wrapped
        return handler


def _checked(
    behavior: Callable[..., Any], method: str, *, streaming_request: bool
) -> Callable[..., Any]:
    """``behavior`` refusing undecodable requests (the same kind of function: the outer
    interceptors tell async generators from coroutines)."""

    def decoded(request: Any) -> Any:
        if streaming_request:
            return _decoded_stream(request, method)
        return _valid(request, method)

    if inspect.isasyncgenfunction(behavior):

        @functools.wraps(behavior)
        async def stream_wrapper(request: Any, context: Context) -> AsyncIterator[Any]:
            async for item in behavior(decoded(request), context):
                yield item

        return stream_wrapper

    @functools.wraps(behavior)
    async def unary_wrapper(request: Any, context: Context) -> Any:
        return await behavior(decoded(request), context)

    return unary_wrapper


def server_interceptors(
    metrics: GrpcServerMetrics, auth_token: str | None
) -> list[aio.ServerInterceptor]:
    """The interceptor chain every aflow-rl server uses, outermost first."""
    chain: list[aio.ServerInterceptor] = [RequestIdInterceptor(), GrpcMetricsInterceptor(metrics)]
    if auth_token:
        chain.append(AuthInterceptor(auth_token))
    chain.append(ErrorMappingInterceptor())
    chain.append(RequestDecodingInterceptor())
    return chain
