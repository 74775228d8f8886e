"""A Kubernetes API emulator good enough to run the aflow-rl operator (kopf) against, in-process.

Built on ``kmock.KubernetesEmulator`` (kmock 0.8), whose object store, discovery and HTTP
plumbing it reuses. It replaces the emulator's writes to fix what stalls kopf and to add the
API-server semantics the operator's tests rely on:

- every write sets ``metadata.resourceVersion`` (kopf's JSON patches ``test`` it), plus ``uid``,
  ``creationTimestamp`` and ``generation`` (bumped when anything but metadata and status changes);
- resources declared with a ``status`` subresource get its semantics: writes to the main resource
  never change ``status``, writes to ``/status`` change nothing else, and creation drops status;
- a failing JSON-patch ``test`` answers 422 (kopf retries), a missing object 404, a duplicate 409;
- deleting an object deletes its dependents (owner-reference garbage collection), which their
  finalizers hold (``deletionTimestamp`` set) until removed;
- watches subscribe before replaying the existing objects, so no event in between is lost;
- lists honour equality ``labelSelector``\\ s;
- a TrainingRun is stored with its CRD's structural defaults filled in, on every write, as the
  API server does (:func:`crd_admission.defaulted`);
- server-side apply (``PATCH`` with ``application/apply-patch+yaml`` and ``fieldManager``), a
  faithful subset: field ownership per manager (kept in ``metadata.managedFields`` in the
  FieldsV1 shape), a 409 Conflict naming the fields when an apply changes a field another
  manager owns (unless ``force=true``, which takes it over), removal of the fields a manager
  applied before and leaves out now (unless another manager owns them), creation of a missing
  object; plain writes (create, merge and JSON patches) make their manager (``fieldManager``,
  else the User-Agent's product) the owner of the fields they change. Lists are atomic and
  status is not tracked.

RBAC: with :attr:`KubeEmulator.policy` set (:class:`chart_rbac.Policy`, the chart's own
(Cluster)Roles bound to the operator's ServiceAccount), every request the operator makes (told
apart from the tests' by its User-Agent: kopf's and the operator's own client) that the policy
does not grant is answered 403 Forbidden with a ``Status`` as the API server words it, and
logged in :attr:`KubeEmulator.refused`; an apply that creates needs ``create`` as well as
``patch``, as on a real API server.

``GET /api/v1/namespaces`` still fails to parse in kmock, so kopf runs cluster-wide against it.
Tests play the controllers (kubelet, deployment controller...) with :meth:`set_status`, or
with pods: :meth:`KubeEmulator.start_pods`, :meth:`~KubeEmulator.set_pod_ready`,
:meth:`~KubeEmulator.terminate_pod`, :meth:`~KubeEmulator.finish_termination`,
:meth:`~KubeEmulator.play_controller` and :meth:`~KubeEmulator.start_lws_group` keep the pods
and write their owner's status as its controller would (:mod:`emulated_pods`). A pod bound to
a node (``spec.nodeName``) is deleted gracefully, as the API server does: ``DELETE`` (or the
garbage collector, when its owner goes) sets ``deletionTimestamp`` and
``deletionGracePeriodSeconds`` and the pod stays, counted, until a test finishes its
termination (the kubelet's confirmation) and its finalizers are gone.
"""

from __future__ import annotations

import copy
import datetime
import itertools
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import attrs
import emulated_pods
import jsonpatch
import kmock
import yaml
from chart_rbac import Policy, request_verb
from kmock._internal import dicts, enums, rendering

from crd_admission import defaulted

