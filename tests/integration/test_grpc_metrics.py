"""The standard gRPC server metrics, counted exactly for the four call shapes and their endings.

The names and labels are go-grpc-prometheus's (``grpc_server_started_total``,
``grpc_server_handled_total``, ``grpc_server_msg_received_total``, ``grpc_server_msg_sent_total``,
``grpc_server_handling_seconds``), so dashboards and alerts written for them work unchanged.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio

from aflowrl.common.client import ChannelOptions, make_channel
from aflowrl.common.server import GrpcServer, ServerOptions, ServiceRegistration
from aflowrl.errors import InvalidInputError

sys.path.insert(0, str(Path(__file__).parent))
import fake_rollout_server

SERVICE = "aflowrl.test.Shapes"


def _registration(entered: asyncio.Event, left: asyncio.Event) -> ServiceRegistration:
    """One method of each shape; a request ``b"bad"`` is bad input, ``b"wait"`` waits forever
    (``entered`` is set when it starts waiting, ``left`` when it stops)."""

    async def unary(request: bytes, context: aio.ServicerContext) -> bytes:
        if request == b"bad":
            raise InvalidInputError("no", field="request")
        if request == b"wait":
            entered.set()
            try:
                await asyncio.Event().wait()
            finally:
                left.set()
        return request

    async def server_stream(request: bytes, context: aio.ServicerContext) -> AsyncIterator[bytes]:
        for _ in range(int(request.decode())):
            yield b"chunk"

    async def client_stream(requests: AsyncIterator[bytes], context: aio.ServicerContext) -> bytes:
        return b"%d" % len([r async for r in requests])

    async def bidi(
        requests: AsyncIterator[bytes], context: aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request
            yield request

    def add(_servicer: object, server: aio.Server) -> None:
        handlers = {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
            "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream),
            "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))

    return ServiceRegistration(None, add, SERVICE)


def _value(server: GrpcServer, name: str, **labels: str) -> float:
    value = server.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def _labels(kind: str, method: str) -> dict[str, str]:
    return {"grpc_type": kind, "grpc_service": SERVICE, "grpc_method": method}


async def _requests(count: int) -> AsyncIterator[bytes]:
    for _ in range(count):
        yield b"x"


async def test_every_call_shape_is_counted_as_go_grpc_prometheus_counts_it():
    entered, left = asyncio.Event(), asyncio.Event()
    options = ServerOptions(component="learner", host="127.0.0.1")
    async with GrpcServer(options, [_registration(entered, left)]) as server:
        channel = make_channel(f"127.0.0.1:{server.port}", ChannelOptions(max_attempts=1))
        assert await channel.unary_unary(f"/{SERVICE}/Unary")(b"ok") == b"ok"
        with pytest.raises(aio.AioRpcError) as info:
            await channel.unary_unary(f"/{SERVICE}/Unary")(b"bad")
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        chunks = [c async for c in channel.unary_stream(f"/{SERVICE}/ServerStream")(b"3")]
        assert len(chunks) == 3
        assert await channel.stream_unary(f"/{SERVICE}/ClientStream")(_requests(4)) == b"4"
        echoed = [r async for r in channel.stream_stream(f"/{SERVICE}/Bidi")(_requests(2))]
        assert len(echoed) == 4

        # A call in flight: started, not yet handled; then cancelled by its client.
        waiting = channel.unary_unary(f"/{SERVICE}/Unary")(b"wait")
        await entered.wait()
        unary = _labels("unary", "Unary")
        assert _value(server, "grpc_server_started_total", **unary) == 3
        handled = sum(
            _value(server, "grpc_server_handled_total", **unary, grpc_code=code.name)
            for code in grpc.StatusCode
        )
        assert handled == 2  # started 3 - handled 2 = 1 in flight
        waiting.cancel()
        await left.wait()
        await asyncio.sleep(0)  # the interceptor records as the cancelled handler unwinds
        assert _value(server, "grpc_server_handled_total", **unary, grpc_code="CANCELLED") == 1

        assert _value(server, "grpc_server_handled_total", **unary, grpc_code="OK") == 1
        assert _value(server, "grpc_server_handled_total", **unary, grpc_code="INVALID_ARGUMENT")
        assert _value(server, "grpc_server_msg_received_total", **unary) == 3
        assert _value(server, "grpc_server_msg_sent_total", **unary) == 1  # only the OK reply
        assert _value(server, "grpc_server_handling_seconds_count", **unary) == 3

        stream = _labels("server_stream", "ServerStream")
        assert _value(server, "grpc_server_msg_received_total", **stream) == 1
        assert _value(server, "grpc_server_msg_sent_total", **stream) == 3
        assert _value(server, "grpc_server_handled_total", **stream, grpc_code="OK") == 1
        upload = _labels("client_stream", "ClientStream")
        assert _value(server, "grpc_server_msg_received_total", **upload) == 4
        assert _value(server, "grpc_server_msg_sent_total", **upload) == 1
        bidi = _labels("bidi_stream", "Bidi")
        assert _value(server, "grpc_server_msg_received_total", **bidi) == 2
        assert _value(server, "grpc_server_msg_sent_total", **bidi) == 4
        assert _value(server, "grpc_server_handling_seconds_count", **bidi) == 1
        await channel.close()


async def test_every_method_of_a_registered_service_has_zero_series_from_the_start():
    options = ServerOptions(component="rollout", host="127.0.0.1")
    registration = fake_rollout_server.registration(fake_rollout_server.FakeRollout())
    async with GrpcServer(options, [registration]) as server:
        names = {family.name for family in server.metrics.registry.collect()}
        assert {"process_cpu_seconds", "process_resident_memory_bytes"} <= names
        labels = {
            "grpc_type": "client_stream",
            "grpc_service": fake_rollout_server.SERVICE,
            "grpc_method": "UpdateWeights",
        }
        get = server.metrics.registry.get_sample_value
        assert get("grpc_server_started_total", labels) == 0
        assert get("grpc_server_handled_total", {**labels, "grpc_code": "INTERNAL"}) == 0
        assert get("grpc_server_handling_seconds_count", labels) == 0
        status = {**labels, "grpc_type": "unary", "grpc_method": "Status"}
        assert get("grpc_server_msg_sent_total", status) == 0
        health = {"grpc_type": "unary", "grpc_service": "grpc.health.v1.Health"}
        assert get("grpc_server_started_total", {**health, "grpc_method": "Check"}) == 0
