"""Entry point of ``aflowrl serve rollout``: build the engine from the run spec and serve it.

Called by :mod:`aflowrl.cli.serve` after the spec is validated. With the filesystem weight
transport, a (re)started replica loads the newest complete weights directory on the shared
volume before turning SERVING, so it never serves weights older than its peers.
"""

from __future__ import annotations

import logging

from aflowrl._proto.v1 import rollout_pb2_grpc
from aflowrl.common.server import GrpcServer, ServerOptions, ServiceRegistration
from aflowrl.config import RunSpec
from aflowrl.models import loading, transport, weights
from aflowrl.rollout.engine import RolloutEngine
from aflowrl.rollout.metrics import RolloutMetrics
from aflowrl.rollout.service import SERVICE_NAME, RolloutServicer

logger = logging.getLogger(__name__)


def build_engine(spec: RunSpec) -> RolloutEngine:
    """The engine ``rollout.engine`` names, for ``policy.model``."""
    model_dir = loading.resolve_model_path(spec.policy.model)
    if spec.rollout.engine == "vllm":
        from aflowrl.rollout.vllm_engine import VllmEngine

        return VllmEngine(
            model_dir,
            dtype=spec.policy.dtype,
            engine_spec=spec.rollout.vllm,
            trust_remote_code=spec.policy.trust_remote_code,
        )
    from aflowrl.rollout.hf_engine import HfEngine

    return HfEngine(
        model_dir,
        dtype=spec.policy.dtype,
        max_batch_size=spec.rollout.max_batch_size,
        trust_remote_code=spec.policy.trust_remote_code,
    )


def build_servicer(
    spec: RunSpec, engine: RolloutEngine, metrics: RolloutMetrics
) -> RolloutServicer:
    return RolloutServicer(
        engine,
        sampling_defaults=spec.rollout.sampling,
        score_temperature=spec.rollout.sampling.temperature,
        metrics=metrics,
    )


async def serve(
    spec: RunSpec,
    *,
    host: str,
    port: int,
    metrics_port: int | None,
    health_port: int | None = None,
) -> None:
    """Serve until SIGTERM / SIGINT; the engine is closed on every path."""
    transport.check_weight_transport(spec)
    engine = build_engine(spec)
    metrics = RolloutMetrics()
    servicer = build_servicer(spec, engine, metrics)

    async def warmup() -> None:
        await engine.start()
        weight_transport = spec.weight_transport
        if weight_transport.type == "filesystem":
            latest = weights.latest_weights_dir(weight_transport.path)
            if latest is not None:
                await servicer.load_directory(str(latest[0]), latest[1])

    options = ServerOptions.from_spec(
        "rollout",
        spec.grpc,
        port=port,
        metrics_port=metrics_port,
        host=host,
        health_port=health_port,
    )
    registration = ServiceRegistration(
        servicer,
        rollout_pb2_grpc.add_RolloutServiceServicer_to_server,
        SERVICE_NAME,
    )
    server = GrpcServer(options, [registration], warmup=warmup, metrics=metrics)
    try:
        async with server:
            await server.serve_until_signal()
    finally:
        await engine.close()
