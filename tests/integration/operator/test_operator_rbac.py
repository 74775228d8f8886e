"""The operator under the chart's own RBAC, enforced by the emulated API server (every operator
test runs so): a request the chart does not grant is refused with 403, and a refused request on
one child never blocks the rest of the pass (the Workload sync and the status write happen; the
refusal is a ``Degraded`` condition with reason ``Forbidden`` and one Event)."""

from __future__ import annotations

import pytest
from operator_harness import (
    NAMESPACE,
    POLICIES,
    QUEUE,
    WORKLOADS,
    Cluster,
    admit,
    admitted_status,
    events,
    finish,
)

pytestmark = pytest.mark.timeout(240)

SPEC: dict = {
    "environment": {"replicas": {"min": 1, "max": 2}},
    "networkPolicy": {"enabled": True},
}


async def test_the_emulator_refuses_what_the_chart_does_not_grant_with_a_status(
    cluster: Cluster,
):
    policy = cluster.emulator.policy
    assert policy is not None
    assert policy.allows("delete", "networking.k8s.io", "networkpolicies", NAMESPACE)
    assert not policy.allows("delete", "", "pods", NAMESPACE)  # the chart never deletes pods
    assert not policy.allows("get", "", "pods/log", NAMESPACE)
    assert not policy.allows("deletecollection", "apps", "deployments", NAMESPACE)
    narrower = policy.without("delete", "networking.k8s.io", "networkpolicies")
    assert not narrower.allows("delete", "networking.k8s.io", "networkpolicies", NAMESPACE)
    assert narrower.allows("patch", "networking.k8s.io", "networkpolicies", NAMESPACE)

    # A refusal is the API server's Status object, for the operator's requests only.
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/nothing"
    headers = {"User-Agent": "aflowrl-operator/test"}
    async with cluster.server.client.delete(path, headers=headers) as response:
        assert response.status == 403
        body = await response.json()
    assert body["kind"] == "Status" and body["reason"] == "Forbidden" and body["code"] == 403
    assert 'cannot delete resource "pods" in API group ""' in body["message"]
    assert body["details"]["kind"] == "pods"
    assert cluster.emulator.count_refused("delete", "pods") == 1
    async with cluster.server.client.delete(path) as response:  # a test's own request
        assert response.status == 404


async def test_turning_network_policies_off_deletes_them_under_the_charts_rbac(
    cluster: Cluster,
):
    await cluster.create_run("net", SPEC)
    await cluster.eventually(lambda: cluster.child(POLICIES, "net-ingress"), what="policies")
    await cluster.patch_spec("net", {"networkPolicy": {"enabled": False}})
    await cluster.eventually(
        lambda: cluster.child(POLICIES, "net-ingress") is None, what="the policies deleted"
    )
    await cluster.settle()
    assert cluster.emulator.refused == []
    assert cluster.condition("net", "Degraded")["status"] == "False"


async def test_a_refused_delete_never_blocks_the_workload_sync_or_the_status_write(
    cluster: Cluster,
):
    """A role without ``delete`` on NetworkPolicies (an older chart): turning them off is
    refused, and the run still finishes: its Workload is marked Finished and its status
    written, with the refusal as ``Degraded=True (Forbidden)`` and one Warning Event."""
    policy = cluster.emulator.policy
    assert policy is not None
    cluster.emulator.policy = policy.without("delete", "networking.k8s.io", "networkpolicies")
    await cluster.create_run("demo", SPEC, labels=QUEUE)
    await cluster.eventually(lambda: cluster.child(WORKLOADS, "demo-kueue"), what="Workload")
    await admit(cluster, admitted_status())
    await cluster.eventually(lambda: cluster.child(POLICIES, "demo-ingress"), what="policies")

    await cluster.patch_spec("demo", {"networkPolicy": {"enabled": False}})
    degraded = await cluster.wait_condition("demo", "Degraded", status="True", reason="Forbidden")
    assert "delete NetworkPolicy demo-ingress refused" in degraded["message"]
    assert 'cannot delete resource "networkpolicies"' in degraded["message"]
    assert cluster.child(POLICIES, "demo-ingress") is not None  # refused, so still there
    generation = cluster.run("demo")["metadata"]["generation"]
    assert cluster.run("demo")["status"]["observedGeneration"] == generation

    # The run finishes while the refusal lasts: the Workload still gets Finished.
    await finish(cluster)
    await cluster.settle()
    assert cluster.emulator.count_refused("delete", "networkpolicies") >= 2  # every pass tries
    # One Event per condition that turned Forbidden (Degraded, and Ready, which says why it
    # is not), not one per pass.
    forbidden = sorted(e["message"].split(":")[0] for e in events(cluster, "Forbidden"))
    assert forbidden == ["Degraded is True", "Ready is False"]
    assert all(e["type"] == "Warning" for e in events(cluster, "Forbidden"))
    await cluster.settle()
    assert len(events(cluster, "Forbidden")) == 2
    assert cluster.condition("demo", "Degraded")["reason"] == "Forbidden"
