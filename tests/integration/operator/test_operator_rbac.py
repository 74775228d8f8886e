"""The operator under the chart's own RBAC, enforced by the emulated API server (every operator
test runs so): a request the chart does not grant is refused with 403, and a refused request on
one child never blocks the rest of the pass (the Workload sync and the status write happen; the
refusal is a ``Degraded`` condition with reason ``Forbidden`` and one Event)."""

from __future__ import annotations

from typing import Any

import pytest
from operator_harness import NAMESPACE, Cluster

pytestmark = pytest.mark.timeout(240)

POLICIES = "networking.k8s.io/v1/networkpolicies"
DEPLOYMENTS = "apps/v1/deployments"
STATEFULSETS = "apps/v1/statefulsets"
JOBS = "batch/v1/jobs"
WORKLOADS = "kueue.x-k8s.io/v1beta2/workloads"
QUEUE = {"kueue.x-k8s.io/queue-name": "team-a"}
SPEC: dict = {
    "environment": {"replicas": {"min": 1, "max": 2}},
    "networkPolicy": {"enabled": True},
}
POD_SETS = ("rollout", "learner", "environment", "trainer")


def _cond(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == type_), {})


def _events(cluster: Cluster, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.emulator.all("v1/events", NAMESPACE) if e["reason"] == reason]


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
    await cluster.emulator.set_status(
        WORKLOADS,
        NAMESPACE,
        "demo-kueue",
        {
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                {"type": "Admitted", "status": "True", "reason": "Admitted"},
            ],
            "admission": {
                "clusterQueue": "gpu",
                "podSetAssignments": [{"name": n, "count": 1} for n in POD_SETS],
            },
        },
    )
    await cluster.eventually(
        lambda: cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is False, what="admitted"
    )
    await cluster.eventually(lambda: cluster.child(POLICIES, "demo-ingress"), what="policies")

    await cluster.patch_spec("demo", {"networkPolicy": {"enabled": False}})
    degraded = await cluster.wait_condition("demo", "Degraded", status="True", reason="Forbidden")
    assert "delete NetworkPolicy demo-ingress refused" in degraded["message"]
    assert 'cannot delete resource "networkpolicies"' in degraded["message"]
    assert cluster.child(POLICIES, "demo-ingress") is not None  # refused, so still there
    generation = cluster.run("demo")["metadata"]["generation"]
    assert cluster.run("demo")["status"]["observedGeneration"] == generation

    # The run finishes while the refusal lasts: the Workload still gets Finished.
    complete = {"conditions": [{"type": "Complete", "status": "True"}], "active": 0}
    await cluster.emulator.set_status(JOBS, NAMESPACE, "demo-trainer", complete)
    await cluster.eventually(
        lambda: (
            _cond(cluster.child(WORKLOADS, "demo-kueue"), "Finished").get("reason") == "Succeeded"
        ),
        what="the Workload Finished",
    )
    await cluster.wait_condition("demo", "Admitted", reason="Finished")
    await cluster.settle()
    assert cluster.emulator.count_refused("delete", "networkpolicies") >= 2  # every pass tries
    # One Event per condition that turned Forbidden (Degraded, and Ready, which says why it
    # is not), not one per pass.
    forbidden = sorted(e["message"].split(":")[0] for e in _events(cluster, "Forbidden"))
    assert forbidden == ["Degraded is True", "Ready is False"]
    assert all(e["type"] == "Warning" for e in _events(cluster, "Forbidden"))
    await cluster.settle()
    assert len(_events(cluster, "Forbidden")) == 2
    assert cluster.condition("demo", "Degraded")["reason"] == "Forbidden"
