"""With gRPC TLS, the kubelet's probes go to the plaintext health-only port; without, to gRPC."""

from __future__ import annotations

from aflowrl.config import RunSpec
from aflowrl_operator import children
from aflowrl_operator.names import RunRef

RUN = RunRef(name="demo", namespace="team-a", uid="0a1b2c")
RUNNING = children.Scale(services=True, environment_replicas=1, trainer_suspended=False)
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def _probed_ports(document: dict) -> dict[str, set[int]]:
    """The port each probed container's probes use, by container name."""
    spec = RunSpec.from_document(document)
    ports: dict[str, set[int]] = {}
    for manifest in children.full_manifests(RUN, spec, RUNNING, monitoring_api=False):
        template = manifest.get("spec", {}).get("template")
        for container in template["spec"]["containers"] if template else ():
            probes = [container[p] for p in PROBES if p in container]
            if probes and all("grpc" in probe for probe in probes):
                ports[container["name"]] = {probe["grpc"]["port"] for probe in probes}
    return ports


def test_probes_use_the_grpc_port_without_tls():
    spec = RunSpec.from_document({})
    assert _probed_ports({}) == {
        "environment": {spec.environment.port},
        "rollout": {spec.rollout.port},
        "learner": {spec.learner.port},
    }


def test_probes_use_the_health_port_with_tls():
    document = {"grpc": {"tlsSecret": "grpc-tls", "mtls": True, "healthPort": 8086}}
    assert _probed_ports(document) == {
        "environment": {8086},
        "rollout": {8086},
        "learner": {8086},
    }
