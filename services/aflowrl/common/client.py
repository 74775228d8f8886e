"""gRPC channels for callers of aflow-rl services: deadlines, retries, load balancing, auth.

``make_channel`` builds an ``aio.Channel`` whose service config

- balances round-robin over every address behind the target: a headless Kubernetes Service name
  (``dns:///run-env.ns.svc:50051`` resolves to all pod IPs) or a list of ``host:port``;
- sets a default deadline per call;
- retries, with exponential backoff, only the methods declared idempotent (a retried Train would
  train twice), and only on UNAVAILABLE and RESOURCE_EXHAUSTED.

Every call carries an ``x-request-id`` (and the bearer token when one is configured). Channels
ping idle connections by the shared :data:`aflowrl.common.keepalive.KEEPALIVE` policy, which the
servers admit, and speak TLS when :attr:`ChannelOptions.tls` is set (:mod:`aflowrl.common.tls`).
:meth:`ChannelOptions.from_spec` is how every caller of a run's services builds its options.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from aflowrl import envs
from aflowrl.common import tls as tls_
from aflowrl.common.interceptors import AUTHORIZATION_KEY, REQUEST_ID_KEY
from aflowrl.common.keepalive import KEEPALIVE, Keepalive
from aflowrl.config.monitoring import GrpcSpec
from aflowrl.errors import (
    AflowRLError,
    CorruptStateError,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidInputError,
    NotFoundError,
    OverloadedError,
    PermanentError,
    UnavailableError,
)

MIB = 1024 * 1024

IDEMPOTENT_METHODS: Mapping[str, tuple[str, ...]] = {
    # Step is idempotent by design: the caller carries the state and the cache makes a retry free.
    "aflowrl.v1.EnvironmentService": ("Reset", "Step", "Project", "Evaluate", "Info"),
    "aflowrl.v1.RolloutService": ("Generate", "ScoreCandidates", "Status"),
    "aflowrl.v1.LearnerService": ("ComputeLogProbs", "LoadCheckpoint", "Status"),
}
"""Methods safe to retry. Train, UpdateWeights, LoadWeights, SaveCheckpoint and the weight
streams are not: a retry would repeat an effect or is refused as stale."""


@dataclass(frozen=True)
class ChannelOptions:
    """How a client talks to a service."""

    timeout_s: float | None = 60.0
    """Default deadline of every call (seconds); None: no deadline unless the call sets one."""
    max_attempts: int = 5
    """Attempts of an idempotent call (1 disables retries)."""
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    backoff_multiplier: float = 2.0
    retryable_codes: tuple[str, ...] = ("UNAVAILABLE", "RESOURCE_EXHAUSTED")
    max_message_bytes: int = 64 * MIB
    round_robin: bool = True
    auth_token: str | None = field(default=None, repr=False)
    tls: tls_.ClientTls | None = None
    """TLS (CA, client certificate for mTLS, server name); None: plaintext."""
    keepalive: Keepalive = KEEPALIVE
    """Ping policy; the servers' must admit it (tests pair other values)."""
    idempotent_methods: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: IDEMPOTENT_METHODS
    )

    @classmethod
    def from_spec(cls, grpc_spec: GrpcSpec, *, timeout_s: float | None) -> ChannelOptions:
        """Options of a run's client: message size and TLS from the spec, the bearer token and
        certificates from the mounted Secrets (``AFLOWRL_AUTH_TOKEN_FILE``, ``AFLOWRL_TLS_DIR``).
        """
        return cls(
            timeout_s=timeout_s,
            max_message_bytes=grpc_spec.max_message_mib * MIB,
            auth_token=envs.AFLOWRL_AUTH_TOKEN,
            tls=tls_.client_tls_from_spec(grpc_spec),
        )


def target_for(addresses: str | Sequence[str]) -> str:
    """A gRPC target for one ``host:port`` / URI, or for several ``ip:port`` addresses."""
    if isinstance(addresses, str):
        if "://" in addresses or addresses.startswith(("dns:", "ipv4:", "ipv6:", "unix:")):
            return addresses
        return f"dns:///{addresses}"
    if len(addresses) == 1:
        return target_for(addresses[0])
    return "ipv4:" + ",".join(addresses)


