"""Metrics, logs and gRPC transport settings shared by every service of a run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from aflowrl.config._base import DnsSubdomain, LabelKey, LabelValue, Port, SpecModel
from aflowrl.config.resources import SecretKeyRef


class ServiceMonitorSpec(SpecModel):
    """Prometheus-operator scraping of the run's pods."""

    enabled: bool = False
    """Create a PodMonitor for the run (needs the monitoring.coreos.com API)."""
    interval: str = Field(default="15s", pattern=r"^[0-9]+(ms|s|m|h)$", max_length=16)
    """Scrape interval (e.g. "15s")."""
    additional_labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=32)
    """Labels your Prometheus selects monitors by (e.g. ``release: prometheus``)."""


class MonitoringSpec(SpecModel):
    """Prometheus metrics and logging."""

    metrics_port: Port = 9090
    """HTTP port of ``/metrics`` on every service pod."""
    service_monitor: ServiceMonitorSpec = Field(default_factory=ServiceMonitorSpec)
    """Prometheus-operator integration."""
    log_format: Literal["text", "json"] = "text"
    """Log line format; "json" suits log collectors in pods."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Least severe level logged."""


class GrpcSpec(SpecModel):
    """Limits and security of the gRPC links between the run's components."""

    max_message_mib: int = Field(default=64, ge=1, le=2047)
    """Largest gRPC message sent or received (MiB)."""
    shutdown_grace_s: float = Field(default=20.0, ge=0.0, le=3600.0)
    """Seconds in-flight calls get to finish on SIGTERM (keep below the pod's termination grace)."""
    tls_secret: DnsSubdomain | None = None
    """kubernetes.io/tls Secret (keys tls.crt, tls.key, ca.crt) mounted in every pod: servers
    present tls.crt, clients verify servers with ca.crt; empty: plaintext. Its certificate needs
    DNS names for the Services the trainer dials (``<run>-env.<namespace>.svc``,
    ``<run>-rollout.<namespace>.svc``, ``*.<run>-learner.<namespace>.svc``) or the one name set
    in ``tlsServerName``. Locally, ``AFLOWRL_TLS_DIR`` names such a directory instead."""
    mtls: bool = False
    """Mutual TLS: servers require a client certificate signed by the Secret's ca.crt, and
    clients present the Secret's tls.crt (issue it with both server and client auth usages).
    Needs TLS (``tlsSecret``, or ``AFLOWRL_TLS_DIR`` locally)."""
    tls_server_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
    )
    """Name every client verifies on every server's certificate, whatever address it dials;
    empty: the Service DNS name dialled (the host of the target, also for the pod IPs resolved
    from a headless Service)."""
    health_port: Port = 50050
    """With TLS on: plaintext port serving only the gRPC health service, for the kubelet's
    ``grpc:`` probes (which cannot speak TLS); nothing else is served on it."""
    auth_token_secret: SecretKeyRef | None = None
    """Secret with a shared bearer token every call must carry; empty: no token."""
    max_concurrent_rpcs: int = Field(default=1024, ge=1, le=100000)
    """Calls a server handles at once; more are refused with RESOURCE_EXHAUSTED (or, in a
    burst, CANCELLED). The trainer keeps at most half of it in flight to each environment
    replica."""
