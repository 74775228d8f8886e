"""The kopf handlers of the operator, registered on a registry built per configuration.

One reconcile function (:class:`aflowrl_operator.reconcile.Reconciler`) serves every trigger:
creation, spec and label updates and operator start-up (``resume``) run it and answer a
rejected spec with ``kopf.PermanentError`` (kopf logs it and posts a Warning event). Children
are watched, not polled: an event on any object labelled ``aflowrl.io/run`` (a workload, its
pods, a Service, the Kueue Workload...) runs a pass of the run it belongs to, found by its
owner reference or its label in an index of the runs. A pass over every run every
``resync_interval_s`` is only a safety net (:mod:`aflowrl_operator.resync`): an operator-level
task, not a kopf timer, because kopf puts its finalizer on every object a timer serves. Passes
of one run are serialised by a lock and coalesced (a burst of child events while a pass waits
makes one more pass, not one per event); each pass writes the run's status itself before
releasing the lock, so nothing races.

With ``lease`` set (:mod:`aflowrl_operator.leader`), the replicas elect a leader with a
``coordination.k8s.io/v1`` Lease: every replica watches, only the Lease's holder runs passes
(a stand-by replica's handlers return at once and write nothing), and a replica that starts
leading runs one pass over every run at once, catching up on what it skipped. This is the
guarantee that the once-only writes (Job replacement, Workload deletion, ``spec.suspend``,
Events, status) are made by one replica. With ``peering`` set, kopf's peering
(``ClusterKopfPeering`` or ``KopfPeering`` objects, which the chart creates) lets several
operator replicas run: the one with the highest priority works, the others stand by and take
over when its heartbeat stops (a soft lock: each replica reads the heartbeats once per sweep).

kopf's own bookkeeping lives in ``aflowrl.io/*`` annotations, not in ``status`` (the CRD's status
schema is pruned). No finalizer is added, so ``kubectl delete trainingrun`` never waits for the
operator, running or not: no handler needs the run's last moments (no ``on.delete``, no timer,
no daemon), and children are garbage-collected through their owner references. kopf removes
the finalizer ``aflowrl.io/operator`` that earlier releases (with a timer) put on runs, the
next time it sees each run. Called by :mod:`aflowrl_operator.cli` and by the tests, which
build a registry with their own login and a short resync interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import logging
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

import kopf
import kubernetes

from aflowrl.config import API_GROUP, API_VERSION, KIND, PLURAL, ImageDefaults
from aflowrl_operator import leader, resync
from aflowrl_operator.errors import ApiRejectedError, ApiUnavailableError
from aflowrl_operator.kube import KubeApi, load_configuration
from aflowrl_operator.metrics import OperatorMetrics
from aflowrl_operator.names import RUN_LABEL
from aflowrl_operator.reconcile import Outcome, Reconciler

logger = logging.getLogger(__name__)

LoginFn = Callable[..., kopf.ConnectionInfo | None]


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    """Settings of one operator process."""

    resync_interval_s: float = 120.0
    """Seconds between two passes over a run when nothing happens (a safety net: children are
    watched, so their changes run a pass at once)."""
    request_timeout_s: float = 30.0
    """Timeout of one API request (seconds)."""
    cluster_cache_s: float = 60.0
    """How long node lists and API discovery answers are reused (seconds)."""
    retry_delay_s: float = 10.0
    """Delay before retrying a pass the API server could not serve (seconds)."""
    kube: Callable[[], kubernetes.client.Configuration] = load_configuration
    """Where the operator's own API client gets its configuration."""
    login: LoginFn = kopf.login_via_client
    """How kopf authenticates (the same kubeconfig or ServiceAccount by default)."""
    metrics: OperatorMetrics = dataclasses.field(default_factory=OperatorMetrics)
    """The operator's Prometheus metrics."""
    peering_lifetime_s: int = 60
    """How long a silent peer counts as alive (seconds): a stand-by replica takes over this
    long after the active one stops."""
    manage_runs_without_queue_name: bool = False
    """Kueue's ``manageJobsWithoutQueueName``: a run without the ``kueue.x-k8s.io/queue-name``
    label (and no ``default`` LocalQueue in its namespace) is held until it names a queue,
    instead of running outside Kueue. Set it as Kueue's own configuration says."""
    identity: str = dataclasses.field(
        default_factory=lambda: f"{socket.gethostname()}/{uuid.uuid4().hex[:8]}"
    )
    """This replica's name among kopf's peers: pass it to ``kopf.run`` / ``kopf.operator`` as
    ``identity``, so the resync task can tell itself apart in the peering object."""
    run_images: ImageDefaults = dataclasses.field(default_factory=ImageDefaults)
    """Images of runs that leave ``spec.images.<kind>`` unset (the chart's ``runDefaults``)."""
    lease: leader.LeaseConfig | None = None
    """Leader election through this Lease (None: this replica always works). The Lease's
    ``holderIdentity`` is ``identity`` (the chart sets it to the pod's name)."""


