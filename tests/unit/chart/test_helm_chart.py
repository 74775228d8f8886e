"""The Helm chart: rendered and linted (helm-python-sdk), schema-checked, in step with manifests."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import cel
import helm_python as helm
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "aflow-rl"
ALL_OPTIONS = CHART / "ci" / "all-options-values.yaml"
K8S_VERSION = "1.30.0"

sys.path.insert(0, str(ROOT / "charts"))
import build_manifests  # noqa: E402

CUSTOM_KINDS = {
    "ServiceMonitor": "monitoring.coreos.com/v1",
    "ClusterKopfPeering": "kopf.dev/v1",
    "KopfPeering": "kopf.dev/v1",
}
"""Kinds defined by CRDs: kubernetes-validate ships no schema for them."""


def _render(values: dict | None = None, *, hooks: bool = True) -> list[dict]:
    return [
        yaml.safe_load(text) for _, text in build_manifests.rendered_documents(values, hooks=hooks)
    ]


def _hook(doc: dict) -> str | None:
    return (doc["metadata"].get("annotations") or {}).get("helm.sh/hook")


def _runs(doc: dict) -> bool:
    """Whether a Role is the one granting the runs' children (not the Lease's)."""
    return doc["metadata"]["name"].endswith("-runs")


def _all_options() -> dict:
    return yaml.safe_load(ALL_OPTIONS.read_text())


def _one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


@pytest.mark.parametrize("values", [None, "all-options"])
def test_every_rendered_object_is_valid_kubernetes(values):
    docs = _render(_all_options() if values else None)
    for doc in docs:
        if doc["kind"] in CUSTOM_KINDS:
            assert doc["apiVersion"] == CUSTOM_KINDS[doc["kind"]]
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("values", [None, ALL_OPTIONS])
def test_the_chart_lints_clean_in_strict_mode(values):
    report = helm.lint(
        CHART,
        yaml.safe_load(values.read_text()) if values else None,
        strict=True,
        kube_version=f"v{K8S_VERSION}",
    )
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_default_install_watches_everything_with_least_privilege():
    docs = _render(hooks=False)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        [
            *["CustomResourceDefinition"] * 3,  # TrainingRun, kopf's two peering kinds
            "ServiceAccount",
            "ConfigMap",
            # cluster reads, the runs, aggregated edit and view, Kueue's controller's reads
            *["ClusterRole"] * 5,
            *["ClusterRoleBinding"] * 3,
            "Role",  # leader election: the operator's own Lease
            "RoleBinding",
            "ValidatingAdmissionPolicy",  # Kueue's queue-name rule
            "ValidatingAdmissionPolicyBinding",
            "Deployment",
        ]
    )
    assert not any(d["kind"] in {"PodDisruptionBudget", "NetworkPolicy"} for d in docs)
    deployment = _one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    # Leader election makes a rolling update safe: the new pod writes only once it holds the
    # Lease, which the old one releases on shutdown.
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert container["command"] == ["aflowrl-operator"]
    assert "--all-namespaces" in container["args"]
    assert container["image"] == "ghcr.io/aflow-rl/aflow-rl-operator:0.1.0"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    runs = _one(docs, "ClusterRole", "aflow-rl-runs")
    for rule in runs["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
        assert "escalate" not in rule["verbs"] and "bind" not in rule["verbs"]
    secrets = [r for r in runs["rules"] if "secrets" in r["resources"]]
    assert secrets == []  # the operator never reads the run's Secrets; pods mount them
    assert not any(d["kind"] == "ServiceMonitor" for d in docs)


def test_the_operator_may_set_block_owner_deletion_on_its_children():
    """Children point at their run with blockOwnerDeletion; clusters that enforce owner
    references (OwnerReferencesPermissionEnforcement) ask for update on its finalizers."""
    wanted = {
        "apiGroups": ["aflowrl.io"],
        "resources": ["trainingruns/finalizers"],
        "verbs": ["update"],
    }
    assert wanted in _one(_render(hooks=False), "ClusterRole", "aflow-rl-runs")["rules"]
    roles = [
        d for d in _render(_all_options()) if d["kind"] == "Role" and not _hook(d) and _runs(d)
    ]
    assert roles and all(wanted in role["rules"] for role in roles)


def test_every_option_on():
    docs = _render(_all_options())
    deployment = _one(docs, "Deployment", "aflowrl-prod-operator")
    pod = deployment["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    assert "--all-namespaces" not in args and "--verbose" in args
    assert "--metrics-port=9191" in args and "--liveness-port=8181" in args
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "other-cred"}]
    assert pod["serviceAccountName"] == "aflowrl-operator"
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    roles = [d for d in docs if d["kind"] == "Role" and not _hook(d) and _runs(d)]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert not any(
        d["metadata"]["name"] == "aflowrl-prod-runs" for d in docs if d["kind"] == "ClusterRole"
    )
    monitor = _one(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"][0]["interval"] == "15s"
    service = _one(docs, "Service")
    assert service["spec"]["ports"][0]["port"] == 9191
    dashboard = _one(docs, "ConfigMap")
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "aflow-rl"}


def test_the_notes_tell_how_to_run_and_watch_a_run():
    notes = helm.Chart.load(CHART).render({}, name="aflow-rl", namespace="aflow-rl")
    text = notes["aflow-rl/templates/NOTES.txt"]
    assert "kubectl get trainingruns -w" in text and "tiny-cpu.yaml" in text
    assert "grafana_dashboard" in text


def test_the_dashboard_config_map_carries_the_dashboard():
    dashboard = _one(_render(), "ConfigMap", "aflow-rl-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((ROOT / "manifests" / "grafana" / "aflow-rl.json").read_text())
    assert json.loads(dashboard["data"]["aflow-rl.json"]) == shipped


@pytest.mark.parametrize(
    "values",
    [
        {"serviceMonitr": {"enabled": True}},
        {"serviceMonitor": {"enabld": True}},
        {"grafanaDashboard": {"enabled": "yes"}},
        {"resyncInterval": 0},
        {"watchNamespaces": ["Team_A"]},
        {"image": {"pullPolicy": "Sometimes"}},
        {"logFormat": "xml"},
    ],
)
def test_the_values_schema_rejects_typos_and_bad_values(values):
    chart = helm.Chart.load(CHART)
    with pytest.raises(helm.HelmError):
        chart.validate_schema(values)
    with pytest.raises(helm.HelmError):
        chart.render(values, name="aflow-rl", namespace="aflow-rl")


def test_the_all_options_file_passes_the_schema():
    helm.Chart.load(CHART).validate_schema(_all_options())


def test_the_chart_is_in_step_with_manifests():
    crds = sorted((ROOT / "manifests" / "crds").glob("*.yaml"))
    chart_crds = sorted((CHART / "crds").glob("*.yaml"))
    assert [p.name for p in crds] == [p.name for p in chart_crds]
    for source, copy in zip(crds, chart_crds, strict=True):
        assert copy.read_text() == source.read_text(), "stale chart CRD: run `make manifests`"
    assert (CHART / "dashboards" / "aflow-rl.json").read_text() == (
        ROOT / "manifests" / "grafana" / "aflow-rl.json"
    ).read_text(), "stale chart dashboard: run `make manifests`"
    assert (ROOT / "manifests" / "install.yaml").read_text() == build_manifests.install_yaml(), (
        "manifests/install.yaml is not the chart's default render: run `make manifests`"
    )


def test_install_yaml_is_valid_kubernetes():
    docs = [d for d in yaml.safe_load_all((ROOT / "manifests" / "install.yaml").read_text()) if d]
    assert docs[0]["kind"] == "CustomResourceDefinition"
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        if doc["kind"] not in {
            "CustomResourceDefinition",
            "ClusterRole",
            "ClusterRoleBinding",
            "ValidatingAdmissionPolicy",  # cluster-scoped
            "ValidatingAdmissionPolicyBinding",
        }:
            assert doc["metadata"]["namespace"] == "aflow-rl"


def test_several_replicas_peer_and_keep_one_through_drains():
    docs = _render(_all_options())
    deployment = _one(docs, "Deployment", "aflowrl-prod-operator")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert (
        "--peering=aflowrl-prod" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    peerings = [d for d in docs if d["kind"] == "KopfPeering"]  # namespaced: one per namespace
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["team-a", "team-b"]
    roles = [d for d in docs if d["kind"] == "Role" and not _hook(d) and _runs(d)]
    for role in roles:
        assert any("kopfpeerings" in rule["resources"] for rule in role["rules"])
    pdb = _one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]

    cluster_wide = _render({"replicaCount": 3})
    assert _one(cluster_wide, "ClusterKopfPeering")["metadata"]["name"] == "aflow-rl"
    cluster = _one(cluster_wide, "ClusterRole", "aflow-rl-cluster")
    assert any("clusterkopfpeerings" in rule["resources"] for rule in cluster["rules"])
    # One replica: standalone, no peering object, no budget (it would only block drains).
    single = _render({"podDisruptionBudget": {"enabled": True}})
    assert not any(d["kind"] in {"PodDisruptionBudget", "ClusterKopfPeering"} for d in single)
    args = _one(single, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not any(a.startswith("--peering") for a in args)
    assert not any(
        d["kind"] == "PodDisruptionBudget"
        for d in _render({"replicaCount": 2, "podDisruptionBudget": {"enabled": False}})
    )


def test_the_network_policy_lets_only_dns_the_api_server_and_scrapes_through():
    policy = _one(_render(_all_options()), "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    dns, api = policy["spec"]["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert {p["port"] for p in api["ports"]} == {443, 6443}
    assert api["to"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}]
    health, metrics = policy["spec"]["ingress"]
    assert health["ports"] == [{"protocol": "TCP", "port": 8181}]
    assert metrics["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"
    }


def test_namespace_users_get_trainingruns_through_the_default_roles():
    docs = _render()
    edit = _one(docs, "ClusterRole", "aflow-rl-edit")
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert "create" in edit["rules"][0]["verbs"] and "delete" in edit["rules"][0]["verbs"]
    assert edit["rules"][1] == {
        "apiGroups": ["aflowrl.io"],
        "resources": ["trainingruns/status"],
        "verbs": ["get"],
    }  # users cannot forge a run's status
    view = _one(docs, "ClusterRole", "aflow-rl-view")
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert set(view["rules"][0]["verbs"]) == {"get", "list", "watch"}
    off = _render({"rbac": {"aggregateToDefaultRoles": False}})
    assert not any(d["metadata"]["name"].endswith(("-edit", "-view")) for d in off)


def test_hooks_upgrade_the_crd_and_test_the_install():
    docs = _render()
    job = _one(docs, "Job", "aflow-rl-crd-upgrade")
    assert _hook(job) == "pre-upgrade"
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["--install-crd"]
    (rule,) = _one(docs, "ClusterRole", "aflow-rl-crd-upgrade")["rules"]
    assert rule["resourceNames"] == ["trainingruns.aflowrl.io"]
    assert rule["verbs"] == ["get", "patch", "create"]  # an apply that creates is a create
    # The hook's RBAC exists before the Job runs (lower weights first).
    weights = {
        d["kind"]: int(d["metadata"]["annotations"]["helm.sh/hook-weight"])
        for d in docs
        if _hook(d) == "pre-upgrade"
    }
    assert weights["ClusterRole"] < weights["ClusterRoleBinding"] < weights["Job"]
    test = _one(docs, "Pod", "aflow-rl-test")
    assert _hook(test) == "test"
    assert test["spec"]["containers"][0]["args"] == ["--check=aflow-rl/aflow-rl-operator"]
    assert test["spec"]["restartPolicy"] == "Never"
    off = _render({"crds": {"upgradeJob": {"enabled": False}}, "tests": {"enabled": False}})
    assert not any(_hook(d) for d in off)
    # manifests/install.yaml (kubectl apply) carries no hooks.
    installed = yaml.safe_load_all((ROOT / "manifests" / "install.yaml").read_text())
    assert not any(_hook(d) for d in installed if d)


# The API versions of MutatingAdmissionPolicy, with a Kubernetes version whose schemas have it:
# v1beta1 from 1.34 (feature gate), v1 from 1.36.
_POLICY_APIS = {
    "admissionregistration.k8s.io/v1": "1.36.0",
    "admissionregistration.k8s.io/v1beta1": "1.34.0",
}


def _policy(docs: list[dict]) -> tuple[dict, dict]:
    return (
        _one(docs, "MutatingAdmissionPolicy", "aflow-rl-kueue-suspend"),
        _one(docs, "MutatingAdmissionPolicyBinding", "aflow-rl-kueue-suspend"),
    )


@pytest.mark.parametrize("api_version", sorted(_POLICY_APIS))
def test_the_kueue_suspend_policy_is_valid_kubernetes_and_off_by_default(api_version):
    assert not any("MutatingAdmission" in d["kind"] for d in _render())
    values = {"kueueSuspendPolicy": {"enabled": True, "apiVersion": api_version}}
    docs = _render({**values, "watchNamespaces": ["team-a"]})
    policy, binding = _policy(docs)
    for doc in (policy, binding):
        assert doc["apiVersion"] == api_version
        kubernetes_validate.validate(doc, _POLICY_APIS[api_version], strict=True)
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    selector = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert selector == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a"]}
    ]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"], rule["operations"]) == (
        ["aflowrl.io"],
        ["trainingruns"],
        ["CREATE"],
    )
    # Watching every namespace: the binding matches TrainingRuns everywhere.
    _, everywhere = _policy(_render(values))
    assert "matchResources" not in everywhere["spec"]


def test_the_kueue_suspend_policy_matches_only_queued_unsuspended_runs():
    """The policy's match conditions, evaluated with the CEL library the CRD rule tests use
    (common-expression-language); its ApplyConfiguration mutation builds ``Object{...}``
    structs, which that library does not evaluate ("feature not enabled"), so it is compiled
    (a syntax check) and its text checked."""
    policy, _ = _policy(_render({"kueueSuspendPolicy": {"enabled": True}}))
    conditions = {
        c["name"]: cel.compile(c["expression"]) for c in policy["spec"]["matchConditions"]
    }

    def matches(run: dict) -> bool:
        context = cel.Context()
        context.add_variable("object", run)
        return all(program.execute(context) is True for program in conditions.values())

    queue = {"kueue.x-k8s.io/queue-name": "team-a"}
    assert matches({"metadata": {"labels": queue}, "spec": {}})
    assert matches({"metadata": {"labels": queue}, "spec": {"suspend": False}})
    assert not matches({"metadata": {"labels": queue}, "spec": {"suspend": True}})  # the user's
    assert not matches({"metadata": {"labels": {"app": "x"}}, "spec": {}})
    assert not matches({"metadata": {}, "spec": {}})
    assert not matches({"metadata": {"labels": {"kueue.x-k8s.io/queue-name": ""}}, "spec": {}})
    (mutation,) = policy["spec"]["mutations"]
    assert mutation["patchType"] == "ApplyConfiguration"
    expression = mutation["applyConfiguration"]["expression"]
    cel.compile(expression)
    assert "spec: Object.spec{suspend: true}" in expression
    assert "'aflowrl.io/suspended-by': 'kueue'" in expression  # the operator's marker


def test_leader_election_holds_the_operators_own_lease_under_the_pods_name():
    docs = _render(hooks=False)
    pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert "--leader-election" in container["args"]
    assert "--lease-name=aflow-rl-operator" in container["args"]
    assert "--lease-namespace=aflow-rl" in container["args"]
    assert "--lease-duration=15" in container["args"]
    (env,) = [e for e in container["env"] if e["name"] == "AFLOWRL_POD_NAME"]
    assert env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    role = _one(docs, "Role", "aflow-rl-leader-election")
    assert role["metadata"]["namespace"] == "aflow-rl"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["aflow-rl-operator"],
            "verbs": ["get", "patch"],
        },
    ]
    binding = _one(docs, "RoleBinding", "aflow-rl-leader-election")
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]

    off = _render({"leaderElection": {"enabled": False}}, hooks=False)
    deployment = _one(off, "Deployment")
    assert deployment["spec"]["strategy"]["type"] == "Recreate"  # one pod at a time
    assert (
        "--leader-election" not in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    assert not any(d["kind"] == "Role" for d in off)


def test_kueues_controller_may_read_trainingruns_behind_the_kueue_switch():
    """Kueue's ServiceAccount walks a child up to its run (FindAncestorJobManagedByKueue in
    Kueue's jobframework/reconciler.go) through its cached client: get, list and watch."""
    docs = _render(hooks=False)
    role = _one(docs, "ClusterRole", "aflow-rl-kueue-controller")
    assert role["rules"] == [
        {
            "apiGroups": ["aflowrl.io"],
            "resources": ["trainingruns"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    binding = _one(docs, "ClusterRoleBinding", "aflow-rl-kueue-controller")
    assert binding["roleRef"]["name"] == "aflow-rl-kueue-controller"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "kueue-controller-manager", "namespace": "kueue-system"}
    ]
    access = {"serviceAccount": "kueue-manager", "namespace": "queueing"}
    moved = _render({"kueue": {"controllerAccess": access}}, hooks=False)
    subject = _one(moved, "ClusterRoleBinding", "aflow-rl-kueue-controller")["subjects"][0]
    assert (subject["name"], subject["namespace"]) == ("kueue-manager", "queueing")
    without = _render({"rbac": {"kueue": False}}, hooks=False)
    assert not [d for d in without if d["metadata"]["name"] == "aflow-rl-kueue-controller"]


def test_the_queue_name_of_a_running_trainingrun_cannot_change():
    """The ValidatingAdmissionPolicy's rule, evaluated with the CEL library: Kueue's
    validateUpdateForQueueName (jobframework/validation.go): immutable unless suspended."""
    docs = _render(hooks=False)
    policy = _one(docs, "ValidatingAdmissionPolicy")
    binding = _one(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["resources"], rule["operations"]) == (["trainingruns"], ["UPDATE"])
    (validation,) = policy["spec"]["validations"]
    program = cel.compile(validation["expression"])
    cel.compile(validation["messageExpression"])

    def allowed(old: dict, new: dict) -> bool:
        context = cel.Context()
        context.add_variable("object", new)
        context.add_variable("oldObject", old)
        return program.execute(context) is True

    def run(queue: str | None, suspend: bool | None = None) -> dict:
        labels = {"kueue.x-k8s.io/queue-name": queue} if queue is not None else {}
        spec = {"suspend": suspend} if suspend is not None else {}
        return {"metadata": {"labels": labels}, "spec": spec}

    assert allowed(run("a"), run("a"))
    assert not allowed(run("a"), run("b"))  # moved to another queue while running
    assert not allowed(run("a"), run(None))  # taken out of Kueue while running
    assert not allowed(run(None), run("a"))  # put under Kueue while running
    assert not allowed(run("a"), run("b", suspend=False))
    assert allowed(run("a"), run("b", suspend=True))  # suspended: Kueue allows the change
    assert allowed(run("a", suspend=True), run(None, suspend=True))
    assert allowed({"metadata": {}, "spec": {}}, {"metadata": {}, "spec": {}})
    off = _render({"kueue": {"queueNamePolicy": {"enabled": False}}}, hooks=False)
    assert not [d for d in off if d["kind"].startswith("ValidatingAdmissionPolicy")]
