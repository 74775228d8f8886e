"""Who may reach a run's pods on a cluster: the run's NetworkPolicies (``networkPolicy``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from aflowrl.config._base import LabelKey, LabelValue, SpecModel

Labels = Annotated[dict[LabelKey, LabelValue], Field(max_length=32)]
"""Labels a peer's pods or namespaces must carry (a ``matchLabels`` selector)."""


class NetworkPeer(SpecModel):
    """Pods allowed to connect: those carrying ``podLabels`` in the namespaces carrying
    ``namespaceLabels`` (a NetworkPolicy peer with both selectors)."""

    namespace_labels: Labels | None = None
    """Labels of the peers' namespaces (``kubernetes.io/metadata.name: monitoring`` names one
    namespace); ``{}``: every namespace; not set: the run's namespace only."""
    pod_labels: Labels = Field(default_factory=dict)
    """Labels of the peer pods (e.g. ``app.kubernetes.io/name: prometheus``); ``{}``: every pod
    of those namespaces."""


class NetworkPolicySpec(SpecModel):
    """The run's NetworkPolicies (needs a network plugin that enforces them).

    Enabled, every pod of the run accepts connections from the run's own pods on every port
    (NCCL's ephemeral ports, torchrun's c10d rendezvous, weight sync, gRPC, the served executor)
    and, from outside the run, only the metrics port from ``metricsFrom`` and the gRPC ports from
    ``grpcFrom``. The kubelet's probes are never blocked (node traffic always passes). Off by
    default: a policy that selects the run's pods refuses every other connection, and a
    Prometheus outside the run's namespace must then be listed in ``metricsFrom`` first.
    """

    enabled: bool = False
    """Create the ``<run>-ingress`` NetworkPolicy (and ``<run>-egress`` with
    ``namespaceDeniesEgress``)."""
    metrics_from: list[NetworkPeer] = Field(default_factory=list, max_length=16)
    """Who may scrape the metrics port (your Prometheus); empty: no one outside the run."""
    grpc_from: list[NetworkPeer] = Field(default_factory=list, max_length=16)
    """Who may call the rollout, learner and environment gRPC ports from outside the run (a
    debugging client, grpcurl); empty: no one (the trainer is inside the run)."""
    namespace_denies_egress: bool = False
    """Set where the namespace has a default-deny egress policy: the run then adds
    ``<run>-egress``, letting its pods (environment pods aside, which keep their own egress
    policy) reach each other on every port, DNS, and, for the trainer, the API server (TCP 443
    and 6443 at any address: a NetworkPolicy cannot name it). Leave it off elsewhere: an egress
    policy cuts the pods' other egress (a model download from a hub, for one)."""
