"""The RBAC decisions the emulated API server makes for the operator (:mod:`chart_rbac`): rules
bound to the operator's ServiceAccount only, Role scope, wildcards, resourceNames, verbs."""

from __future__ import annotations

import chart_rbac


def _docs() -> list[dict]:
    def role(kind: str, name: str, rules: list[dict], namespace: str | None = None) -> dict:
        meta = {"name": name, **({"namespace": namespace} if namespace else {})}
        return {"kind": kind, "metadata": meta, "rules": rules}

    def binding(kind: str, name: str, ref: tuple[str, str], who: str, ns: str | None = None):
        meta = {"name": name, **({"namespace": ns} if ns else {})}
        subject = {"kind": "ServiceAccount", "name": who, "namespace": "ops"}
        return {
            "kind": kind,
            "metadata": meta,
            "roleRef": {"kind": ref[0], "name": ref[1]},
            "subjects": [subject],
        }

    deployment = {
        "kind": "Deployment",
        "metadata": {"name": "x-operator", "namespace": "ops"},
        "spec": {"template": {"spec": {"serviceAccountName": "op"}}},
    }
    return [
        deployment,
        role(
            "ClusterRole", "reads", [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]
        ),
        binding("ClusterRoleBinding", "reads", ("ClusterRole", "reads"), "op"),
        role("ClusterRole", "edit", [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
        binding("ClusterRoleBinding", "edit", ("ClusterRole", "edit"), "someone-else"),
        role(
            "Role",
            "apps",
            [
                {
                    "apiGroups": ["apps"],
                    "resources": ["deployments", "deployments/*"],
                    "verbs": ["get", "patch"],
                },
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": ["cfg"],
                    "verbs": ["get"],
                },
            ],
            namespace="team-a",
        ),
        binding("RoleBinding", "apps", ("Role", "apps"), "op", ns="team-a"),
    ]


def test_only_the_operators_bindings_count_and_a_role_only_in_its_namespace():
    policy = chart_rbac.policy_of(_docs())
    assert policy.allows("list", "", "nodes", None)
    assert not policy.allows("delete", "", "nodes", None)  # the wildcard role is another's
    assert policy.allows("get", "apps", "deployments", "team-a", "web")
    assert not policy.allows("get", "apps", "deployments", "team-b", "web")
    assert not policy.allows("get", "apps", "deployments", None)  # not across namespaces
    assert not policy.allows("delete", "apps", "deployments", "team-a", "web")


def test_subresource_wildcards_and_resource_names():
    policy = chart_rbac.policy_of(_docs())
    assert policy.allows("patch", "apps", "deployments/scale", "team-a", "web")
    assert not policy.allows("patch", "apps", "statefulsets/scale", "team-a", "web")
    assert policy.allows("get", "", "configmaps", "team-a", "cfg")
    assert not policy.allows("get", "", "configmaps", "team-a", "other")
    assert not policy.allows("list", "", "configmaps", "team-a")  # a list names no object


def test_a_narrower_policy_loses_one_verb_on_one_resource_only():
    policy = chart_rbac.policy_of(_docs()).without("patch", "apps", "deployments")
    assert not policy.allows("patch", "apps", "deployments", "team-a", "web")
    assert policy.allows("get", "apps", "deployments", "team-a", "web")
    assert policy.allows("patch", "apps", "deployments/scale", "team-a", "web")


def test_request_verbs_are_named_as_the_api_server_names_them():
    verb = chart_rbac.request_verb
    assert verb("GET", named=True) == "get"
    assert verb("GET", named=False) == "list"
    assert verb("GET", named=False, watching=True) == "watch"
    assert verb("DELETE", named=True) == "delete"
    assert verb("DELETE", named=False) == "deletecollection"
    assert verb("PUT", named=True) == "update"
    assert verb("PATCH", named=True) == "patch"
    assert verb("POST", named=False) == "create"
