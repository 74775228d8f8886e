"""Entry point of ``aflowrl serve rollout``: build the engine from the run spec and serve it.

Called by :mod:`aflowrl.cli.serve` after the spec is validated. With the filesystem weight
transport (or the nccl transport, whose fallback exports live on a shared volume too), a
(re)started replica loads the newest complete weights directory there before turning SERVING,
so it never serves weights older than it could. A replica whose broadcast broke off turns
NOT_SERVING until it is reloaded (:mod:`aflowrl.rollout.service`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from grpc_health.v1 import health_pb2

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
            lora=spec.policy.lora,
        )
    from aflowrl.rollout.hf_engine import HfEngine

    return HfEngine(
        model_dir,
        dtype=spec.policy.dtype,
        max_batch_size=spec.rollout.max_batch_size,
        trust_remote_code=spec.policy.trust_remote_code,
        lora=spec.policy.lora,
    )


def build_servicer(
    spec: RunSpec,
    engine: RolloutEngine,
    metrics: RolloutMetrics,
    on_health: Callable[[bool], Awaitable[None]] | None = None,
) -> RolloutServicer:
    return RolloutServicer(
        engine,
        sampling_defaults=spec.rollout.sampling,
        score_temperature=spec.rollout.sampling.temperature,
        metrics=metrics,
        on_health=on_health,
    )


def shared_weights_root(spec: RunSpec) -> str | None:
    """The directory of complete weight versions a replica may load on start, if any."""
    transport = spec.weight_transport
    if transport.type == "filesystem":
        return transport.path
    if transport.type == "nccl":
        return transport.fallback_path
    return None


async def serve(spec: RunSpec, *, host: str, port: int, metrics_port: int | None) -> None:
    """Serve until SIGTERM / SIGINT; the engine is closed on every path."""
    transport.check_weight_transport(spec)
    engine = build_engine(spec)
    metrics = RolloutMetrics()
    server: GrpcServer | None = None

    async def on_health(serving: bool) -> None:
        if server is None or (serving and server.stopping):
            return
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", SERVICE_NAME):
            await server.health.set(name, status)

    servicer = build_servicer(spec, engine, metrics, on_health)

    async def warmup() -> None:
        await engine.start()
        root = shared_weights_root(spec)
        latest = weights.latest_weights_dir(root) if root else None
        if latest is not None:
            await servicer.load_directory(str(latest[0]), latest[1])

    options = ServerOptions.from_spec(
        "rollout", spec.grpc, port=port, metrics_port=metrics_port, host=host
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