def target_host(target: str) -> str | None:
    """The DNS name a target resolves (``dns:///h:p``, ``h:p``); None for IP addresses and lists.

    Channels to the pod IPs behind a headless Service verify the server certificate against
    this name (:func:`make_channel`'s ``server_name``).
    """
    if target.startswith(("ipv4:", "ipv6:", "unix:")):
        return None
    address = target.removeprefix("dns:").lstrip("/")
    if "/" in address:  # dns://authority/host:port
        address = address.rsplit("/", 1)[1]
    host = address.rsplit(":", 1)[0] if address.count(":") == 1 else address
    host = host.strip("[]")
    if not host or all(c.isdigit() or c in ".:" for c in host):
        return None
    return host


def service_config(options: ChannelOptions) -> dict[str, Any]:
    """The gRPC service config (JSON) implementing ``options``."""
    method_configs: list[dict[str, Any]] = []
    timeout = f"{options.timeout_s:.3f}s" if options.timeout_s else None
    retry = {
        "maxAttempts": max(2, min(options.max_attempts, 5)),
        "initialBackoff": f"{options.initial_backoff_s:.3f}s",
        "maxBackoff": f"{options.max_backoff_s:.3f}s",
        "backoffMultiplier": options.backoff_multiplier,
        "retryableStatusCodes": list(options.retryable_codes),
    }
    idempotent = [
        {"service": service, "method": method}
        for service, methods in options.idempotent_methods.items()
        for method in methods
    ]
    if idempotent and options.max_attempts > 1:
        entry: dict[str, Any] = {"name": idempotent, "retryPolicy": retry}
        if timeout:
            entry["timeout"] = timeout
        method_configs.append(entry)
    if timeout:
        # Everything else: a deadline, no retries ({} with only "service" matches all methods).
        method_configs.append(
            {"name": [{"service": s} for s in options.idempotent_methods], "timeout": timeout}
        )
    config: dict[str, Any] = {"methodConfig": method_configs}
    if options.round_robin:
        config["loadBalancingConfig"] = [{"round_robin": {}}]
    return config


class _MetadataInterceptor(
    aio.UnaryUnaryClientInterceptor,
    aio.UnaryStreamClientInterceptor,
    aio.StreamUnaryClientInterceptor,
    aio.StreamStreamClientInterceptor,
):
    """Adds ``x-request-id`` (unless the caller set one) and the bearer token to every call."""

    def __init__(self, auth_token: str | None) -> None:
        self._auth = f"Bearer {auth_token}" if auth_token else None

    def _details(self, details: aio.ClientCallDetails) -> aio.ClientCallDetails:
        items: list[tuple[str, str | bytes]] = list(details.metadata or ())
        keys = {key for key, _ in items}
        if REQUEST_ID_KEY not in keys:
            items.append((REQUEST_ID_KEY, uuid.uuid4().hex[:16]))
        if self._auth and AUTHORIZATION_KEY not in keys:
            items.append((AUTHORIZATION_KEY, self._auth))
        metadata = aio.Metadata(*items)
        return aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request)

    async def intercept_unary_stream(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request)

    async def intercept_stream_unary(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)

    async def intercept_stream_stream(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)


def make_channel(
    addresses: str | Sequence[str],
    options: ChannelOptions | None = None,
    *,
    server_name: str | None = None,
) -> aio.Channel:
    """An asyncio channel to ``addresses`` configured by ``options`` (see module docstring).

    With TLS, the server certificate is verified against ``options.tls.server_name`` (the
    spec's ``grpc.tlsServerName``), else ``server_name`` (the Service name that ``addresses``
    were resolved from), else the host dialled.
    """
    options = options or ChannelOptions()
    channel_args: list[tuple[str, str | int]] = [
        ("grpc.max_send_message_length", options.max_message_bytes),
        ("grpc.max_receive_message_length", options.max_message_bytes),
        ("grpc.service_config", json.dumps(service_config(options))),
        ("grpc.enable_retries", 1),
        *options.keepalive.client_args(),
    ]
    target = target_for(addresses)
    interceptors = [_MetadataInterceptor(options.auth_token)]
    if options.tls is None:
        return aio.insecure_channel(target, options=channel_args, interceptors=interceptors)
    tls = options.tls.current().for_server(server_name)  # a rotated Secret's files
    if tls.server_name is not None:
        channel_args.append(("grpc.ssl_target_name_override", tls.server_name))
    return aio.secure_channel(
        target, tls.credentials(), options=channel_args, interceptors=interceptors
    )