def configure_settings(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    """kopf settings: annotation storage under aflowrl.io, quiet events, bounded watches."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix="aflowrl.io", v1=False
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="aflowrl.io", key="last-handled-configuration", v1=False
    )
    settings.persistence.finalizer = "aflowrl.io/operator"
    settings.posting.level = logging.INFO  # only explicit events: settings.posting.loggers is off
    settings.posting.reporting_component = "aflowrl-operator"
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = config.request_timeout_s
    settings.peering.lifetime = config.peering_lifetime_s
    settings.peering.stealth = True  # no "peering freeze" events on every run


# Children whose events run a pass of their run: (group, version, plural).
WATCHED_CHILDREN: tuple[tuple[str, str | None, str], ...] = (
    ("apps", "v1", "deployments"),
    ("apps", "v1", "statefulsets"),
    ("batch", "v1", "jobs"),
    ("", "v1", "pods"),
    ("", "v1", "services"),
    ("", "v1", "configmaps"),
    ("autoscaling", "v2", "horizontalpodautoscalers"),
    ("kueue.x-k8s.io", None, "workloads"),
    ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets"),
)
"""Every child kind whose changes the status or the run depends on (labelled by the run); no
version: the version the cluster prefers (Kueue's Workload is ``v1beta2`` or ``v1beta1``).

A LeaderWorkerSet's ``readyReplicas`` is written by its controller after the pod events, so
its own events are watched too. Kinds the cluster does not serve (no Kueue, no
LeaderWorkerSet CRD) are not watched: kopf logs one warning per scan of the cluster's APIs
("Unresolved resources cannot be served") and starts watching when the CRD appears; the run
says ``MultiNodeUnavailable`` meanwhile (:mod:`aflowrl_operator.groups`)."""


@dataclasses.dataclass
class _RunLoop:
    """Serialises and coalesces the passes of one run."""

    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    waiting: bool = False


async def _reconcile(
    body: Any,
    memo: kopf.Memo,
    *,
    handler: str,
    strict: bool,
    delay: float,
    coalesce: bool = False,
) -> None:
    """One pass of the run ``body`` names, for ``handler`` (a :data:`metrics.HANDLERS` value,
    which the handler metrics count and time)."""
    reconciler: Reconciler = memo["reconciler"]
    started = time.monotonic()
    result = "error"
    try:
        outcome = await _serialised_pass(body, memo, reconciler, delay=delay, coalesce=coalesce)
        elector: leader.LeaderElector | None = memo.get("elector")
        if outcome is None:
            result = "standby" if elector is not None and not elector.leading else "coalesced"
        else:
            result = "rejected" if outcome.rejection else "ok"
    except kopf.TemporaryError:
        result = "retry"
        raise
    finally:
        reconciler.metrics.handler_calls.labels(handler, result).inc()
        reconciler.metrics.handler_duration.labels(handler).observe(time.monotonic() - started)
    if strict and outcome is not None and outcome.rejection is not None:
        rejection = outcome.rejection
        kopf.warn(body, reason=rejection.reason, message=rejection.message[:1000])
        raise kopf.PermanentError(f"{rejection.reason}: {rejection.message}")


async def _serialised_pass(
    body: Any, memo: kopf.Memo, reconciler: Reconciler, *, delay: float, coalesce: bool
) -> Outcome | None:
    """Run the pass under the run's lock; None when it joined a pass already waiting."""
    loops: dict[str, _RunLoop] = memo["run_loops"]
    loop = loops.setdefault(body["metadata"]["uid"], _RunLoop())
    if coalesce and loop.waiting:
        return None  # a pass that has not started yet will see this change too
    loop.waiting = True
    async with loop.lock:  # read, apply and write status as one step per run
        loop.waiting = False
        elector: leader.LeaderElector | None = memo.get("elector")
        if elector is not None and not elector.leading:
            return None  # a stand-by replica watches and writes nothing
        try:
            return await reconciler.sync(copy.deepcopy(dict(body)))
        except ApiUnavailableError as exc:
            raise kopf.TemporaryError(str(exc), delay=delay) from exc


def build_registry(config: OperatorConfig | None = None) -> kopf.OperatorRegistry:
    """A kopf registry with every handler of the operator, for ``kopf.run`` / ``kopf.operator``."""
    config = config or OperatorConfig()
    registry = kopf.OperatorRegistry()
    resource = (API_GROUP, API_VERSION, PLURAL)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return config.login(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
        configure_settings(settings, config)
        api = KubeApi(config.kube(), timeout_s=config.request_timeout_s)
        memo["reconciler"] = Reconciler(
            api,
            metrics=config.metrics,
            cluster_cache_s=config.cluster_cache_s,
            reporting_instance=config.identity,
            run_images=config.run_images,
            manage_without_queue_name=config.manage_runs_without_queue_name,
        )
        memo["run_loops"] = {}
        peering = None
        if not settings.peering.standalone:
            peering = resync.Peering(
                name=settings.peering.name,
                identity=config.identity,
                priority=settings.peering.priority,
                clusterwide=settings.peering.clusterwide,
            )

        async def run_pass(ref: dict[str, Any]) -> None:
            try:
                await _reconcile(
                    ref,
                    memo,
                    handler="resync",
                    strict=False,
                    delay=config.retry_delay_s,
                    coalesce=True,
                )
            except kopf.TemporaryError as exc:  # the next resync or event retries
                logger.warning("resync pass of %s: %s", ref["metadata"]["name"], exc)

        memo["resync"] = asyncio.create_task(
            resync.resync_forever(
                api,
                kwargs["runs"],  # kopf's live index of the runs (below)
                run_pass,
                interval_s=config.resync_interval_s,
                peering=peering,
            ),
            name="aflowrl resync",
        )
        if config.lease is not None:

            async def catch_up() -> None:  # every run once, as soon as this replica leads
                await resync.resync_once(api, kwargs["runs"], run_pass, peering=peering)

            elector = leader.LeaderElector(
                api, config.lease, config.identity, on_started_leading=catch_up
            )
            memo["elector"] = elector
            memo["election"] = asyncio.create_task(elector.run(), name="aflowrl election")

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        for name in ("election", "resync"):
            task: asyncio.Task[None] | None = memo.get(name)
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        elector: leader.LeaderElector | None = memo.get("elector")
        if elector is not None:  # the next replica takes over now, not after the lease
            await elector.release()
        reconciler: Reconciler | None = memo.get("reconciler")
        if reconciler is not None:
            reconciler.api.close()

    @kopf.on.create(*resource, id="reconcile", registry=registry)
    @kopf.on.resume(*resource, id="reconcile", registry=registry)
    @kopf.on.update(*resource, id="reconcile", field="spec", registry=registry)
    @kopf.on.update(*resource, id="relabel", field="metadata.labels", registry=registry)
    async def reconcile(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await _reconcile(body, memo, handler="reconcile", strict=True, delay=config.retry_delay_s)

    @kopf.index(*resource, id="runs", registry=registry)
    def runs(namespace: str | None, name: str, uid: str, **_: Any) -> dict[Any, dict[str, Any]]:
        ref = {"metadata": {"name": name, "namespace": namespace, "uid": uid}}
        return {uid: ref, (namespace, name): ref}

    async def child_changed(
        labels: kopf.Labels, meta: kopf.Meta, namespace: str | None, memo: kopf.Memo, **kwargs: Any
    ) -> None:
        runs: kopf.Index[Any, dict[str, Any]] = kwargs["runs"]  # the index above
        owners = [
            ref["uid"]
            for ref in meta.get("ownerReferences") or []
            if ref.get("kind") == KIND and ref.get("controller")
        ]
        keys: list[Any] = owners or [(namespace, labels.get(RUN_LABEL))]
        if not any(runs.get(key) for key in keys) and labels.get(RUN_LABEL):
            # The run is gone: its Workload keeps its quota until the last pod is gone.
            reconciler: Reconciler = memo["reconciler"]
            try:
                await reconciler.release_orphaned(namespace or "", labels[RUN_LABEL])
            except (ApiUnavailableError, ApiRejectedError) as exc:  # the next event retries
                kwargs["logger"].warning("releasing a deleted run's Workload: %s", exc)
            return
        for key in keys:
            for run in runs.get(key, ()):
                try:
                    await _reconcile(
                        run,
                        memo,
                        handler="child",
                        strict=False,
                        delay=config.retry_delay_s,
                        coalesce=True,
                    )
                except kopf.TemporaryError as exc:  # the resync or the next event retries
                    kwargs["logger"].warning("pass after a child event: %s", exc)
                return

    for group, version, plural in WATCHED_CHILDREN:
        kopf.on.event(
            group=group,
            version=version,
            plural=plural,
            id="child",
            labels={RUN_LABEL: kopf.PRESENT},
            registry=registry,
        )(child_changed)

    return registry