# Resources the operator reads or writes: plural -> (kind, namespaced, has a status subresource).
RESOURCES: dict[str, tuple[str, bool, bool]] = {
    "aflowrl.io/v1alpha1/trainingruns": ("TrainingRun", True, True),
    # kopf waits for these two in discovery before it watches anything.
    "v1/namespaces": ("Namespace", False, True),
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", False, True),
    "v1/configmaps": ("ConfigMap", True, False),
    "v1/services": ("Service", True, True),
    "v1/serviceaccounts": ("ServiceAccount", True, False),
    "v1/persistentvolumeclaims": ("PersistentVolumeClaim", True, True),
    "v1/pods": ("Pod", True, True),
    "v1/nodes": ("Node", False, True),
    "v1/events": ("Event", True, False),
    "events.k8s.io/v1/events": ("Event", True, False),
    "apps/v1/deployments": ("Deployment", True, True),
    "apps/v1/statefulsets": ("StatefulSet", True, True),
    "batch/v1/jobs": ("Job", True, True),
    "autoscaling/v2/horizontalpodautoscalers": ("HorizontalPodAutoscaler", True, True),
    "networking.k8s.io/v1/networkpolicies": ("NetworkPolicy", True, False),
    "policy/v1/poddisruptionbudgets": ("PodDisruptionBudget", True, True),
    "rbac.authorization.k8s.io/v1/roles": ("Role", True, False),
    "rbac.authorization.k8s.io/v1/rolebindings": ("RoleBinding", True, False),
    "coordination.k8s.io/v1/leases": ("Lease", True, False),
}
MONITORING = {"monitoring.coreos.com/v1/podmonitors": ("PodMonitor", True, False)}
KUEUE_V1BETA1 = {
    "kueue.x-k8s.io/v1beta1/workloads": ("Workload", True, True),
    "kueue.x-k8s.io/v1beta1/resourceflavors": ("ResourceFlavor", False, False),
    "kueue.x-k8s.io/v1beta1/localqueues": ("LocalQueue", True, True),
    "kueue.x-k8s.io/v1beta1/admissionchecks": ("AdmissionCheck", False, True),
    "kueue.x-k8s.io/v1beta1/workloadpriorityclasses": ("WorkloadPriorityClass", False, False),
    "scheduling.k8s.io/v1/priorityclasses": ("PriorityClass", False, False),
}
"""Kueue before v0.15 (only ``v1beta1``), with the core PriorityClass API."""
KUEUE = {
    "kueue.x-k8s.io/v1beta2/workloads": ("Workload", True, True),
    "kueue.x-k8s.io/v1beta2/resourceflavors": ("ResourceFlavor", False, False),
    "kueue.x-k8s.io/v1beta2/localqueues": ("LocalQueue", True, True),
    "kueue.x-k8s.io/v1beta2/admissionchecks": ("AdmissionCheck", False, True),
    "kueue.x-k8s.io/v1beta2/workloadpriorityclasses": ("WorkloadPriorityClass", False, False),
    "scheduling.k8s.io/v1/priorityclasses": ("PriorityClass", False, False),
}
"""Kueue serving ``v1beta2`` (the emulator stores each version apart: declare one of the two)."""
GROUPS = {
    "leaderworkerset.x-k8s.io/v1/leaderworkersets": ("LeaderWorkerSet", True, True),
}
COSCHEDULING = {"scheduling.x-k8s.io/v1alpha1/podgroups": ("PodGroup", True, True)}
PEERING = {
    "kopf.dev/v1/clusterkopfpeerings": ("ClusterKopfPeering", False, False),
    "kopf.dev/v1/kopfpeerings": ("KopfPeering", True, False),
}

OPERATOR_USER = "system:serviceaccount:aflow-rl:aflow-rl"
"""Who the operator's requests come from, in a refusal's message."""

DEFAULTED = {"trainingruns"}
"""Resources whose CRD carries defaults: stored with them filled in (see the module docstring)."""

_VERBS = {"create", "delete", "get", "list", "patch", "update", "watch"}
APPLY_PATCH = "application/apply-patch+yaml"
# Metadata the server owns: never a field of any manager.
_SERVER_META = {
    "name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
    "managedFields", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink",
}  # fmt: skip

Path = tuple[str, ...]


def _leaves(obj: Any, prefix: Path = ()) -> dict[Path, Any]:
    """Every owned leaf of an object: scalars, lists (atomic) and empty maps, by path."""
    out: dict[Path, Any] = {}
    if isinstance(obj, dict) and obj:
        for key, value in obj.items():
            if not prefix and key in {"apiVersion", "kind", "status"}:
                continue
            if prefix == ("metadata",) and key in _SERVER_META:
                continue
            out.update(_leaves(value, (*prefix, key)))
    elif prefix:
        out[prefix] = obj
    return out


def _get(obj: Any, path: Path) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return _ABSENT
        obj = obj[key]
    return obj


def _set(obj: dict[str, Any], path: Path, value: Any) -> None:
    for key in path[:-1]:
        if not isinstance(obj.get(key), dict):
            obj[key] = {}
        obj = obj[key]
    obj[path[-1]] = copy.deepcopy(value)


def _delete(obj: dict[str, Any], path: Path) -> None:
    parents = []
    node: Any = obj
    for key in path[:-1]:
        if not isinstance(node, dict) or key not in node:
            return
        parents.append((node, key))
        node = node[key]
    if isinstance(node, dict):
        node.pop(path[-1], None)
    for parent, key in reversed(parents):  # prune maps the removal emptied
        if parent[key] == {}:
            del parent[key]
        else:
            break


def _related(a: Path, b: Path) -> bool:
    return a[: len(b)] == b or b[: len(a)] == a


