"""The chart grants every request the operator makes: the requests are recorded, not listed by
hand, by running reconcile passes (and the leader election) against a recording fake of the
operator's API client over runs that exercise each child's create, apply, list and delete path,
plus kopf's watches of the run and its children; each (verb, group, resource) is then checked
against the RBAC the chart binds to the operator's ServiceAccount (:mod:`chart_rbac`)."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import chart_rbac

from aflowrl.config import API_GROUP, KIND
from aflowrl_operator import handlers, leader
from aflowrl_operator.kube import KINDS
from aflowrl_operator.reconcile import Reconciler

NS = "team-a"
JsonDict = dict[str, Any]
Request = tuple[str, str, str, str | None, str | None]
"""(verb, API group, resource[/subresource], namespace, name)."""


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0] if "/" in api_version else ""


class RecordingApi:
    """The operator's :class:`~aflowrl_operator.kube.KubeApi` surface over an in-memory store,
    recording each request as the RBAC verb the API server would check."""

    def __init__(self) -> None:
        self.store: dict[tuple[str, str | None, str], JsonDict] = {}
        self.requests: set[Request] = set()
        self._versions = itertools.count(1)

    def _note(
        self,
        verb: str,
        kind: str,
        api_version: str | None,
        ns: str | None,
        name: str | None,
        sub: str = "",
    ) -> None:
        known = KINDS[kind]
        group = _group(api_version or known.api_version)
        resource = known.plural + (f"/{sub}" if sub else "")
        self.requests.add((verb, group, resource, ns if known.namespaced else None, name))

    def _stamp(self, obj: JsonDict) -> JsonDict:
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{meta['name']}")
        meta["resourceVersion"] = str(next(self._versions))
        return obj

    async def get(self, kind: str, ns: str | None, name: str, *, api_version: str | None = None):
        self._note("get", kind, api_version, ns, name)
        found = self.store.get((kind, ns if KINDS[kind].namespaced else None, name))
        return copy.deepcopy(found)

    async def list(self, kind: str, ns: str | None = None, labels=None, *, api_version=None):
        self._note("list", kind, api_version, ns, None)
        wanted = (labels or {}).items()
        return [
            copy.deepcopy(o)
            for (k, n, _), o in self.store.items()
            if k == kind
            and n in (None, ns)
            and all((o["metadata"].get("labels") or {}).get(a) == b for a, b in wanted)
        ]

    async def create(self, manifest: JsonDict):
        meta = manifest["metadata"]
        ns = meta.get("namespace")
        self._note("create", manifest["kind"], manifest.get("apiVersion"), ns, None)
        name = meta.get("name") or meta.get("generateName", "x") + str(next(self._versions))
        key = (manifest["kind"], meta.get("namespace"), name)
        if key in self.store:
            return None
        obj = self._stamp({**copy.deepcopy(manifest), "metadata": {**meta, "name": name}})
        self.store[key] = obj
        return copy.deepcopy(obj)

    async def patch(
        self, kind, ns, name, patch, *, subresource="", api_version=None, field_manager=None
    ):
        self._note("patch", kind, api_version, ns, name, subresource)
        key = (kind, ns if KINDS[kind].namespaced else None, name)
        if key not in self.store:
            return None
        obj = self.store[key]
        _merge(obj, copy.deepcopy(patch))
        return copy.deepcopy(self._stamp(obj))

    async def apply(self, manifest: JsonDict, *, field_manager: str, force: bool = True):
        meta = manifest["metadata"]
        kind, api_version, ns = manifest["kind"], manifest.get("apiVersion"), meta.get("namespace")
        key = (kind, ns, meta["name"])
        self._note("patch", kind, api_version, ns, meta["name"])
        if key not in self.store:  # an apply that creates needs create too, for its name
            self._note("create", kind, api_version, ns, meta["name"])
            self.store[key] = self._stamp(copy.deepcopy(manifest))
        else:
            _merge(self.store[key], copy.deepcopy(manifest))
            self._stamp(self.store[key])
        return copy.deepcopy(self.store[key])

    async def delete(self, kind: str, ns: str | None, name: str, *, api_version=None) -> bool:
        self._note("delete", kind, api_version, ns, name)
        return self.store.pop((kind, ns, name), None) is not None

    async def has_api(self, group_version: str) -> bool:
        return True

    def close(self) -> None:
        pass


def _merge(target: JsonDict, patch: JsonDict) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


def _run(api: RecordingApi, name: str, spec: JsonDict, labels: JsonDict | None = None) -> JsonDict:
    body = {
        "apiVersion": f"{API_GROUP}/v1alpha1",
        "kind": KIND,
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "labels": labels or {},
                     "generation": 1},
        "spec": spec,
    }  # fmt: skip
    api.store[(KIND, NS, name)] = copy.deepcopy(body)
    return body


async def _passes(api: RecordingApi, body: JsonDict, *specs: JsonDict) -> None:
    reconciler = Reconciler(api, cluster_cache_s=0.0)  # type: ignore[arg-type]
    await reconciler.sync(body)
    for spec in specs:  # the spec changes: children go (deletes), others change
        api.store[(KIND, NS, body["metadata"]["name"])]["spec"] = spec
        await reconciler.sync(body)


EVERYTHING: JsonDict = {
    "rollout": {"replicas": 2, "resources": {"gpus": 1}},
    "learner": {"nodes": 2, "procsPerNode": 2, "resources": {"gpus": 2}},
    "environment": {
        "replicas": {"min": 1, "max": 4},
        "executor": {"type": "openai", "serve": {"model": "/models/exec", "replicas": 2}},
    },
    "storage": {"size": "10Gi", "accessMode": "ReadWriteMany"},
    "monitoring": {"serviceMonitor": {"enabled": True}},
    "networkPolicy": {"enabled": True},
    "scheduling": {"gang": {"scheduleTimeoutSeconds": 120}, "priorityClassName": "high"},
}
LESS: JsonDict = {
    **EVERYTHING,
    "rollout": {"replicas": 1, "resources": {"gpus": 1}},
    "environment": {
        "replicas": {"min": 1, "max": 4},
        "executor": {"type": "openai", "baseUrl": "http://llm:8000/v1"},
    },
    "networkPolicy": {"enabled": False},
    "monitoring": {"serviceMonitor": {"enabled": False}},
    "scheduling": {},
}
"""Every optional child of EVERYTHING turned off (immutable fields kept)."""


async def _recorded() -> set[Request]:
    api = RecordingApi()
    await _passes(api, _run(api, "demo", EVERYTHING), LESS, {**LESS, "suspend": True})
    labels = {"kueue.x-k8s.io/queue-name": "q", "kueue.x-k8s.io/priority-class": "p"}
    queued = _run(api, "queued", {}, labels)
    await _passes(api, queued)
    workload = api.store[("Workload", NS, "queued-kueue")]
    workload["status"] = {
        "conditions": [
            {"type": "QuotaReserved", "status": "True"},
            {"type": "Admitted", "status": "True"},
        ],
        "admission": {
            "clusterQueue": "gpu",
            "podSetAssignments": [
                {"name": n, "flavors": {"cpu": "f"}, "count": 1}
                for n in ("rollout", "learner", "environment", "trainer")
            ],
        },
    }
    await _passes(api, queued, {"suspend": True}, {"rollout": {"replicas": 3}})
    elector = leader.LeaderElector(
        api,  # type: ignore[arg-type]
        leader.LeaseConfig(name="aflow-rl-operator", namespace="aflow-rl"),
        "pod-a",
    )
    assert await elector.try_once() and await elector.try_once()
    await elector.release()
    # kopf: it lists and watches the runs and every watched child, patches the runs' kopf
    # annotations and posts Events.
    for group, _, plural in (*handlers.WATCHED_CHILDREN, (API_GROUP, None, "trainingruns")):
        for verb in ("list", "watch"):
            api.requests.add((verb, group, plural, NS, None))
    api.requests.add(("patch", API_GROUP, "trainingruns", NS, "demo"))
    return api.requests


async def test_the_recording_exercises_every_kind_of_write():
    made = {(verb, resource) for verb, _, resource, _, _ in await _recorded()}
    for wanted in (
        ("delete", "networkpolicies"),
        ("delete", "podmonitors"),
        ("delete", "podgroups"),
        ("list", "leaderworkersets"),
        ("create", "workloads"),
        ("patch", "workloads/status"),
        ("patch", "trainingruns/status"),
        ("patch", "trainingruns"),
        ("create", "events"),
        ("get", "resourceflavors"),
        ("get", "workloadpriorityclasses"),
        ("list", "pods"),
        ("list", "nodes"),
        ("create", "leases"),
        ("patch", "leases"),
    ):
        assert wanted in made, wanted


async def test_the_chart_grants_every_request_the_operator_makes():
    policy = chart_rbac.operator_policy()
    denied = sorted(
        (verb, group, resource, ns or "", name or "")
        for verb, group, resource, ns, name in await _recorded()
        if not policy.allows(verb, group, resource, ns, name)
    )
    assert denied == []


async def test_a_chart_without_a_grant_is_caught():
    """The check can fail: the NetworkPolicy delete that older charts did not grant."""
    policy = chart_rbac.operator_policy().without("delete", "networking.k8s.io", "networkpolicies")
    requests = await _recorded()
    denied = {
        (verb, resource)
        for verb, group, resource, ns, name in requests
        if not policy.allows(verb, group, resource, ns, name)
    }
    assert denied == {("delete", "networkpolicies")}
