"""The periodic safety-net pass over every run, without a finalizer on any of them.

kopf's ``@kopf.timer`` and ``@kopf.daemon`` make kopf put its finalizer on every object they
serve (kopf must stop them before the object goes), so with the operator scaled down or
uninstalled ``kubectl delete trainingrun`` would never return. The resync is therefore one
operator-level task, started by the startup handler and stopped by the cleanup handler
(:mod:`aflowrl_operator.handlers`): every ``interval`` seconds it runs a pass over each run in
kopf's index of runs. Nothing holds a run back from deletion; its children go with it through
their owner references.

With kopf's peering, a stand-by replica must not work: kopf pauses its watches, but it does
not pause a task of ours, so the task asks the peering object itself (:func:`leading`), with
kopf's rule: a replica works unless another live peer has a priority as high or higher.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from aflowrl_operator.errors import ApiRejectedError, ApiUnavailableError
from aflowrl_operator.kube import KubeApi

logger = logging.getLogger(__name__)

JsonDict = dict[str, Any]

PassFn = Callable[[JsonDict], Awaitable[None]]
"""Runs one pass over the run a reference body (``metadata`` name, namespace, uid) names."""


@dataclasses.dataclass(frozen=True)
class Peering:
    """This replica in kopf's peering: the peering object's name, where it lives, who we are."""

    name: str
    identity: str
    priority: int
    clusterwide: bool


def leading(peering_object: JsonDict | None, me: Peering, now: datetime.datetime) -> bool:
    """Whether this replica works: kopf's rule over the peers its peering object lists.

    Every peer is ``{priority, lifetime, lastseen}`` under ``status.<identity>``; a peer is
    alive until ``lastseen + lifetime``. Another live peer with a priority as high or higher
    pauses this one (kopf pauses every replica of an equal priority). No peering object: kopf
    stands by too, so this does.
    """
    if peering_object is None:
        return False
    for identity, peer in (peering_object.get("status") or {}).items():
        if identity == me.identity or not isinstance(peer, dict):
            continue
        try:
            seen = datetime.datetime.fromisoformat(str(peer["lastseen"]))
            lifetime = datetime.timedelta(seconds=int(peer.get("lifetime", 60)))
            priority = int(peer.get("priority", 0))
        except (KeyError, TypeError, ValueError):
            continue  # an unreadable peer is no peer
        if seen.tzinfo is None:
            seen = seen.replace(tzinfo=datetime.UTC)
        if seen + lifetime > now and priority >= me.priority:
            return False
    return True


def _run_refs(index: Mapping[Any, Iterable[JsonDict]]) -> list[JsonDict]:
    """The runs of kopf's ``runs`` index (keyed by uid and by (namespace, name)), once each."""
    return [ref for key, refs in list(index.items()) if isinstance(key, str) for ref in refs]


async def _leads(api: KubeApi, me: Peering | None, namespace: str) -> bool:
    if me is None:
        return True  # standalone
    kind = "ClusterKopfPeering" if me.clusterwide else "KopfPeering"
    try:
        found = await api.get(kind, None if me.clusterwide else namespace, me.name)
    except (ApiRejectedError, ApiUnavailableError) as exc:
        logger.warning("cannot read the %s %s, skipping this resync: %s", kind, me.name, exc)
        return False
    return leading(found, me, datetime.datetime.now(tz=datetime.UTC))


async def resync_once(
    api: KubeApi,
    index: Mapping[Any, Iterable[JsonDict]],
    run_pass: PassFn,
    *,
    peering: Peering | None,
) -> int:
    """One pass over every indexed run this replica leads; returns how many passes ran.

    The peering object is read once per resync (per namespace with namespaced peering).
    """
    passes = 0
    leads: dict[str | None, bool] = {}
    for ref in _run_refs(index):
        namespace = ref["metadata"]["namespace"]
        scope = None if peering is None or peering.clusterwide else namespace
        if scope not in leads:
            leads[scope] = await _leads(api, peering, namespace)
        if not leads[scope]:
            continue
        try:
            await run_pass(ref)
        except Exception:  # a bug in one run's pass must not end the resync of the others
            logger.exception("resync pass of %s/%s failed", namespace, ref["metadata"]["name"])
        passes += 1
    return passes


async def resync_forever(
    api: KubeApi,
    index: Mapping[Any, Iterable[JsonDict]],
    run_pass: PassFn,
    *,
    interval_s: float,
    peering: Peering | None,
) -> None:
    """Every ``interval_s`` seconds, :func:`resync_once`; runs until cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        await resync_once(api, index, run_pass, peering=peering)
