"""Entry point of ``aflowrl serve learner`` on every torchrun rank.

Every rank joins the process group and builds its shard of the policy; rank 0 then serves the
LearnerService (gRPC and /metrics) and broadcasts each call to the others, which follow until
rank 0 stops. Without torchrun the learner is a group of one. With the grpc weight transport,
rank 0 also dials the rollout replicas it pushes to, with the run's bearer token.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import threading

from aflowrl._proto.v1 import learner_pb2_grpc
from aflowrl.common.client import ChannelOptions
from aflowrl.common.server import GrpcServer, ServerOptions, ServiceRegistration
from aflowrl.config import RunSpec
from aflowrl.config.transport import learner_collective_timeout_s
from aflowrl.learner import distributed, worker
from aflowrl.learner.metrics import LearnerMetrics
from aflowrl.learner.service import SERVICE_NAME, LearnerServicer
from aflowrl.models import transport, wire

logger = logging.getLogger(__name__)

_STOP_TIMEOUT_S = 10.0


def _stop_followers(learner: worker.Learner) -> None:
    """Tell the other ranks to return; give up after a while (they may be gone already)."""
    if learner.ctx.world_size == 1:
        return

    def stop() -> None:
        try:
            worker.lead(learner, worker.StopCommand())
        except RuntimeError as exc:  # a rank already gone (torchrun stopping everything)
            logger.warning("could not tell the other ranks to stop: %s", exc)

    thread = threading.Thread(target=stop, name="stop", daemon=True)
    thread.start()
    thread.join(_STOP_TIMEOUT_S)
    if thread.is_alive():
        logger.warning("other ranks did not take the stop command within %.0fs", _STOP_TIMEOUT_S)
    else:
        distributed.shutdown()


async def serve(
    spec: RunSpec,
    *,
    host: str,
    port: int,
    metrics_port: int | None,
    health_port: int | None = None,
) -> None:
    """Run this rank until rank 0 is told to stop (SIGTERM / SIGINT)."""
    transport.check_weight_transport(spec)
    timeout_s = learner_collective_timeout_s(spec.weight_transport)
    ctx = distributed.init_distributed(
        cpu_offload=spec.learner.fsdp.cpu_offload, timeout_s=timeout_s
    )
    learner = worker.Learner(spec, ctx)
    if not ctx.is_main:
        # SIGTERM reaches every rank at once; rank 0 drains its calls, then tells the others.
        signal.signal(
            signal.SIGTERM, lambda *_: logger.info("rank %d: SIGTERM, waiting for rank 0", ctx.rank)
        )
        worker.follow(learner)
        distributed.shutdown()
        return
    if spec.weight_transport.type == "grpc":
        wire.keep_message_memory()  # rank 0 pushes the weights
    metrics = LearnerMetrics(transports=[spec.weight_transport.type])
    servicer = LearnerServicer(
        learner,
        metrics,
        default_chunk_bytes=_chunk_bytes(spec),
        heartbeat_s=timeout_s * distributed.HEARTBEAT_FRACTION,
        # Rank 0 dials the rollout replicas it pushes to as the trainer does: the run's TLS
        # (client certificate under mTLS) and bearer token, one attempt per push.
        push_options=dataclasses.replace(
            ChannelOptions.from_spec(spec.grpc, timeout_s=3600.0), max_attempts=1
        ),
    )
    metrics.policy_version.set(learner.state.policy_version)
    options = ServerOptions.from_spec(
        "learner",
        spec.grpc,
        port=port,
        metrics_port=metrics_port,
        host=host,
        health_port=health_port,
    )
    registration = ServiceRegistration(
        servicer, learner_pb2_grpc.add_LearnerServiceServicer_to_server, SERVICE_NAME
    )
    server = GrpcServer(options, [registration], metrics=metrics)
    servicer.on_broken = server.request_stop
    try:
        server.handle_signals()  # before it serves: a SIGTERM is never lost
        async with server:
            await server.serve_until_signal()
    finally:
        await servicer.push_channels.close()
        await asyncio.to_thread(servicer.commands.close, _STOP_TIMEOUT_S)
        _stop_followers(learner)


def _chunk_bytes(spec: RunSpec) -> int:
    transport = spec.weight_transport
    chunk = transport.chunk_mib if transport.type == "grpc" else 4
    # Leave room for the message envelope under the gRPC size limit.
    return min(chunk * 1024 * 1024, spec.grpc.max_message_mib * 1024 * 1024 - 64 * 1024)
