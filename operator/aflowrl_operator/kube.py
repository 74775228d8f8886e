"""A small typed async client of the Kubernetes REST API for the kinds the operator manages.

Requests go through the official ``kubernetes`` client's ``ApiClient`` (authentication from the
pod's ServiceAccount or a kubeconfig, TLS, token refresh), run in a worker thread so the kopf
event loop never blocks. Paths come from a fixed table of kinds (:data:`KINDS`), so no discovery
round-trips are needed. Children are written with server-side apply (:meth:`KubeApi.apply`).
Used by :mod:`aflowrl_operator.apply` and :mod:`aflowrl_operator.reconcile`.

Why not kr8s or kubernetes_asyncio: kr8s 0.20 has no server-side apply (merge and JSON patches
only), and kubernetes_asyncio would bring a second generated client and its own configuration
loading next to the ``kubernetes`` package kopf's login already uses; either would replace the
few lines of request plumbing here, not the kind table or the error typing around them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from typing import Any

import kubernetes
import urllib3

from aflowrl import __version__
from aflowrl.config import API_GROUP, API_VERSION, KIND, PLURAL
from aflowrl_operator.errors import ApiRejectedError, ApiUnavailableError

logger = logging.getLogger(__name__)

JsonDict = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Kind:
    """A resource kind and where it lives in the REST API."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str = ""
    ) -> str:
        root = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        parts = [root]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{namespace}")
        parts.append(self.plural)
        if name:
            parts.append(name)
        if subresource:
            parts.append(subresource)
        return "/".join(parts)


KINDS: dict[str, Kind] = {
    k.kind: k
    for k in (
        Kind(f"{API_GROUP}/{API_VERSION}", KIND, PLURAL),
        Kind("v1", "ConfigMap", "configmaps"),
        Kind("v1", "Service", "services"),
        Kind("v1", "ServiceAccount", "serviceaccounts"),
        Kind("v1", "PersistentVolumeClaim", "persistentvolumeclaims"),
        Kind("v1", "Pod", "pods"),
        Kind("v1", "Event", "events"),
        Kind("v1", "Node", "nodes", namespaced=False),
        Kind(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            namespaced=False,
        ),
        Kind("apps/v1", "Deployment", "deployments"),
        Kind("apps/v1", "StatefulSet", "statefulsets"),
        Kind("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets"),
        Kind("batch/v1", "Job", "jobs"),
        Kind("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers"),
        Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
        Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
        Kind("rbac.authorization.k8s.io/v1", "Role", "roles"),
        Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
        Kind("monitoring.coreos.com/v1", "PodMonitor", "podmonitors"),
        Kind("scheduling.x-k8s.io/v1alpha1", "PodGroup", "podgroups"),
        Kind("kueue.x-k8s.io/v1beta2", "Workload", "workloads"),
        Kind("kueue.x-k8s.io/v1beta2", "LocalQueue", "localqueues"),
        Kind("kueue.x-k8s.io/v1beta2", "AdmissionCheck", "admissionchecks", namespaced=False),
        Kind("kueue.x-k8s.io/v1beta2", "ResourceFlavor", "resourceflavors", namespaced=False),
        Kind(
            "kueue.x-k8s.io/v1beta2",
            "WorkloadPriorityClass",
            "workloadpriorityclasses",
            namespaced=False,
        ),
        Kind("scheduling.k8s.io/v1", "PriorityClass", "priorityclasses", namespaced=False),
        Kind("coordination.k8s.io/v1", "Lease", "leases"),
        Kind("kopf.dev/v1", "ClusterKopfPeering", "clusterkopfpeerings", namespaced=False),
        Kind("kopf.dev/v1", "KopfPeering", "kopfpeerings"),
    )
}
"""Every kind the operator reads or writes, by ``kind`` (at its preferred version: a call may
name another version of the same group, e.g. ``kueue.x-k8s.io/v1beta1``)."""


def _kind(kind: str, api_version: str | None = None) -> Kind:
    """The kind, at ``api_version`` when one is given."""
    known = KINDS[kind]
    if api_version is None or api_version == known.api_version:
        return known
    return dataclasses.replace(known, api_version=api_version)


MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


def load_configuration() -> kubernetes.client.Configuration:
    """The in-cluster ServiceAccount configuration, else the current kubeconfig context."""
    config = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=config)  # type: ignore[no-untyped-call]
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(client_configuration=config)  # type: ignore[no-untyped-call]
    return config


