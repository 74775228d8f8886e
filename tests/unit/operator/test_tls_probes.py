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


def _probes(document: dict) -> dict[str, dict[str, dict]]:
    """Each probed container's gRPC probes (``grpc`` part), by container name."""
    spec = RunSpec.from_document(document)
    found: dict[str, dict[str, dict]] = {}
    for manifest in children.full_manifests(RUN, spec, RUNNING, monitoring_api=False):
        body = manifest.get("spec", {})
        # A Deployment's or StatefulSet's pods, or a LeaderWorkerSet's leader.
        template = body.get("template") or body.get("leaderWorkerTemplate", {}).get(
            "leaderTemplate"
        )
        for container in template["spec"]["containers"] if template else ():
            grpc_probes = {
                p: container[p]["grpc"] for p in PROBES if "grpc" in container.get(p, {})
            }
            if grpc_probes:
                found[container["name"]] = grpc_probes
    return found


def test_a_rollout_replica_is_ready_by_its_service_and_alive_by_the_overall_health():
    """The rollout's readiness probe reads the rollout service's health (NOT_SERVING while it
    waits for a complete weight version), its startup and liveness probes the overall health
    (NOT_SERVING only for a dead engine): a long reload never restarts the pod. Single-node
    replicas (a Deployment) and multi-node ones (a LeaderWorkerSet leader) alike."""
    from aflowrl.rollout.service import SERVICE_NAME

    multi_node = {
        "rollout": {
            "engine": "vllm",
            "nodesPerReplica": 2,
            "resources": {"gpus": 8},
            "vllm": {"tensorParallelSize": 16},
        }
    }
    for document in ({}, multi_node):
        rollout = _probes(document)["rollout"]
        assert rollout["readinessProbe"].get("service") == SERVICE_NAME, document
        assert "service" not in rollout["livenessProbe"], document
        assert "service" not in rollout["startupProbe"], document
    for name, probes in _probes({}).items():
        if name != "rollout":
            assert all("service" not in probe for probe in probes.values()), name