_TLS_FAILURES = (
    # (text in a failed connection's details, what it means); none heals by waiting.
    (
        "CERTIFICATE_VERIFY_FAILED",
        "the server's certificate is not signed by the CA this client trusts (ca.crt of "
        "AFLOWRL_TLS_DIR)",
    ),
    (
        "Hostname Verification",
        "the server's certificate does not name the host dialled: give it that DNS name as a "
        "SAN, or set grpc.tlsServerName to a name it has",
    ),
    (
        "WRONG_VERSION_NUMBER",
        "this client speaks TLS and the server plaintext: give the server AFLOWRL_TLS_DIR too "
        "(grpc.tlsSecret in a cluster)",
    ),
)


def explain_failure(exc: aio.AioRpcError, tls: tls_.ClientTls | None) -> tuple[str, bool]:
    """A failed call's status and details, with what a TLS mismatch usually means, and
    whether waiting can help (False for a certificate the client will never accept)."""
    details = exc.details() or ""
    message = f"{exc.code().name}: {details}"
    for text, meaning in _TLS_FAILURES:
        if text in details:
            return f"{message} ({meaning})", False
    if "Socket closed" in details or "Connection reset" in details:
        # What a TLS server does to a plaintext client, or an mTLS server to a client with no
        # certificate: indistinguishable from a server restarting, so keep waiting.
        if tls is None:
            return f"{message} (if the server uses TLS, set AFLOWRL_TLS_DIR here too)", True
        if tls.certificate_chain is None:
            return f"{message} (if the server requires mutual TLS, set grpc.mtls here too)", True
    return message, True


async def wait_until_serving(
    channel: aio.Channel,
    service: str = "",
    timeout_s: float = 60.0,
    *,
    tls: tls_.ClientTls | None = None,
) -> None:
    """Poll the health service until ``service`` is SERVING.

    Raises :class:`DeadlineExceededError` after ``timeout_s`` (the last status in the message),
    or :class:`PermanentError` at once when the server's certificate is refused (``tls`` is
    the channel's TLS, for the explanation).
    """
    stub = health_pb2_grpc.HealthStub(channel)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last = "no answer"
    delay = 0.05
    refused = 0
    while loop.time() < deadline:
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2.0)
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
            last = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            refused = 0
        except aio.AioRpcError as exc:
            last, transient = explain_failure(exc, tls)
            refused = 0 if transient else refused + 1
            if refused >= 3:  # seen thrice in a row: not a server still starting
                raise PermanentError(f"service {service or '(server)'}: {last}") from None
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)
    raise DeadlineExceededError(
        f"service {service or '(server)'} not SERVING after {timeout_s:.0f}s ({last})"
    )


def error_from_rpc(exc: aio.AioRpcError, what: str) -> AflowRLError:
    """The domain error matching a failed call's status, for ``raise ... from exc``.

    Callers branch on the type (``.retryable``) rather than on status codes.
    """
    code = exc.code()
    message = f"{what}: {code.name}: {exc.details()}"
    kinds: dict[grpc.StatusCode, type[AflowRLError]] = {
        grpc.StatusCode.UNAVAILABLE: UnavailableError,
        grpc.StatusCode.RESOURCE_EXHAUSTED: OverloadedError,
        grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
        grpc.StatusCode.INVALID_ARGUMENT: InvalidInputError,
        grpc.StatusCode.NOT_FOUND: NotFoundError,
        grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
        grpc.StatusCode.DATA_LOSS: CorruptStateError,
    }
    return kinds.get(code, PermanentError)(message)