class KubeApi:
    """Async get / list / create / patch / delete of the kinds in :data:`KINDS`."""

    def __init__(
        self, configuration: kubernetes.client.Configuration, *, timeout_s: float = 30.0
    ) -> None:
        self._client = kubernetes.client.ApiClient(configuration)
        self._client.user_agent = f"aflowrl-operator/{__version__}"
        self._timeout = (min(10.0, timeout_s), timeout_s)

    def close(self) -> None:
        self._client.close()  # type: ignore[no-untyped-call]

    def _request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        method, url, headers, body, _ = self._client.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self._client.call_api(
                method, url, header_params=headers, body=body, _request_timeout=self._timeout
            )
            raw = response.read()  # type: ignore[no-untyped-call]
        except (urllib3.exceptions.HTTPError, OSError, kubernetes.client.ApiException) as exc:
            raise ApiUnavailableError(f"{method} {path}: {exc}") from exc
        try:
            payload = json.loads(raw) if raw else None
        except ValueError:
            payload = {"message": raw[:200].decode(errors="replace")}
        return response.status, payload

    async def _call(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        status, payload = await asyncio.to_thread(self._request, method, path, **kwargs)
        if status == 429 or status >= 500:
            raise ApiUnavailableError(f"{method} {path}: HTTP {status}: {_message(payload)}")
        return status, payload

    @staticmethod
    def _check(method: str, path: str, status: int, payload: Any) -> Any:
        if 200 <= status < 300:
            return payload
        raise ApiRejectedError(status, f"{method} {path}: {_message(payload)}")

    async def get(
        self, kind: str, namespace: str | None, name: str, *, api_version: str | None = None
    ) -> JsonDict | None:
        """The object, or None when it does not exist."""
        path = _kind(kind, api_version).path(namespace, name)
        status, payload = await self._call("GET", path)
        if status == 404:
            return None
        result: JsonDict = self._check("GET", path, status, payload)
        return result

    async def list(
        self,
        kind: str,
        namespace: str | None = None,
        labels: dict[str, str] | None = None,
        *,
        api_version: str | None = None,
    ) -> list[JsonDict]:
        """Objects of a kind (in one namespace, or everywhere), filtered by equal labels."""
        path = _kind(kind, api_version).path(namespace)
        query = []
        if labels:
            query.append(("labelSelector", ",".join(f"{k}={v}" for k, v in labels.items())))
        status, payload = await self._call("GET", path, query=query)
        items: list[JsonDict] = self._check("GET", path, status, payload).get("items") or []
        # Filter here too: a selector the server ignored must not leak foreign objects.
        return [
            item
            for item in items
            if all(
                ((item.get("metadata") or {}).get("labels") or {}).get(k) == v
                for k, v in (labels or {}).items()
            )
        ]

    async def create(self, manifest: JsonDict) -> JsonDict | None:
        """Create an object; None when one of that name already exists (HTTP 409)."""
        kind = _kind(manifest["kind"], manifest.get("apiVersion"))
        path = kind.path(manifest["metadata"].get("namespace"))
        status, payload = await self._call("POST", path, body=manifest)
        if status == 409:
            return None
        result: JsonDict = self._check("POST", path, status, payload)
        return result

    async def patch(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        patch: JsonDict,
        *,
        subresource: str = "",
        api_version: str | None = None,
        field_manager: str | None = None,
    ) -> JsonDict | None:
        """JSON-merge-patch an object (RFC 7386); None when it no longer exists. A patch that
        carries ``metadata.resourceVersion`` fails (HTTP 409) if the object changed since;
        ``field_manager`` names the manager its fields are recorded under."""
        path = _kind(kind, api_version).path(namespace, name, subresource)
        query = [("fieldManager", field_manager)] if field_manager else None
        status, payload = await self._call(
            "PATCH", path, query=query, body=patch, content_type=MERGE_PATCH
        )
        if status == 404:
            return None
        result: JsonDict = self._check("PATCH", path, status, payload)
        return result

    async def apply(
        self, manifest: JsonDict, *, field_manager: str, force: bool = True
    ) -> JsonDict:
        """Server-side apply: create the object or make ``field_manager``'s fields these.

        Fields the manager applied before and left out now are removed (unless another manager
        owns them too); ``force`` takes fields another manager changed (a controller's fields
        are its own). Returns the object as stored.
        """
        meta = manifest["metadata"]
        kind = _kind(manifest["kind"], manifest.get("apiVersion"))
        path = kind.path(meta.get("namespace"), meta["name"])
        query = [("fieldManager", field_manager), ("force", "true" if force else "false")]
        status, payload = await self._call(
            "PATCH", path, query=query, body=json.dumps(manifest), content_type=APPLY_PATCH
        )
        result: JsonDict = self._check("PATCH", path, status, payload)
        return result

    async def delete(
        self, kind: str, namespace: str | None, name: str, *, api_version: str | None = None
    ) -> bool:
        """Delete an object in the background; False when it did not exist."""
        path = _kind(kind, api_version).path(namespace, name)
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        status, payload = await self._call("DELETE", path, body=body)
        if status == 404:
            return False
        self._check("DELETE", path, status, payload)
        return True

    async def has_api(self, group_version: str) -> bool:
        """Whether the cluster serves an API group version (e.g. ``monitoring.coreos.com/v1``)."""
        status, payload = await self._call("GET", f"/apis/{group_version}")
        if status == 404:
            return False
        self._check("GET", f"/apis/{group_version}", status, payload)
        return True


def _message(payload: Any) -> str:
    if isinstance(payload, dict):
        return str(payload.get("message") or payload.get("reason") or payload)
    return str(payload)
