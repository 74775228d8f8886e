"""Server-side apply of a run's children: idempotent, minimal writes, safe across restarts.

Every child is written with server-side apply under the field manager ``aflowrl-operator``, on
every pass: the API server keeps which fields the operator set, merges them with fields others
own (defaults, other controllers' annotations, an autoscaler's replica count), removes fields the
operator set before and no longer wants, and takes back a field someone changed by hand
(``force``). An apply that changes nothing writes nothing (the object's ``resourceVersion`` stays),
so a resync costs a GET and an apply per child, and drift is undone on the next pass, whether or
not the spec changed.

A child whose name is taken by an object the run does not control raises
:class:`ChildConflictError` and is never touched. The environment Deployment's ``replicas``
belongs to its HorizontalPodAutoscaler: it is left out of the applied manifest and set under a
field manager of its own (``aflowrl-operator-scale``) only when the operator must move it
(creation, suspend, the spec's bounds), so the HPA's count is never fought over.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from aflowrl_operator.errors import ChildConflictError
from aflowrl_operator.kube import KubeApi
from aflowrl_operator.names import RunRef

logger = logging.getLogger(__name__)

JsonDict = dict[str, Any]

FIELD_MANAGER = "aflowrl-operator"
"""Field manager of every field the operator applies to a child."""
SCALE_MANAGER = "aflowrl-operator-scale"
"""Field manager of the replica counts the operator sets on a workload its HPA also scales."""


def controlled_by(obj: JsonDict, run: RunRef) -> bool:
    """Whether the run is the object's controller (by uid, so a namesake run does not count)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == run.uid and ref.get("controller") for ref in refs)


def _version(obj: JsonDict | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")


async def ensure(
    api: KubeApi,
    run: RunRef,
    manifest: JsonDict,
    *,
    replicas: int | None = None,
    autoscaled: bool = False,
    bounds: tuple[int, int] | None = None,
) -> tuple[JsonDict, str]:
    """Apply one child; returns (live object, "created" | "patched" | "unchanged").

    The object is read first: one the run does not control raises :class:`ChildConflictError`
    and is left alone (an apply would take it over).

    ``replicas``, for workloads, is part of the applied manifest, unless ``autoscaled`` (an HPA
    scales the workload): then it is set by :func:`scale` when the count differs. With
    ``bounds`` (min, max) and ``replicas`` above 0, the count set is the live one as the apply
    returned it, clamped to the bounds: an autoscaler's change made since ``replicas`` was
    computed is kept, not undone.
    """
    kind, name = manifest["kind"], manifest["metadata"]["name"]
    namespace = manifest["metadata"].get("namespace")
    body = copy.deepcopy(manifest)
    if replicas is not None and not autoscaled:
        body["spec"]["replicas"] = replicas
    live = await api.get(kind, namespace, name, api_version=manifest.get("apiVersion"))
    if live is not None and not controlled_by(live, run):
        raise ChildConflictError(
            f"{kind} {name} already exists and is not controlled by TrainingRun {run.name}; "
            "rename the run or delete that object"
        )
    applied = await api.apply(body, field_manager=FIELD_MANAGER)
    outcome = "created" if live is None else "unchanged"
    if live is not None and _version(applied) != _version(live):
        outcome = "patched"  # the spec changed, or a hand edit was taken back
    if outcome != "unchanged":
        logger.info("%s %s %s/%s", outcome, kind, namespace, name)
    live = applied
    if replicas is not None and autoscaled:
        if bounds is not None and replicas > 0:
            count = (live.get("spec") or {}).get("replicas") or bounds[0]
            replicas = min(max(int(count), bounds[0]), bounds[1])
        if await scale(api, live, replicas):
            outcome = "patched" if outcome == "unchanged" else outcome
    return live, outcome


async def scale(api: KubeApi, live: JsonDict, replicas: int) -> bool:
    """Set an autoscaled workload's ``spec.replicas`` unless it has that count; True if written."""
    if (live.get("spec") or {}).get("replicas") == replicas:
        return False
    meta = live["metadata"]
    body = {
        "apiVersion": live["apiVersion"],
        "kind": live["kind"],
        "metadata": {"name": meta["name"], "namespace": meta.get("namespace")},
        "spec": {"replicas": replicas},
    }
    await api.apply(body, field_manager=SCALE_MANAGER)
    logger.info(
        "scaled %s %s/%s to %d", live["kind"], meta.get("namespace"), meta["name"], replicas
    )
    return True


async def remove(
    api: KubeApi, run: RunRef, kind: str, name: str, *, api_version: str | None = None
) -> bool:
    """Delete a child the spec no longer wants, if the run controls it."""
    live = await api.get(kind, run.namespace, name, api_version=api_version)
    if live is None or not controlled_by(live, run):
        return False
    deleted = await api.delete(kind, run.namespace, name, api_version=api_version)
    if deleted:
        logger.info("deleted %s %s/%s (no longer in the spec)", kind, run.namespace, name)
    return deleted
