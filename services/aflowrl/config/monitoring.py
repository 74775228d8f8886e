"""Metrics, logs and gRPC transport settings shared by every service of a run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from aflowrl.config._base import (
    CelRule,
    DnsSubdomain,
    FieldRuleError,
    LabelKey,
    LabelValue,
    Port,
    SpecModel,
)
from aflowrl.config.resources import SecretKeyRef


class ServiceMonitorSpec(SpecModel):
    """Prometheus-operator scraping of the run's pods."""

    enabled: bool = False
    """Create a PodMonitor for the run (needs the monitoring.coreos.com API)."""
    interval: str = Field(default="15s", pattern=r"^[0-9]+(ms|s|m|h)$", max_length=16)
    """Scrape interval (e.g. "15s")."""
    additional_labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=32)
    """Labels your Prometheus selects monitors by (e.g. ``release: prometheus``)."""


LoggerName = Literal["console", "tensorboard", "wandb", "mlflow"]
"""An experiment tracker the trainer sends each iteration's scalars to."""

DEFAULT_LOGGERS: tuple[LoggerName, ...] = ("console", "tensorboard")
"""The trackers of a run that names none: the log and TensorBoard's event files."""

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\- ]*$"


class TensorBoardSpec(SpecModel):
    """TensorBoard event files (logger ``tensorboard``)."""

    dir: str | None = Field(default=None, min_length=1, max_length=1024)
    """Directory of the event files; empty: ``tensorboard/`` in the run directory
    (``trainer.checkpointDir`` on a cluster, the run's volume). Open it with
    ``tensorboard --logdir DIR``."""
    flush_s: float = Field(default=10.0, ge=0.1, le=3600.0)
    """Seconds between writes of buffered events to disk (every iteration is flushed too)."""


class WandbSpec(SpecModel):
    """Weights & Biases (logger ``wandb``; needs the ``tracking`` extra). The API key is read
    from ``WANDB_API_KEY`` (or the file named by ``WANDB_API_KEY_FILE``), set from
    ``apiKeySecret`` in the trainer pod; it is never part of the run document, and never
    logged."""

    project: str = Field(default="aflow-rl", min_length=1, max_length=128, pattern=_NAME)
    """W&B project of the run."""
    entity: str | None = Field(default=None, min_length=1, max_length=128, pattern=_NAME)
    """W&B team or user; empty: the API key's default entity."""
    mode: Literal["online", "offline"] = "online"
    """"online" streams to the W&B server; "offline" writes the run under ``dir`` only, with no
    network (upload it later with ``wandb sync DIR/wandb/offline-run-*``)."""
    dir: str | None = Field(default=None, min_length=1, max_length=1024)
    """Directory W&B writes ``wandb/`` into; empty: the run directory."""
    name: str | None = Field(default=None, min_length=1, max_length=128)
    """Display name of the W&B run; empty: the TrainingRun's name (or the run directory's)."""
    tags: list[str] = Field(default_factory=list, max_length=16)
    """Tags of the W&B run (at most 16)."""
    api_key_secret: SecretKeyRef | None = None
    """Secret holding the W&B API key, given to the trainer pod as ``WANDB_API_KEY``
    (Kubernetes; locally, set ``WANDB_API_KEY`` yourself). Mode online needs one."""


class MlflowSpec(SpecModel):
    """MLflow (logger ``mlflow``; needs the ``tracking`` extra)."""

    tracking_uri: str | None = Field(default=None, min_length=1, max_length=1024)
    """MLflow tracking URI: a server (``http://mlflow:5000``), a database or a file store
    (``file:/path/mlruns``); empty: the file store ``mlruns/`` in the run directory. A server's
    credentials come from the ``MLFLOW_TRACKING_*`` environment variables."""
    experiment: str = Field(default="aflow-rl", min_length=1, max_length=256)
    """MLflow experiment the run is logged under (created when missing)."""
    run_name: str | None = Field(default=None, min_length=1, max_length=256)
    """Name of the MLflow run; empty: the TrainingRun's name (or the run directory's)."""


class MonitoringSpec(SpecModel):
    """Prometheus metrics, logging and experiment tracking."""

    metrics_port: Port = 9090
    """HTTP port of ``/metrics`` on every service pod."""
    service_monitor: ServiceMonitorSpec = Field(default_factory=ServiceMonitorSpec)
    """Prometheus-operator integration."""
    log_format: Literal["text", "json"] = "text"
    """Log line format; "json" suits log collectors in pods."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Least severe level logged."""
    loggers: list[LoggerName] = Field(default_factory=lambda: list(DEFAULT_LOGGERS), max_length=4)
    """Experiment trackers the trainer sends each iteration's scalars to (the keys of
    ``metrics.jsonl``): "console" (a log line of the update diagnostics per iteration),
    "tensorboard" (event files in the run directory), "wandb" and "mlflow" (the ``tracking``
    extra: ``pip install 'aflow-rl[tracking]'``). Each at most once; empty: ``metrics.jsonl``
    and ``curves.png`` only."""
    tensorboard: TensorBoardSpec = Field(default_factory=TensorBoardSpec)
    """TensorBoard settings (used when ``loggers`` has "tensorboard")."""
    wandb: WandbSpec = Field(default_factory=WandbSpec)
    """Weights & Biases settings (used when ``loggers`` has "wandb")."""
    mlflow: MlflowSpec = Field(default_factory=MlflowSpec)
    """MLflow settings (used when ``loggers`` has "mlflow")."""

    cel_rules = (
        CelRule(
            "{loggers}.all(x, {loggers}.exists_one(y, y == x))",
            "loggers lists a logger more than once",
            "loggers",
        ),
    )

    @model_validator(mode="after")
    def _loggers_once(self) -> MonitoringSpec:
        twice = sorted({name for name in self.loggers if self.loggers.count(name) > 1})
        if twice:
            raise FieldRuleError("loggers", f"loggers lists {', '.join(twice)} more than once")
        return self


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
