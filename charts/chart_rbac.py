"""The operator's permissions as the chart grants them, decided like the API server's RBAC.

:func:`operator_policy` renders the chart (:mod:`build_manifests`, helm-python-sdk) with the
given values, finds the operator's ServiceAccount (the one its Deployment runs as) and collects
the rules bound to it: ClusterRoles through ClusterRoleBindings (every namespace and
cluster-scoped resources), Roles and ClusterRoles through RoleBindings (their namespace only).
:meth:`Policy.allows` then answers a request as the RBAC authorizer does: a rule grants it when
its ``apiGroups``, ``resources`` (``plural`` or ``plural/subresource``), ``verbs`` and, if any,
``resourceNames`` match (``*`` matches all). Used by the emulated API server of the operator's
tests, which answers 403 to whatever is not granted, and by the chart's tests.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterable, Mapping
from typing import Any

import build_manifests
import yaml

JsonDict = dict[str, Any]

VERBS_BY_METHOD = {"POST": "create", "PATCH": "patch", "PUT": "update"}


def request_verb(method: str, *, named: bool, watching: bool = False) -> str:
    """The RBAC verb of an HTTP request on a resource (as the API server's request info
    resolver names it)."""
    method = method.upper()
    if method == "GET":
        return "watch" if watching else "get" if named else "list"
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    return VERBS_BY_METHOD[method]


def _matches(allowed: Iterable[str], value: str) -> bool:
    allowed = list(allowed)
    return "*" in allowed or value in allowed


def _rule_grants(
    rule: Mapping[str, Any], verb: str, group: str, resource: str, name: str | None
) -> bool:
    if not _matches(rule.get("apiGroups") or [], group):
        return False
    if not _matches(rule.get("verbs") or [], verb):
        return False
    resources = rule.get("resources") or []
    base, _, sub = resource.partition("/")
    # "*" is every resource and subresource; "pods/*" every subresource of pods; "*/scale"
    # the scale subresource of every resource (the RBAC authorizer's ResourceMatches).
    if not (
        _matches(resources, resource)
        or (sub and (f"{base}/*" in resources or f"*/{sub}" in resources))
    ):
        return False
    names = rule.get("resourceNames") or []
    return not names or (name is not None and name in names)


@dataclasses.dataclass(frozen=True)
class Policy:
    """What one ServiceAccount may do: rules everywhere, and rules per namespace."""

    cluster: tuple[JsonDict, ...] = ()
    namespaced: Mapping[str, tuple[JsonDict, ...]] = dataclasses.field(default_factory=dict)

    def allows(
        self, verb: str, group: str, resource: str, namespace: str | None, name: str | None = None
    ) -> bool:
        """Whether ``verb`` on ``resource`` (``plural`` or ``plural/subresource``) of API
        ``group`` (``""`` for the core API) in ``namespace`` (None: cluster-scoped, or across
        all namespaces) is granted; ``name`` is the object's, when the request names one."""
        rules = list(self.cluster)
        if namespace is not None:
            rules += self.namespaced.get(namespace, ())
        return any(_rule_grants(rule, verb, group, resource, name) for rule in rules)

    def without(self, verb: str, group: str, resource: str) -> Policy:
        """This policy less one grant (for tests that run with a narrower role than the
        chart's): the verb is removed from every rule that names the resource."""

        def narrowed(rules: tuple[JsonDict, ...]) -> tuple[JsonDict, ...]:
            out: list[JsonDict] = []
            for rule in rules:
                resources = rule.get("resources") or []
                if group not in (rule.get("apiGroups") or []) or resource not in resources:
                    out.append(rule)
                    continue
                others = [r for r in resources if r != resource]
                if others:
                    out.append({**rule, "resources": others})
                verbs = [v for v in rule.get("verbs") or [] if v != verb]
                out.append({**rule, "resources": [resource], "verbs": verbs})
            return tuple(out)

        return Policy(
            cluster=narrowed(self.cluster),
            namespaced={ns: narrowed(rules) for ns, rules in self.namespaced.items()},
        )


def policy_of(docs: list[JsonDict], account: str | None = None) -> Policy:
    """The rules bound to ServiceAccount ``account`` of the release namespace (default: the
    one the chart's operator Deployment runs as; a Helm hook's, e.g. ``aflow-rl-test``)."""
    account_ns = build_manifests.NAMESPACE
    if account is None:
        deployments = [
            d
            for d in docs
            if d.get("kind") == "Deployment" and d["metadata"]["name"].endswith("-operator")
        ]
        if not deployments:
            return Policy()
        (deployment,) = deployments
        account = deployment["spec"]["template"]["spec"].get("serviceAccountName", "default")
        account_ns = deployment["metadata"].get("namespace", account_ns)
    roles = {
        (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): tuple(
            d.get("rules") or ()
        )
        for d in docs
        if d.get("kind") in {"ClusterRole", "Role"}
    }
    cluster: list[JsonDict] = []
    namespaced: dict[str, list[JsonDict]] = {}
    for binding in docs:
        if binding.get("kind") not in {"ClusterRoleBinding", "RoleBinding"}:
            continue
        if not any(
            s.get("kind") == "ServiceAccount"
            and s.get("name") == account
            and s.get("namespace", account_ns) == account_ns
            for s in binding.get("subjects") or []
        ):
            continue
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace")
        role_ns = namespace if ref["kind"] == "Role" else None
        rules = roles.get((ref["kind"], role_ns, ref["name"]), ())
        if binding["kind"] == "ClusterRoleBinding":
            cluster += rules
        else:
            namespaced.setdefault(namespace or account_ns, []).extend(rules)
    return Policy(cluster=tuple(cluster), namespaced={ns: tuple(r) for ns, r in namespaced.items()})


@functools.cache
def _policy(values_json: str, account: str | None) -> Policy:
    docs = [
        yaml.safe_load(text)
        for _, text in build_manifests.rendered_documents(json.loads(values_json))
    ]
    return policy_of(docs, account)


def operator_policy(
    values: Mapping[str, Any] | None = None, *, account: str | None = None
) -> Policy:
    """The operator's permissions with the chart rendered with ``values`` (cached per values);
    with ``account``, that ServiceAccount's instead (a Helm hook's)."""
    return _policy(json.dumps(values or {}, sort_keys=True), account)
