"""A server built with aflowrl.common.server around a fake RolloutService, for bootstrap tests.

The servicer is a test double: the subject under test is the bootstrap (health, SIGTERM, error
mapping, metrics), not generation. ``Generate`` sleeps ``sampling.max_tokens`` milliseconds and
rejects a negative temperature as bad input; ``Status`` fails with UNAVAILABLE the first
``--flaky`` times (to exercise client retries).

Run as a script: ``python fake_rollout_server.py --warmup-s 1 --grace-s 5`` prints one JSON line
with the ports once bound, then serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from aflowrl._proto.v1 import rollout_pb2, rollout_pb2_grpc
from aflowrl.common.logging import setup_logging
from aflowrl.common.server import GrpcServer, ServerOptions, ServiceRegistration
from aflowrl.errors import InvalidInputError, UnavailableError

SERVICE = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].full_name


class FakeRollout(rollout_pb2_grpc.RolloutServiceServicer):
    def __init__(self, flaky: int = 0) -> None:
        self.flaky = flaky
        self.status_calls = 0

    async def Generate(self, request, context):
        if request.sampling.temperature < 0:
            raise InvalidInputError("must be >= 0", field="sampling.temperature")
        await asyncio.sleep(request.sampling.max_tokens / 1000)
        return rollout_pb2.GenerateResponse(weight_version=7)

    async def Status(self, request, context):
        self.status_calls += 1
        if self.status_calls <= self.flaky:
            raise UnavailableError("warming up")
        return rollout_pb2.RolloutStatusResponse(backend="fake", weight_version=7)

    async def LoadWeights(self, request, context):
        raise UnavailableError("volume not mounted yet")


def registration(servicer: FakeRollout) -> ServiceRegistration:
    return ServiceRegistration(
        servicer, rollout_pb2_grpc.add_RolloutServiceServicer_to_server, SERVICE
    )


async def _main(args: argparse.Namespace) -> None:
    options = ServerOptions(
        component="rollout", host="127.0.0.1", port=0, metrics_port=0, grace_s=args.grace_s
    )
    server: GrpcServer

    async def warmup() -> None:
        print(json.dumps({"port": server.port, "metrics_port": server.metrics_port}), flush=True)
        await asyncio.sleep(args.warmup_s)

    server = GrpcServer(options, [registration(FakeRollout(args.flaky))], warmup=warmup)
    server.handle_signals()  # before it serves: a SIGTERM is never lost
    async with server:
        await server.serve_until_signal()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--warmup-s", type=float, default=0.0)
    parser.add_argument("--grace-s", type=float, default=5.0)
    parser.add_argument("--flaky", type=int, default=0)
    setup_logging("INFO")
    asyncio.run(_main(parser.parse_args()))
    sys.exit(0)
