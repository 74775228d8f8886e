"""The operator against the emulated API server: server-side apply semantics (field managers,
conflicts, force), gang scheduling, and two peering replicas (Kueue: test_operator_kueue.py)."""

from __future__ import annotations

import aiohttp
import chart_rbac
import pytest
from operator_harness import DEPLOYMENTS, JOBS, NAMESPACE, RUNS, STATEFULSETS, TINY, Cluster

pytestmark = pytest.mark.timeout(120)

PODGROUPS = "scheduling.x-k8s.io/v1alpha1/podgroups"
GPU: dict = {
    "rollout": {"replicas": 2, "resources": {"gpus": 1}},
    "learner": {"nodes": 2, "procsPerNode": 2, "resources": {"gpus": 2}},
    "storage": {"size": "10Gi", "accessMode": "ReadWriteMany"},
    "scheduling": {"gang": {"scheduleTimeoutSeconds": 120}},
}


async def _apply(cluster: Cluster, manager: str, body: dict, *, force: bool = False):
    path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{body['metadata']['name']}"
    params = {"fieldManager": manager, "force": "true" if force else "false"}
    headers = {"Content-Type": "application/apply-patch+yaml"}
    async with (
        aiohttp.ClientSession() as session,
        session.patch(cluster.url + path, params=params, headers=headers, json=body) as response,
    ):
        return response.status, await response.json()


def _deployment(name: str, **spec) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }


async def test_the_emulator_applies_like_the_api_server(cluster: Cluster):
    """The subset of server-side apply the operator relies on, checked on its own."""
    status, obj = await _apply(cluster, "alice", _deployment("x", replicas=2, paused=False))
    assert status == 201 and obj["spec"] == {"replicas": 2, "paused": False}
    assert [m["manager"] for m in obj["metadata"]["managedFields"]] == ["alice"]
    assert obj["metadata"]["managedFields"][0]["fieldsV1"] == {
        "f:spec": {"f:paused": {}, "f:replicas": {}}
    }
    # Another manager changing alice's field conflicts, naming the field and the owner...
    status, body = await _apply(cluster, "bob", _deployment("x", replicas=5))
    assert status == 409 and 'conflict with "alice": .spec.replicas' in body["message"]
    # ...agreeing with her value shares it; force takes it over.
    assert (await _apply(cluster, "bob", _deployment("x", replicas=2)))[0] == 200
    status, obj = await _apply(cluster, "bob", _deployment("x", replicas=5), force=True)
    assert status == 200 and obj["spec"]["replicas"] == 5
    owners = cluster.emulator.managers(DEPLOYMENTS, NAMESPACE, "x")
    assert ("spec", "replicas") in owners["bob"] and ("spec", "replicas") not in owners["alice"]
    # A field alice applied before and leaves out now goes, unless someone else owns it.
    status, obj = await _apply(cluster, "alice", _deployment("x", minReadySeconds=3))
    assert obj["spec"] == {"replicas": 5, "minReadySeconds": 3}  # paused gone, replicas bob's
    # A no-op apply writes nothing.
    version = obj["metadata"]["resourceVersion"]
    status, obj = await _apply(cluster, "alice", _deployment("x", minReadySeconds=3))
    assert obj["metadata"]["resourceVersion"] == version


async def test_the_operator_owns_its_fields_and_leaves_the_hpa_its_count(cluster: Cluster):
    await cluster.create_run("demo", TINY)
    # The operator's first pass is over (its status written) before anyone else edits: an
    # apply still under way would otherwise land after the autoscaler's count below.
    await cluster.eventually(
        lambda: (
            (cluster.run("demo").get("status") or {}).get("observedGeneration") == 1
            and cluster.child(JOBS, "demo-trainer")
            and cluster.child(DEPLOYMENTS, "demo-env")
            and cluster.child(DEPLOYMENTS, "demo-rollout")
        ),
        what="the first pass",
    )
    rollout = cluster.child(DEPLOYMENTS, "demo-rollout")
    image = rollout["spec"]["template"]["spec"]["containers"][0]["image"]
    owners = cluster.emulator.managers(DEPLOYMENTS, NAMESPACE, "demo-rollout")
    assert set(owners) == {"aflowrl-operator"}
    assert ("spec", "replicas") in owners["aflowrl-operator"]

    # The autoscaler (kube-controller-manager) scales the environment; someone edits the
    # rollout's pod template by hand.
    await cluster.emulator.patch_object(
        DEPLOYMENTS, NAMESPACE, "demo-env", {"spec": {"replicas": 3}}
    )
    containers = [dict(rollout["spec"]["template"]["spec"]["containers"][0], image="evil:1")]
    await cluster.emulator.patch_object(
        DEPLOYMENTS,
        NAMESPACE,
        "demo-rollout",
        {"spec": {"template": {"spec": {"containers": containers}}}},
    )
    # A spec change makes the operator apply again: it takes its field back (force), and the
    # environment's count stays the autoscaler's.
    await cluster.patch_spec("demo", {"rollout": {"sampling": {"temperature": 0.7}}})
    await cluster.eventually(
        lambda: (
            cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["template"]["spec"]["containers"][0][
                "image"
            ]
            == image
        ),
        what="the image taken back",
    )
    assert cluster.child(DEPLOYMENTS, "demo-env")["spec"]["replicas"] == 3
    env_owners = cluster.emulator.managers(DEPLOYMENTS, NAMESPACE, "demo-env")
    assert ("spec", "replicas") not in env_owners["aflowrl-operator"]


