"""Entry point of ``aflowrl serve rollout``: build the engine from the run spec and serve it.

Called by :mod:`aflowrl.cli.serve` after the spec is validated. With the filesystem weight
transport (or the nccl transport, whose fallback exports live on a shared volume too), a
(re)started replica loads the newest complete weights directory there before turning SERVING,
so it never serves weights older than it could. A replica whose broadcast broke off turns
its rollout service NOT_SERVING (readiness) until it is reloaded; only a dead engine turns the
overall health (liveness) NOT_SERVING (:func:`health_reporter`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2

from aflowrl._proto.v1 import rollout_pb2_grpc
from aflowrl.common.server import GrpcServer, ServerOptions, ServiceRegistration
from aflowrl.config import RunSpec
from aflowrl.models import loading, transport, weights, wire
from aflowrl.rollout.engine import RolloutEngine
from aflowrl.rollout.metrics import RolloutMetrics
from aflowrl.rollout.service import SERVICE_NAME, RolloutServicer

logger = logging.getLogger(__name__)


_UPDATE_WEIGHTS = f"/{SERVICE_NAME}/UpdateWeights"


def _raw_chunks(handler: Any) -> Any:
    """``UpdateWeights``' handler with :func:`wire.decode_chunk` as its request deserialiser."""
    return grpc.stream_unary_rpc_method_handler(
        handler.stream_unary,
        request_deserializer=wire.decode_chunk,
        response_serializer=handler.response_serializer,
    )


class _RawChunksGeneric(grpc.GenericRpcHandler):
    def __init__(self, inner: grpc.GenericRpcHandler) -> None:
        self._inner = inner

    def service(self, handler_call_details: Any) -> Any:
        handler = self._inner.service(handler_call_details)
        if handler is not None and handler_call_details.method == _UPDATE_WEIGHTS:
            return _raw_chunks(handler)
        return handler


class _RawChunksServer:
    """The server as the generated registration sees it, ``UpdateWeights`` decoded raw."""

    def __init__(self, server: aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(tuple(_RawChunksGeneric(h) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        handlers = {**handlers, "UpdateWeights": _raw_chunks(handlers["UpdateWeights"])}
        self._server.add_registered_method_handlers(service, handlers)


def add_rollout_service(servicer: RolloutServicer, server: aio.Server) -> None:
    """The generated registration, except that weight chunks arrive undecoded by protobuf.

    protobuf's parser copies every chunk's bytes twice; :func:`aflowrl.models.wire.decode_chunk`
    hands the servicer a view of the message instead (``bench/weight_push.py`` measures it).
    """
    adapter: Any = _RawChunksServer(server)  # duck-types the two methods the registration calls
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(servicer, adapter)


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
    on_health: Callable[[bool, bool], Awaitable[None]] | None = None,
) -> RolloutServicer:
    return RolloutServicer(
        engine,
        sampling_defaults=spec.rollout.sampling,
        score_temperature=spec.rollout.sampling.temperature,
        metrics=metrics,
        on_health=on_health,
    )


def health_reporter(server: GrpcServer) -> Callable[[bool, bool], Awaitable[None]]:
    """The servicer's ``on_health(ready, alive)``: the replica's health on ``server``.

    Readiness is the rollout service's own status (``aflowrl.v1.RolloutService``), liveness the
    overall one (``""``), as the operator's probes read them (``readinessProbe`` names the
    service, ``livenessProbe`` does not). Not ready (waiting for a complete version after a
    broken update) turns the rollout service NOT_SERVING and leaves the overall status alone, so
    a long reload is never killed by the liveness probe; not alive (a dead engine) turns both
    NOT_SERVING, and the liveness probe restarts the pod. Never SERVING again once stopping."""

    async def on_health(ready: bool, alive: bool) -> None:
        if ready and server.stopping:
            return
        serving, not_serving = (
            health_pb2.HealthCheckResponse.SERVING,
            health_pb2.HealthCheckResponse.NOT_SERVING,
        )
        await server.health.set(SERVICE_NAME, serving if ready and alive else not_serving)
        if not alive:
            await server.health.set("", not_serving)
        elif ready:
            await server.health.set("", serving)

    return on_health


def shared_weights_root(spec: RunSpec) -> str | None:
    """The directory of complete weight versions a replica may load on start, if any."""
    return spec.weight_transport.shared_path


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
    if spec.weight_transport.type == "grpc":
        wire.keep_message_memory()  # before the engine allocates anything
    engine = build_engine(spec)
    metrics = RolloutMetrics(transports=[spec.weight_transport.type])
    servicer = build_servicer(spec, engine, metrics)

    async def warmup() -> None:
        await engine.start()
        root = shared_weights_root(spec)
        latest = weights.latest_weights_dir(root) if root else None
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
    registration = ServiceRegistration(servicer, add_rollout_service, SERVICE_NAME)
    server = GrpcServer(options, [registration], warmup=warmup, metrics=metrics)
    servicer.on_health = health_reporter(server)
    try:
        server.handle_signals()  # before it serves: a SIGTERM is never lost
        async with server:
            await server.serve_until_signal()
    finally:
        await engine.close()
