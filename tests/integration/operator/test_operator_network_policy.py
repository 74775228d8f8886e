"""A run's NetworkPolicies (``networkPolicy``), with the real operator (kopf) against the emulated
API server: emitted with the run's selectors and ports, valid Kubernetes, owned by the run, and
switched on and off without restarting a pod."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
from operator_harness import DEPLOYMENTS, POLICIES, STATEFULSETS, Cluster

pytestmark = pytest.mark.timeout(180)

K8S_VERSION = "1.30.0"
RUN = {"aflowrl.io/run": "net"}
PROMETHEUS = {
    "namespaceLabels": {"kubernetes.io/metadata.name": "monitoring"},
    "podLabels": {"app.kubernetes.io/name": "prometheus"},
}
SPEC: dict = {
    "environment": {"replicas": {"min": 1, "max": 2}, "port": 50061},
    "rollout": {"port": 50062},
    "learner": {"port": 50063},
    "monitoring": {"metricsPort": 9191},
    "networkPolicy": {
        "enabled": True,
        "metricsFrom": [PROMETHEUS],
        "grpcFrom": [{"podLabels": {"role": "debug"}}],
        "namespaceDeniesEgress": True,
    },
}


def _templates(cluster: Cluster) -> list[dict]:
    return [
        cluster.child(kind, f"net-{name}")["spec"]["template"]  # type: ignore[index]
        for kind, name in (
            (DEPLOYMENTS, "rollout"),
            (DEPLOYMENTS, "env"),
            (STATEFULSETS, "learner"),
        )
    ]


async def test_a_run_gets_network_policies_with_its_selectors_and_ports(cluster: Cluster):
    created = await cluster.create_run("net", SPEC)
    ingress = await cluster.eventually(lambda: cluster.child(POLICIES, "net-ingress"))
    egress = await cluster.eventually(lambda: cluster.child(POLICIES, "net-egress"))
    for policy in (ingress, egress):
        kubernetes_validate.validate(copy.deepcopy(policy), K8S_VERSION, strict=True)
        (owner,) = policy["metadata"]["ownerReferences"]
        assert owner["uid"] == created["metadata"]["uid"] and owner["controller"]

    # Ingress: every pod of the run, from the run's pods on every port, the metrics port from
    # Prometheus' pods in the monitoring namespace, the three gRPC ports from debug pods of
    # the run's namespace (no namespaceSelector); nothing else.
    spec = ingress["spec"]
    assert spec["podSelector"] == {"matchLabels": RUN}
    assert spec["policyTypes"] == ["Ingress"]
    intra, metrics, grpc = spec["ingress"]
    assert intra == {"from": [{"podSelector": {"matchLabels": RUN}}]}  # no ports: all of them
    assert metrics == {
        "from": [
            {
                "podSelector": {"matchLabels": PROMETHEUS["podLabels"]},
                "namespaceSelector": {"matchLabels": PROMETHEUS["namespaceLabels"]},
            }
        ],
        "ports": [{"protocol": "TCP", "port": 9191}],
    }
    assert grpc == {
        "from": [{"podSelector": {"matchLabels": {"role": "debug"}}}],
        "ports": [{"protocol": "TCP", "port": p} for p in (50061, 50062, 50063)],
    }

    # Egress (the namespace denies it): every pod of the run but the environment's, which keep
    # their own policy (DNS and the executor only), to the run's pods, DNS and the API server.
    spec = egress["spec"]
    assert spec["podSelector"] == {
        "matchLabels": RUN,
        "matchExpressions": [
            {"key": "app.kubernetes.io/component", "operator": "NotIn", "values": ["environment"]}
        ],
    }
    assert spec["policyTypes"] == ["Egress"]
    intra, dns, api = spec["egress"]
    assert intra == {"to": [{"podSelector": {"matchLabels": RUN}}]}
    assert {p["port"] for p in dns["ports"]} == {53} and "to" not in dns
    assert {p["port"] for p in api["ports"]} == {443, 6443}
    env_egress = cluster.child(POLICIES, "net-env-egress")
    assert env_egress is not None
    assert env_egress["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == (
        "environment"
    )


async def test_network_policies_come_and_go_without_restarting_a_pod(cluster: Cluster):
    off = {**SPEC, "networkPolicy": {"enabled": False}}
    await cluster.create_run("net", off)
    await cluster.eventually(lambda: cluster.child(STATEFULSETS, "net-learner"))
    await cluster.settle()
    assert cluster.child(POLICIES, "net-ingress") is None
    before = _templates(cluster)

    await cluster.patch_spec("net", {"networkPolicy": SPEC["networkPolicy"]})
    await cluster.eventually(lambda: cluster.child(POLICIES, "net-egress"), what="the policies")
    assert _templates(cluster) == before

    await cluster.patch_spec("net", {"networkPolicy": {"enabled": False}})
    await cluster.eventually(
        lambda: (
            cluster.child(POLICIES, "net-ingress") is None
            and cluster.child(POLICIES, "net-egress") is None
        ),
        what="the policies deleted",
    )
    assert _templates(cluster) == before