async def test_gang_scheduling_groups_the_gpu_pods(cluster: Cluster):
    await cluster.create_run("demo", {**TINY, **GPU})
    group = await cluster.eventually(lambda: cluster.child(PODGROUPS, "demo-gpu"), what="group")
    assert group["spec"] == {"minMember": 4, "scheduleTimeoutSeconds": 120}
    learner = cluster.child(STATEFULSETS, "demo-learner")["spec"]["template"]
    assert learner["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "demo-gpu"
    assert learner["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    # Dropping gang scheduling removes the group and the pods' membership.
    await cluster.patch_spec("demo", {"scheduling": {"gang": None}})
    await cluster.eventually(lambda: cluster.child(PODGROUPS, "demo-gpu") is None, what="gone")
    template = cluster.child(STATEFULSETS, "demo-learner")["spec"]["template"]
    assert "schedulerName" not in template["spec"]


@pytest.mark.parametrize("chart_values", [{"peering": {"enabled": True}}])  # its RBAC
async def test_two_peering_replicas_work_one_at_a_time(cluster: Cluster):
    await cluster.stop_operator()  # the standalone one: replace it with two peering replicas
    await cluster.emulator.put_object(
        "kopf.dev/v1/clusterkopfpeerings",
        {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "aflow"}},
    )

    def peers() -> int:
        peering = cluster.emulator.read("kopf.dev/v1/clusterkopfpeerings", None, "aflow") or {}
        return len(peering.get("status") or {})

    first = await cluster.start_replica("aflow", priority=100)
    await cluster.eventually(lambda: peers() == 1, what="the first replica's announcement")
    second = await cluster.start_replica("aflow", priority=50)
    await cluster.eventually(lambda: peers() == 2, what="the second replica's announcement")
    await cluster.create_run("demo", TINY)
    await cluster.eventually(lambda: cluster.child(JOBS, "demo-trainer"), what="the Job")
    await cluster.eventually(lambda: first.passes() >= 3, what="passes of the first replica")
    assert second.passes() == 0  # it stands by while the higher priority lives
    for plural, name in (("deployments", "demo-rollout"), ("jobs", "demo-trainer")):
        assert cluster.emulator.count_created(plural, name) == 1

    await first.stop()  # it leaves the peering: the second takes over
    await cluster.patch_spec("demo", {"suspend": True})
    await cluster.eventually(
        lambda: cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is True,
        what="the second replica's pass",
    )
    await cluster.eventually(
        lambda: cluster.emulator.read(RUNS, NAMESPACE, "demo")["status"]["observedGeneration"] == 2,
        what="the second replica's status",
    )
    await cluster.eventually(lambda: second.passes() > 0, what="the second replica's passes")
    assert cluster.emulator.count_created("deployments", "demo-rollout") == 1


async def test_the_chart_hooks_install_the_crd_and_check_the_install(cluster: Cluster):
    import asyncio

    import kubernetes

    from aflowrl.config.crd import training_run_crd
    from aflowrl_operator import install
    from aflowrl_operator.kube import KubeApi

    crds = "apiextensions.k8s.io/v1/customresourcedefinitions"
    # Each hook runs as its own ServiceAccount, with the chart's RBAC for it (the emulator
    # enforces one policy at a time: the operator, which this test does not need, stops).
    await cluster.stop_operator()
    installer = chart_rbac.operator_policy(account="aflow-rl-crd-upgrade")
    tester = chart_rbac.operator_policy(account="aflow-rl-test")
    configuration = kubernetes.client.Configuration()
    configuration.host = cluster.url
    api = KubeApi(configuration)
    try:
        cluster.emulator.policy = tester
        ok, message = await install.check("aflow-rl/aflow-rl-operator", api=api)
        assert not ok and "missing or not established" in message
        cluster.emulator.policy = installer
        task = asyncio.create_task(install.install_crd(api=api, timeout_s=30))
        crd = await cluster.eventually(
            lambda: cluster.emulator.read(crds, None, "trainingruns.aflowrl.io"), what="the CRD"
        )
        assert crd["spec"] == training_run_crd()["spec"]
        managers = cluster.emulator.managers(crds, None, "trainingruns.aflowrl.io")
        assert set(managers) == {"aflowrl-crd-installer"}
        await cluster.emulator.set_status(
            crds,
            None,
            "trainingruns.aflowrl.io",
            {"conditions": [{"type": "Established", "status": "True"}]},
        )
        ok, message = await task
        assert ok, message
        cluster.emulator.policy = tester
        ok, message = await install.check("aflow-rl/aflow-rl-operator", api=api)
        assert not ok and "no ready operator pod" in message
        await cluster.emulator.put_object(
            DEPLOYMENTS,
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "aflow-rl-operator", "namespace": "aflow-rl"},
                "spec": {},
                "status": {"readyReplicas": 1},
            },
        )
        ok, message = await install.check("aflow-rl/aflow-rl-operator", api=api)
        assert ok, message
        # An older CRD (another schema) is reported as not this operator's.
        await cluster.emulator.patch_object(
            crds, None, "trainingruns.aflowrl.io", {"spec": {"versions": []}}
        )
        ok, message = await install.check("aflow-rl/aflow-rl-operator", api=api)
        assert not ok and "is not this operator's" in message
        assert cluster.emulator.refused == []
    finally:
        api.close()