def _fields_v1(paths: set[Path]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path in sorted(paths):
        node = tree
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return tree


def _graceful(resource: kmock.resource, obj: dict[str, Any]) -> bool:
    """Whether deleting the object starts a graceful termination (a pod bound to a node)
    rather than removing it."""
    if resource.plural != "pods" or obj["metadata"].get("deletionTimestamp"):
        return False
    return bool((obj.get("spec") or {}).get("nodeName")) and _grace(obj) > 0


def _grace(pod: dict[str, Any]) -> int:
    return int((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))


class _Absent:
    pass


_ABSENT = _Absent()


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _essence(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in {"metadata", "status"}}


def _selector_matches(selector: str | None, labels: dict[str, str]) -> bool:
    if not selector:
        return True
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.strip().lstrip("="):
            return False
    return True


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    """kmock's Kubernetes emulator with the API-server semantics listed in the module docstring."""

    _versions: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1), init=False)
    _owners: dict[Any, dict[str, tuple[str, set[Path]]]] = attrs.field(factory=dict, init=False)
    """Per object: manager -> (operation "Apply" | "Update", the fields it owns)."""
    _failures: list[tuple[str, str, int]] = attrs.field(factory=list, init=False)
    writes: list[tuple[str, str, str | None, str | None]] = attrs.field(factory=list, init=False)
    """Every write served: (method, plural, namespace, name)."""
    created: list[tuple[str, str | None, str]] = attrs.field(factory=list, init=False)
    """Every creation (POST, or an apply of a missing object): (plural, namespace, name)."""
    changed: list[tuple[str, str | None, str]] = attrs.field(factory=list, init=False)
    """Every write that changed an existing object: (plural, namespace, name)."""

    policy: Policy | None = None
    """The operator's permissions (None: everything is allowed)."""
    refused: list[tuple[str, str, str, str | None, str | None]] = attrs.field(
        factory=list, init=False
    )
    """Every operator request refused by :attr:`policy`: (verb, group, resource, namespace,
    name)."""

    def fail_next(self, method: str, plural: str, status: int = 500, *, times: int = 1) -> None:
        """Answer the next ``times`` ``method`` requests on ``plural`` (e.g. "POST", "jobs")
        with an error."""
        self._failures += [(method.upper(), plural, status)] * times

    def clear_failures(self) -> None:
        """Forget the failures still to inject."""
        self._failures.clear()

    def count_created(self, plural: str, name: str | None = None) -> int:
        """How many times an object of ``plural`` (and ``name``) was created."""
        return sum(1 for p, _, n in self.created if p == plural and name in (None, n))

    def count_changed(self, plural: str, name: str | None = None) -> int:
        """How many writes changed an existing object of ``plural`` (and ``name``)."""
        return sum(1 for p, _, n in self.changed if p == plural and name in (None, n))

    def count_writes(self, method: str, plural: str, name: str | None = None) -> int:
        """How many ``method`` requests on ``plural`` (and ``name``) were served."""
        return sum(
            1
            for m, p, _, n in self.writes
            if m == method.upper() and p == plural and (name is None or n == name)
        )

    def declare(self, resources: dict[str, tuple[str, bool, bool]]) -> None:
        """Serve these resources in discovery (plural path -> kind, namespaced, status)."""
        for key, (kind, namespaced, status) in resources.items():
            self.resources[key] = kmock.ResourceInfo(
                kind=kind,
                namespaced=namespaced,
                singular=kind.lower(),
                verbs=_VERBS,
                subresources={"status"} if status else set(),
            )

    # ---- helpers for tests -----------------------------------------------------------------

    def read(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The stored object, or None when absent or deleted."""
        key = (kmock.resource(resource), namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    def all(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every live object of a resource (in one namespace, or all)."""
        wanted = kmock.resource(resource)
        return [
            copy.deepcopy(obj.raw)
            for (res, ns, _), obj in self.objects.items()
            if res == wanted and not obj.deleted and (namespace is None or ns == namespace)
        ]

    def versions(self, resource: str, namespace: str | None, name: str) -> int:
        """How many versions the object went through (creations and writes)."""
        key = (kmock.resource(resource), namespace, name)
        return len([v for v in self.objects[key].history if v is not None])

    async def put_object(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create an object directly (e.g. a Node), as if a controller did."""
        res = kmock.resource(resource)
        meta = obj.setdefault("metadata", {})
        async with self._lock:
            stored = self._stamp_new(res, meta.get("namespace"), obj, keep_status=True)
            self.objects[(res, meta.get("namespace"), meta["name"])] = stored
            await self._buses[res].put({"type": "ADDED", "object": copy.deepcopy(stored)})
        return stored

    async def set_status(
        self, resource: str, namespace: str | None, name: str, status: dict[str, Any]
    ) -> None:
        """Replace an object's status, as its controller (or the kubelet) would."""
        res = kmock.resource(resource)
        async with self._lock:
            obj = self.objects[(res, namespace, name)]
            new = copy.deepcopy(obj.raw)
            new["status"] = status
            new["metadata"]["resourceVersion"] = str(next(self._versions))
            obj.create(new)  # a new version of the same object
            await self._buses[res].put({"type": "MODIFIED", "object": copy.deepcopy(new)})

    async def patch_object(
        self, resource: str, namespace: str | None, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch an object as a user would (``kubectl patch --type merge``)."""
        res = kmock.resource(resource)
        async with self._lock:
            new = self._apply_update(res, namespace, name, patch, None)
            await self._updated(res, new)
        return new

    async def _updated(self, resource: kmock.resource, obj: dict[str, Any]) -> None:
        """Announce an update; an object being deleted goes once its last finalizer is gone
        (a pod in its grace period only once its termination is finished)."""
        meta = obj["metadata"]
        graceful = int(meta.get("deletionGracePeriodSeconds") or 0) > 0
        if meta.get("deletionTimestamp") and not graceful and not meta.get("finalizers"):
            await self._remove((resource, meta.get("namespace"), meta["name"]), obj)
        else:
            await self._buses[resource].put({"type": "MODIFIED", "object": copy.deepcopy(obj)})

    async def delete_object(self, resource: str, namespace: str | None, name: str) -> None:
        """Delete an object as a user would (``kubectl delete``)."""
        res = kmock.resource(resource)
        async with self._lock:
            await self._apply_delete(res, namespace, name)

    # ---- the kubelet's and the workload controllers' part -----------------------------------

    async def _put(self, res: kmock.resource, obj: dict[str, Any], *, new: bool) -> None:
        """Store a version of an object written by a controller (lock held)."""
        meta = obj["metadata"]
        key = (res, meta.get("namespace"), meta["name"])
        if new:
            obj = self._stamp_new(res, meta.get("namespace"), obj, keep_status=True)
            self.objects[key] = obj
        else:
            obj["metadata"]["resourceVersion"] = str(next(self._versions))
            self.objects[key].create(obj)
        kind = "ADDED" if new else "MODIFIED"
        await self._buses[res].put({"type": kind, "object": copy.deepcopy(obj)})

    def _owner_of(self, pod: dict[str, Any]) -> tuple[kmock.resource, dict[str, Any]] | None:
        for ref in pod["metadata"].get("ownerReferences") or []:
            for (res, _, _), stored in self.objects.items():
                if not stored.deleted and stored.raw["metadata"].get("uid") == ref.get("uid"):
                    return res, copy.deepcopy(stored.raw)
        return None

    def _pods_of(self, owner: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            pod
            for pod in self.all("v1/pods", owner["metadata"].get("namespace"))
            if emulated_pods.owned_by(pod, owner)
        ]

    async def _refresh(self, res: kmock.resource, owner: dict[str, Any]) -> None:
        """Write the owner's status from its pods, as its controller would (lock held)."""
        if owner.get("kind") not in {"Deployment", "StatefulSet", "Job", "LeaderWorkerSet"}:
            return
        status = emulated_pods.owner_status(owner, self._pods_of(owner))
        if status != owner.get("status"):
            await self._put(res, {**owner, "status": status}, new=False)

    async def _pod_changed(self, pod: dict[str, Any]) -> None:
        found = self._owner_of(pod)
        if found is not None:
            await self._refresh(*found)

    def _owner(self, resource: str, namespace: str | None, name: str) -> dict[str, Any]:
        owner = self.read(resource, namespace, name)
        assert owner is not None, f"{resource} {namespace}/{name} does not exist"
        return owner

    async def refresh_status(self, resource: str, namespace: str | None, name: str) -> None:
        """Write a Deployment's, StatefulSet's, Job's or LeaderWorkerSet's status from its pods,
        as its controller would (:func:`emulated_pods.owner_status`)."""
        async with self._lock:
            await self._refresh(kmock.resource(resource), self._owner(resource, namespace, name))

    async def start_pods(
        self,
        resource: str,
        namespace: str,
        name: str,
        count: int = 1,
        *,
        ready: bool = True,
        node: str | None = "node-1",
    ) -> list[str]:
        """Create ``count`` more pods of a workload (from its template, owned by it, on
        ``node``), running and ``ready`` or running but not ready (a startup or readiness
        probe failing); the owner's status follows. Returns the pods' names."""
        pods = kmock.resource("v1/pods")
        names = []
        async with self._lock:
            owner = self._owner(resource, namespace, name)
            for _ in range(count):
                pod_name = f"{name}-{next(self._versions)}"
                pod = emulated_pods.make_pod(owner, pod_name, is_ready=ready, node=node)
                await self._put(pods, pod, new=True)
                names.append(pod_name)
            await self._refresh(kmock.resource(resource), owner)
        return names

    async def start_lws_group(
        self,
        namespace: str,
        name: str,
        group: int,
        *,
        unready_workers: int = 0,
        node: str | None = "node-1",
    ) -> list[str]:
        """Create the pods of one group of a LeaderWorkerSet (its leader ``<name>-<group>``
        and ``size - 1`` workers ``<name>-<group>-<i>``), the last ``unready_workers``
        workers running but not ready; the LeaderWorkerSet's ``readyReplicas`` follows."""
        res = "leaderworkerset.x-k8s.io/v1/leaderworkersets"
        pods = kmock.resource("v1/pods")
        names = []
        async with self._lock:
            owner = self._owner(res, namespace, name)
            size = int(owner["spec"].get("leaderWorkerTemplate", {}).get("size", 1))
            for index in range(size):
                pod_name = f"{name}-{group}" + (f"-{index}" if index else "")
                labels = {
                    emulated_pods.LWS_NAME: name,
                    emulated_pods.LWS_GROUP: str(group),
                    emulated_pods.LWS_WORKER: str(index),
                    emulated_pods.LWS_SIZE: str(size),
                }
                is_ready = index == 0 or index < size - unready_workers
                pod = emulated_pods.make_pod(
                    owner, pod_name, is_ready=is_ready, node=node, labels=labels, worker=index > 0
                )
                await self._put(pods, pod, new=True)
                names.append(pod_name)
            await self._refresh(kmock.resource(res), owner)
        return names

    async def set_pod_ready(self, namespace: str, name: str, ready: bool = True) -> None:
        """The kubelet's probes: the pod (still running) becomes ready, or not ready."""
        pods = kmock.resource("v1/pods")
        async with self._lock:
            pod = self._owner("v1/pods", namespace, name)
            pod["status"] = emulated_pods.pod_status(is_ready=ready)
            await self._put(pods, pod, new=False)
            await self._pod_changed(pod)

    async def terminate_pod(self, namespace: str, name: str, grace_s: int = 30) -> None:
        """Start a pod's graceful termination (as ``kubectl delete pod`` or a controller's
        scale-down does): ``deletionTimestamp`` set, the pod not ready but still there and
        still counted where its controller counts terminating pods."""
        async with self._lock:
            await self._terminate(self._owner("v1/pods", namespace, name), grace_s)

    async def _terminate(self, pod: dict[str, Any], grace_s: int) -> None:
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            return
        when = datetime.datetime.now(tz=datetime.UTC) + datetime.timedelta(seconds=grace_s)
        meta["deletionTimestamp"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
        meta["deletionGracePeriodSeconds"] = grace_s
        pod["status"] = {**emulated_pods.pod_status(is_ready=False), "phase": "Running"}
        await self._put(kmock.resource("v1/pods"), pod, new=False)
        await self._pod_changed(pod)

    async def finish_termination(self, namespace: str, name: str | None = None) -> list[str]:
        """The kubelet confirms that a terminating pod (or, without ``name``, every
        terminating pod of the namespace) stopped: it goes, unless finalizers hold it (then it
        goes when they are removed). Returns the pods that went."""
        gone = []
        async with self._lock:
            for pod in self.all("v1/pods", namespace):
                meta = pod["metadata"]
                if not meta.get("deletionTimestamp") or name not in (None, meta["name"]):
                    continue
                if meta.get("finalizers"):  # stays until they are removed
                    if meta.get("deletionGracePeriodSeconds"):
                        meta["deletionGracePeriodSeconds"] = 0
                        await self._put(kmock.resource("v1/pods"), pod, new=False)
                    continue
                await self._remove((kmock.resource("v1/pods"), namespace, meta["name"]), pod)
                gone.append(meta["name"])
                await self._pod_changed(pod)
        return gone

    def pods_of(self, resource: str, namespace: str, name: str) -> list[dict[str, Any]]:
        """The pods a workload owns, terminating ones included."""
        return self._pods_of(self._owner(resource, namespace, name))

    async def play_controller(
        self,
        resource: str,
        namespace: str,
        name: str,
        *,
        ready: bool = True,
        node: str | None = "node-1",
        grace_s: int = 30,
    ) -> None:
        """One step of a workload's controller: start the pods its spec wants and it lacks
        (ready or not), start terminating the surplus (a scale-down, a suspended Job: the
        pods stay, terminating, until :meth:`finish_termination`), write its status."""
        owner = self._owner(resource, namespace, name)
        live = [p for p in self._pods_of(owner) if not emulated_pods.terminating(p)]
        wanted = emulated_pods.desired_pods(owner)
        if len(live) < wanted:
            await self.start_pods(
                resource, namespace, name, wanted - len(live), ready=ready, node=node
            )
            return
        async with self._lock:
            for pod in live[wanted:]:
                await self._terminate(pod, grace_s)
            await self._refresh(kmock.resource(resource), self._owner(resource, namespace, name))

    def operator_requests(self) -> set[tuple[str, str, str]]:
        """(verb, API group, resource[/subresource]) of every resource request the operator
        made: kopf's and its own client's (told apart from the tests' by their User-Agent)."""
        verbs = {"POST": "create", "PATCH": "patch", "DELETE": "delete", "PUT": "update"}
        seen = set()
        for request in self:
            agent = (request.headers or {}).get("User-Agent", "")
            resource = request.resource
            if not agent.startswith(("kopf/", "aflowrl-operator/")) or resource is None:
                continue
            if resource.plural is None:  # discovery
                continue
            method = str(getattr(request.method, "value", request.method)).upper()
            if method == "GET":
                watching = (request.params or {}).get("watch") == "true"
                verb = "watch" if watching else "get" if request.name else "list"
            else:
                verb = verbs[method]
            name = resource.plural + (f"/{request.subresource}" if request.subresource else "")
            seen.add((verb, resource.group or "", name))
        return seen

    # ---- RBAC ----------------------------------------------------------------------------------

    @staticmethod
    def _from_operator(request: rendering.Request) -> bool:
        agent = (request.headers or {}).get("User-Agent", "")
        return agent.startswith(("kopf/", "aflowrl-operator/"))

    def _authorize(self, request: rendering.Request, verb: str | None = None) -> None:
        """Refuse (403) an operator request the policy does not grant."""
        resource = request.resource
        if self.policy is None or resource is None or resource.plural is None:
            return  # discovery is open to every authenticated user
        if not self._from_operator(request):
            return
        method = str(getattr(request.method, "value", request.method)).upper()
        watching = (request.params or {}).get("watch") == "true"
        verb = verb or request_verb(method, named=request.name is not None, watching=watching)
        group = resource.group or ""
        plural = resource.plural + (f"/{request.subresource}" if request.subresource else "")
        if self.policy.allows(verb, group, plural, request.namespace, request.name):
            return
        self.refused.append((verb, group, plural, request.namespace, request.name))
        qualified = f"{resource.plural}.{group}" if group else resource.plural
        what = f'{qualified} "{request.name}"' if request.name else qualified
        scope = (
            f' in the namespace "{request.namespace}"'
            if request.namespace
            else (" at the cluster scope")
        )
        raise kmock.KubernetesError(
            status=403,
            reason="Forbidden",
            message=(
                f'{what} is forbidden: User "{OPERATOR_USER}" cannot {verb} resource '
                f'"{plural}" in API group "{group}"{scope}'
            ),
            details={"name": request.name or "", "group": group, "kind": resource.plural},
        )

    def count_refused(self, verb: str | None = None, resource: str | None = None) -> int:
        """How many operator requests were refused (with this verb, on this resource)."""
        return sum(
            1 for v, _, r, _, _ in self.refused if verb in (None, v) and resource in (None, r)
        )

    # ---- the API server's writes -------------------------------------------------------------

    def _has_status_subresource(self, resource: kmock.resource) -> bool:
        return resource in self.resources and "status" in self.resources[resource].subresources

    def _stamp_new(
        self,
        resource: kmock.resource,
        namespace: str | None,
        data: dict[str, Any],
        *,
        keep_status: bool = False,
    ) -> dict[str, Any]:
        obj = defaulted(data) if resource.plural in DEFAULTED else copy.deepcopy(data)
        if not keep_status and self._has_status_subresource(resource):
            obj.pop("status", None)
        meta = obj.setdefault("metadata", {})
        if namespace is not None:
            meta["namespace"] = namespace
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        meta["resourceVersion"] = str(next(self._versions))
        meta["generation"] = 1
        return obj

    def _apply_update(
        self,
        resource: kmock.resource,
        namespace: str | None,
        name: str,
        patch: Any,
        subresource: str | None,
    ) -> dict[str, Any]:
        key = (resource, namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            raise kmock.KubernetesObjectNotFoundError()
        old = copy.deepcopy(self.objects[key].raw)
        meta_patch = patch.get("metadata") if isinstance(patch, dict) else None
        expected = (meta_patch or {}).get("resourceVersion")
        if expected is not None and expected != old["metadata"].get("resourceVersion"):
            raise kmock.KubernetesError(  # optimistic concurrency, as the API server does
                status=409, reason="Conflict", message=f"{name}: the object has been modified"
            )
        try:
            patched = dict(dicts.patch_dict(old, patch))
        except (jsonpatch.JsonPatchConflict, jsonpatch.JsonPatchTestFailed) as exc:
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from None
        patched = defaulted(patched) if resource.plural in DEFAULTED else copy.deepcopy(patched)
        if self._has_status_subresource(resource):
            if subresource == "status":
                patched = {**old, "status": patched.get("status")}
                if patched["status"] is None:
                    patched.pop("status")
            elif "status" in old:
                patched["status"] = old["status"]
            else:
                patched.pop("status", None)
        meta = patched.setdefault("metadata", {})
        for fixed in ("uid", "creationTimestamp", "namespace", "name"):
            if fixed in old["metadata"]:
                meta[fixed] = old["metadata"][fixed]
        generation = int(old["metadata"].get("generation", 1))
        meta["generation"] = generation + (_essence(patched) != _essence(old))
        meta["resourceVersion"] = str(next(self._versions))
        self.objects[key].create(patched)  # appends a new version
        return patched

    async def _apply_delete(
        self, resource: kmock.resource, namespace: str | None, name: str
    ) -> dict[str, Any]:
        key = (resource, namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            raise kmock.KubernetesObjectNotFoundError()
        obj = copy.deepcopy(self.objects[key].raw)
        meta = obj["metadata"]
        if _graceful(resource, obj):
            await self._terminate(obj, _grace(obj))
            return self.read_key(key) or obj
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = _now()
                meta["resourceVersion"] = str(next(self._versions))
                self.objects[key].create(obj)
                await self._buses[resource].put({"type": "MODIFIED", "object": obj})
            return obj
        await self._remove(key, obj)
        return obj

    async def _remove(self, key: Any, obj: dict[str, Any]) -> None:
        resource = key[0]
        self.objects[key].delete()
        await self._buses[resource].put({"type": "DELETED", "object": obj})
        uid = obj["metadata"].get("uid")
        for child_key, child in list(self.objects.items()):
            if child.deleted:
                continue
            owners = child.raw.get("metadata", {}).get("ownerReferences", [])
            if any(ref.get("uid") == uid for ref in owners):
                # The garbage collector's DELETE: a pod on a node terminates within its grace,
                # and finalizers hold any dependent.
                await self._apply_delete(*child_key)

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        resource = request.resource
        self._authorize(request)
        if resource is None or request.action not in {
            enums.action.CREATE,
            enums.action.UPDATE,
            enums.action.DELETE,
        }:
            return await kmock.KubernetesScaffold._handle(self, request)
        method = str(getattr(request.method, "value", request.method)).upper()
        for failure in self._failures:
            if failure[:2] == (method, resource.plural):
                self._failures.remove(failure)
                raise kmock.KubernetesError(
                    status=failure[2], reason="InternalError", message="injected failure"
                )
        async with self._lock:
            if request.action == enums.action.CREATE:
                data = copy.deepcopy(request.data or {})
                meta = data.setdefault("metadata", {})
                if not meta.get("name") and meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                namespace = request.namespace or meta.get("namespace")
                key = (resource, namespace, meta.get("name"))
                if key in self.objects and not self.objects[key].deleted:
                    raise kmock.KubernetesError(
                        status=409, reason="AlreadyExists", message=f"{key[2]} already exists"
                    )
                obj = self._stamp_new(resource, namespace, data)
                self._owners[key] = {}
                self._record_update(key, {}, obj, self._manager(request))
                self.objects[key] = obj
                self.created.append((str(resource.plural), namespace, str(key[2])))
                self.writes.append((method, str(resource.plural), namespace, key[2]))
                await self._buses[resource].put({"type": "ADDED", "object": copy.deepcopy(obj)})
                result = obj
            elif request.action == enums.action.UPDATE and request.name is not None:
                self.writes.append((method, str(resource.plural), request.namespace, request.name))
                content_type = (request.headers or {}).get("Content-Type", "")
                if method == "PATCH" and content_type.startswith(APPLY_PATCH):
                    if self.read_key((resource, request.namespace, request.name)) is None:
                        self._authorize(request, "create")  # an apply that creates
                    result, created, changed = self._server_side_apply(resource, request)
                    where = (str(resource.plural), request.namespace, str(request.name))
                    (self.created if created else self.changed if changed else []).append(where)
                    if created:
                        await self._buses[resource].put(
                            {"type": "ADDED", "object": copy.deepcopy(result)}
                        )
                        return aiohttp.web.json_response(result, status=201)
                    if not changed:  # a no-op apply writes nothing and notifies nobody
                        return aiohttp.web.json_response(result)
                else:
                    key = (resource, request.namespace, request.name)
                    before = self.read_key(key)
                    result = self._apply_update(
                        resource, request.namespace, request.name, request.data, request.subresource
                    )
                    if request.subresource is None and before is not None:
                        self._record_update(key, before, result, self._manager(request))
                        result = self._render_managed(key, result)
                    if before is not None and _essence(before) != _essence(result):
                        self.changed.append(
                            (str(resource.plural), request.namespace, str(request.name))
                        )
                await self._updated(resource, result)
            elif request.action == enums.action.DELETE and request.name is not None:
                self.writes.append((method, str(resource.plural), request.namespace, request.name))
                result = await self._apply_delete(resource, request.namespace, request.name)
            else:
                return await kmock.KubernetesScaffold._handle(self, request)
        return aiohttp.web.json_response(result)

    # ---- server-side apply -------------------------------------------------------------------

    def read_key(self, key: Any) -> dict[str, Any] | None:
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    def managers(self, resource: str, namespace: str | None, name: str) -> dict[str, set[Path]]:
        """Who owns which fields of an object (manager -> field paths)."""
        key = (kmock.resource(resource), namespace, name)
        return {m: set(fields) for m, (_, fields) in self._owners.get(key, {}).items()}

    @staticmethod
    def _manager(request: rendering.Request) -> str:
        given = (request.params or {}).get("fieldManager")
        if given:
            return str(given)
        agent = (request.headers or {}).get("User-Agent", "unknown")
        return agent.split("/", 1)[0]

    def _record_update(
        self, key: Any, before: dict[str, Any], after: dict[str, Any], manager: str
    ) -> None:
        """A plain write: its manager owns the fields it changed, and nobody else does."""
        old, new = _leaves(before), _leaves(after)
        changed = {p for p in new if old.get(p, _ABSENT) != new[p]}
        owners = self._owners.setdefault(key, {})
        for _, fields in list(owners.values()):
            fields -= {p for p in fields if any(_related(p, c) for c in changed)}
            fields -= {p for p in fields if p not in new}
        op, fields = owners.get(manager, ("Update", set()))
        owners[manager] = ("Update" if op == "Update" else op, fields | changed)

    def _render_managed(self, key: Any, obj: dict[str, Any]) -> dict[str, Any]:
        entries = [
            {
                "manager": manager,
                "operation": op,
                "apiVersion": obj.get("apiVersion", "v1"),
                "fieldsType": "FieldsV1",
                "fieldsV1": _fields_v1(fields),
                "time": _now(),
            }
            for manager, (op, fields) in sorted(self._owners.get(key, {}).items())
            if fields
        ]
        obj["metadata"]["managedFields"] = entries
        self.objects[key].raw["metadata"]["managedFields"] = copy.deepcopy(entries)
        return obj

    def _server_side_apply(
        self, resource: kmock.resource, request: rendering.Request
    ) -> tuple[dict[str, Any], bool, bool]:
        params = request.params or {}
        manager = params.get("fieldManager")
        if not manager:
            raise kmock.KubernetesError(
                status=422, reason="Invalid", message="fieldManager is required for apply"
            )
        force = params.get("force") == "true"
        config = request.data if isinstance(request.data, dict) else yaml.safe_load(request.text)
        key = (resource, request.namespace, request.name)
        live = self.read_key(key)
        applied = _leaves(config)
        if live is None:
            obj = self._stamp_new(resource, request.namespace, config)
            obj.setdefault("metadata", {})["name"] = request.name
            self._owners[key] = {manager: ("Apply", set(applied))}
            self.objects[key] = obj
            return self._render_managed(key, obj), True, True
        owners = self._owners.setdefault(key, {})
        conflicts = sorted(
            (path, other)
            for other, (_, fields) in owners.items()
            if other != manager
            for path in applied
            if path in fields and _get(live, path) != applied[path]
        )
        if conflicts and not force:
            lines = [f'conflict with "{other}": .{".".join(path)}' for path, other in conflicts]
            raise kmock.KubernetesError(
                status=409,
                reason="Conflict",
                message=f"Apply failed with {len(lines)} conflicts: " + "; ".join(lines),
            )
        new = copy.deepcopy(live)
        for path, value in applied.items():
            _set(new, path, value)
        op, before = owners.get(manager, ("Apply", set()))
        dropped = before - set(applied) if op == "Apply" else set()
        others = {p for m, (_, f) in owners.items() if m != manager for p in f}
        for path in dropped:
            if path in others or any(_related(path, p) for p in applied):
                continue
            _delete(new, path)
        for other, (_, fields) in owners.items():
            if other != manager:
                fields -= {path for path, who in conflicts if who == other}
        owners[manager] = ("Apply", set(applied))
        if self._has_status_subresource(resource) and "status" in live:
            new["status"] = live["status"]
        meta = new["metadata"]
        generation = int(live["metadata"].get("generation", 1))
        meta["generation"] = generation + (_essence(new) != _essence(live))
        changed = new != live
        if changed:
            meta["resourceVersion"] = str(next(self._versions))
            self.objects[key].create(new)
        return self._render_managed(key, new), False, changed

    # ---- reads -------------------------------------------------------------------------------

    def _matching(self, request: rendering.Request) -> list[dict[str, Any]]:
        selector = request.params.get("labelSelector") if request.params else None
        found = []
        for (res, ns, name), obj in self.objects.items():
            if res != request.resource or obj.deleted:
                continue
            if request.namespace is not None and ns != request.namespace:
                continue
            if request.name is not None and name != request.name:
                continue
            labels = obj.raw.get("metadata", {}).get("labels") or {}
            if _selector_matches(selector, labels):
                found.append(copy.deepcopy(obj.raw))
        return found

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        if request.resource not in self._get_resources():
            raise kmock.KubernetesResourceNotFoundError()
        async with self._lock:
            items = self._matching(request)
            version = str(next(self._versions))
        return {"metadata": {"resourceVersion": version}, "items": items}

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        yield b""
        assert request.resource is not None
        bus = self._buses[request.resource]
        marker = await bus.mark()  # subscribe first: nothing written from now on is missed
        try:
            async with self._lock:
                existing = self._matching(request)
            for obj in existing:
                yield {"type": "ADDED", "object": obj}
            async for event in bus.stream(since=marker):
                meta = event.get("object", {}).get("metadata", {})
                if request.namespace is not None and meta.get("namespace") != request.namespace:
                    continue
                if request.name is not None and meta.get("name") != request.name:
                    continue
                yield event
        finally:
            await bus.unmark(marker)
