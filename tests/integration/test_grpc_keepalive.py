"""Long, quiet calls survive: the clients' keepalive pings are ones the servers admit.

A handler that sleeps and sends nothing stands for a 7B ``Train`` step. With a pairing where the
client pings faster than the server allows, gRPC closes the connection (GOAWAY too_many_pings)
and the call fails with ``UNAVAILABLE: Too many pings``: seen first with 1 s pings against a
10 s minimum, in seconds. The project's pairing (:data:`KEEPALIVE`, one object used by server and
channel) keeps such a call alive: at a scale of seconds here, and at full scale for over five
minutes (gRPC's default server policy, which the issue's failure hit after 240 s) in the slow
test.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc import aio

from aflowrl.common.client import ChannelOptions, make_channel
from aflowrl.common.keepalive import KEEPALIVE, Keepalive
from aflowrl.common.server import GrpcServer, ServerOptions, ServiceRegistration

SERVICE = "aflowrl.test.Quiet"


def _quiet_registration() -> ServiceRegistration:
    """``Sleep``: waits as many seconds as the request's bytes say, sending nothing meanwhile."""

    async def sleep(request: bytes, context: aio.ServicerContext) -> bytes:
        await asyncio.sleep(float(request.decode()))
        return b"done"

    def add(_servicer: object, server: aio.Server) -> None:
        handler = grpc.unary_unary_rpc_method_handler(sleep)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, {"Sleep": handler}),)
        )

    return ServiceRegistration(None, add, SERVICE)


async def _quiet_call(server_side: Keepalive, client_side: Keepalive, seconds: float) -> str:
    """A call of ``seconds`` with no data through the project's server and channel."""
    options = ServerOptions(component="learner", host="127.0.0.1", keepalive=server_side)
    async with GrpcServer(options, [_quiet_registration()]) as server:
        channel = make_channel(
            f"127.0.0.1:{server.port}",
            ChannelOptions(timeout_s=None, max_attempts=1, keepalive=client_side),
        )
        try:
            call = channel.unary_unary(f"/{SERVICE}/Sleep")
            reply = await call(str(seconds).encode(), timeout=seconds + 600)
            return reply.decode()
        except aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
        finally:
            await channel.close()


async def test_a_client_pinging_faster_than_the_server_allows_loses_its_call():
    # Each side is a valid pairing on its own; together they are the bug. The call
    # would sleep 10 minutes: it fails as soon as the server runs out of patience.
    server_side = Keepalive(ping_interval_s=10.0, min_ping_interval_s=10.0)
    client_side = Keepalive(ping_interval_s=1.0, min_ping_interval_s=1.0)
    outcome = await _quiet_call(server_side, client_side, seconds=600.0)
    assert outcome == "UNAVAILABLE: Too many pings"


async def test_the_projects_pairing_keeps_a_quiet_call_alive_at_a_small_scale():
    # KEEPALIVE's ratios with 1.5 s pings: a dozen pings with no data in between, all admitted.
    # (Had the server's limit been set under a name gRPC ignores, its 5-minute default would
    # end this call after three pings.)
    scale = 1.5 / KEEPALIVE.ping_interval_s
    scaled = Keepalive(
        ping_interval_s=KEEPALIVE.ping_interval_s * scale,
        ping_timeout_s=KEEPALIVE.ping_timeout_s,
        min_ping_interval_s=KEEPALIVE.min_ping_interval_s * scale,
        max_ping_strikes=KEEPALIVE.max_ping_strikes,
    )
    assert await _quiet_call(scaled, scaled, seconds=18.0) == "done"


def test_a_pairing_the_server_would_refuse_cannot_be_configured():
    with pytest.raises(ValueError, match="GOAWAY too_many_pings"):
        Keepalive(ping_interval_s=5.0, min_ping_interval_s=10.0)
    client = dict(KEEPALIVE.client_args())
    server = dict(KEEPALIVE.server_args())
    assert (
        client["grpc.keepalive_time_ms"] >= server["grpc.http2.min_ping_interval_without_data_ms"]
    )
    assert client["grpc.keepalive_permit_without_calls"] == 1
    assert server["grpc.keepalive_permit_without_calls"] == 1
    assert client["grpc.http2.max_pings_without_data"] == 0  # a quiet call keeps pinging


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_a_call_quiet_for_over_five_minutes_survives_the_projects_keepalive():
    # The failure: Train with no data flowing died after 240 s. 330 s, full scale.
    assert await _quiet_call(KEEPALIVE, KEEPALIVE, seconds=330.0) == "done"
