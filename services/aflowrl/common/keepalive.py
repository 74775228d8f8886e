"""HTTP/2 keepalive of every aflow-rl channel and server, set in one place so the two agree.

A client pings a connection on which nothing has arrived for ``ping_interval_s``; a server counts
a ping that comes sooner than ``min_ping_interval_s`` after the previous one (while it has sent no
data) as a strike, and after ``max_ping_strikes`` strikes closes the connection with GOAWAY
``too_many_pings``: every call on it fails with ``UNAVAILABLE: Too many pings``. gRPC's server
default allows one ping per 5 minutes, so a client pinging every 30 s kills its own long calls
(a 7B ``Train`` step, ``UpdateWeights``, ``Generate``: minutes with no data flowing).

:data:`KEEPALIVE` is the pairing both sides use (:func:`aflowrl.common.client.make_channel`,
:class:`aflowrl.common.server.GrpcServer`): the client pings every 30 s, the server accepts a ping
every 10 s, so the pings of a call that sends nothing for hours are all welcome, and a peer that
vanished is noticed within ``ping_interval_s + ping_timeout_s``. Pings are also allowed on
connections with no call, so an idle channel finds out its server died before the next call.

The channel-argument names are gRPC core's (``include/grpc/impl/channel_arg_names.h``). Beware:
the server's limit is ``grpc.http2.min_ping_interval_without_data_ms``; a plausible-looking
``grpc.http2.min_recv_ping_interval_without_data_ms`` is no argument at all and is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

ChannelArgs = list[tuple[str, int]]


@dataclass(frozen=True)
class Keepalive:
    """A client ping rate and the server policy that admits it (module docstring)."""

    ping_interval_s: float = 30.0
    """Client: seconds without any frame received before it pings."""
    ping_timeout_s: float = 20.0
    """Client and server: seconds to wait for a ping's ack before the connection is closed."""
    min_ping_interval_s: float = 10.0
    """Server: shortest gap between two pings it accepts while it sends no data."""
    max_ping_strikes: int = 2
    """Server: pings sooner than ``min_ping_interval_s`` tolerated before GOAWAY."""
    server_ping_interval_s: float = 60.0
    """Server: seconds without any frame before it pings the client (finds dead clients)."""

    def __post_init__(self) -> None:
        if self.ping_interval_s < self.min_ping_interval_s:
            raise ValueError(
                f"keepalive: clients would ping every {self.ping_interval_s}s but servers "
                f"accept a ping only every {self.min_ping_interval_s}s: every long call would "
                "end in GOAWAY too_many_pings"
            )
        if min(self.ping_timeout_s, self.min_ping_interval_s, self.server_ping_interval_s) <= 0:
            raise ValueError("keepalive: intervals and timeouts must be positive")

    def client_args(self) -> ChannelArgs:
        """Channel arguments of a client channel."""
        return [
            ("grpc.keepalive_time_ms", _ms(self.ping_interval_s)),
            ("grpc.keepalive_timeout_ms", _ms(self.ping_timeout_s)),
            ("grpc.keepalive_permit_without_calls", 1),
            # 0: no limit. The default (2) stops the pings of a call that sends nothing after
            # two of them, so a peer that dies mid-Train would go unnoticed until the deadline.
            ("grpc.http2.max_pings_without_data", 0),
        ]

    def server_args(self) -> ChannelArgs:
        """Channel arguments of a server: the ping policy admitting :meth:`client_args`."""
        return [
            ("grpc.http2.min_ping_interval_without_data_ms", _ms(self.min_ping_interval_s)),
            ("grpc.http2.max_ping_strikes", self.max_ping_strikes),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.keepalive_time_ms", _ms(self.server_ping_interval_s)),
            ("grpc.keepalive_timeout_ms", _ms(self.ping_timeout_s)),
            ("grpc.http2.max_pings_without_data", 0),
        ]


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


KEEPALIVE = Keepalive()
"""The pairing every aflow-rl client and server uses."""
