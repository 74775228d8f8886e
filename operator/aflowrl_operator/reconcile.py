"""One reconcile pass of a TrainingRun: validate, apply the children, observe them, compute status.

Level-triggered: every pass (on create, update, operator start-up, a child's event, and the
periodic resync)
drives the cluster to what the run's spec says, whatever happened before, so a restart of the
operator in the middle of a pass repeats nothing and duplicates nothing. The pass:

1. validates the spec (:mod:`aflowrl_operator.validation`) and reads the *accepted* spec from
   the run's ConfigMap; a spec that is invalid or changes an immutable field is rejected, and
   the children keep following the accepted spec;
2. under Kueue (the run's ``kueue.x-k8s.io/queue-name`` label), keeps the run's one Workload
   and holds the run (everything at zero, the trainer suspended) until Kueue admits it, placing
   the pods as admitted (flavors' node labels and tolerations, pod set updates); an evicted run
   is held, and once its pods are gone its quota is given back so Kueue requeues the same
   Workload; the Workload's ``PodsReady``, ``active`` (for a user's ``spec.suspend``) and
   ``Finished`` follow the run (:mod:`aflowrl_operator.kueue`); the run's own ``spec.suspend``
   says whether Kueue holds it, as Kueue's job integrations keep their jobs' (written true,
   marked ``aflowrl.io/suspended-by: kueue``, while held; false on admission), and a user's
   unmarked ``spec.suspend`` is never turned off;
3. builds the children (:mod:`aflowrl_operator.children`) for the spec and the scale (suspended,
   finished unless ``trainer.keepPodsAfterEnd`` keeps them, queued, the HPA's environment
   count) and server-side applies each, on every pass, so hand edits are taken back
   (:mod:`.apply`);
4. applies the trainer Job too, apart: its pod template is immutable, so a running Job keeps
   its template, and a suspended idle Job with an outdated one is replaced (it resumes from its
   checkpoint);
5. reads pods and nodes to explain what is not running and what failed (``status.lastError``),
   computes the status (:mod:`aflowrl_operator.status`), writes it to the status subresource
   when it changed, and posts an Event for every condition that changed and for a new
   ``lastError``.

A pass reads the run itself from the API server (not kopf's cached copy), so it always starts
from the status the previous pass wrote.

Called by the kopf handlers in :mod:`aflowrl_operator.handlers`.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import functools
import logging
import time
from collections.abc import Mapping
from typing import Any

from aflowrl.config import API_GROUP, API_VERSION, KIND, ConfigError, ImageDefaults, RunSpec
from aflowrl_operator import capacity, children, groups, kueue, status
from aflowrl_operator.apply import FIELD_MANAGER, controlled_by, ensure, remove
from aflowrl_operator.errors import ApiRejectedError, ApiUnavailableError, ChildConflictError
from aflowrl_operator.kube import KubeApi
from aflowrl_operator.metrics import OperatorMetrics
from aflowrl_operator.names import (
    COMPONENT_LABEL,
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    RUN_LABEL,
    TEMPLATE_HASH,
    RunRef,
    annotation,
)
from aflowrl_operator.validation import (
    Rejection,
    immutable_changes,
    validate,
    with_default_images,
)

logger = logging.getLogger(__name__)

STATUS_REFUSED = "StatusRejected"
"""Reason of the Warning Event about a run whose status the API server refuses."""

JsonDict = dict[str, Any]

MONITORING_API = "monitoring.coreos.com/v1"
REPORTING_COMPONENT = "aflowrl-operator"
"""``reportingComponent`` of the operator's Events."""
_MAX_EVENT_MESSAGE = 1024
"""Longest Event message (what ``kubectl describe`` shows comfortably)."""
_SUSPEND_WRITE_TRIES = 3
"""Writes of a run's spec.suspend tried in one pass, each after reading the run again."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a pass did: the status it computed (operator-owned fields) and whether it wrote it,
    any rejection, and the writes it made to children ("created Deployment demo-rollout"...)."""

    status: JsonDict
    rejection: Rejection | None
    actions: tuple[str, ...] = ()
    status_written: bool = False


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _version(obj: JsonDict | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")


class Reconciler:
    """Reconcile passes against one API server; caches cluster-wide facts for a while."""

    def __init__(
        self,
        api: KubeApi,
        *,
        metrics: OperatorMetrics | None = None,
        cluster_cache_s: float = 60.0,
        reporting_instance: str = REPORTING_COMPONENT,
        run_images: ImageDefaults | None = None,
        manage_without_queue_name: bool = False,
    ) -> None:
        self.api = api
        self._run_images = run_images or ImageDefaults()
        self._instance = reporting_instance
        self.metrics = metrics if metrics is not None else OperatorMetrics()
        self._cache_s = cluster_cache_s
        self._monitoring: tuple[float, bool] | None = None
        self._groups: tuple[float, bool] | None = None
        self._warned_no_monitoring: set[str] = set()
        self._status_refusals: set[str] = set()  # runs whose status the API server refuses
        self._nodes: tuple[float, list[JsonDict]] | None = None
        self._kueue: tuple[float, str] | None = None
        self._kueue_served: tuple[float, bool] | None = None
        self._manage_without_queue_name = manage_without_queue_name
        self._warned_priority: set[tuple[str, str]] = set()

    def _record(self, actions: list[str], kind: str, name: str, action: str) -> None:
        self.metrics.child_writes.labels(kind, action).inc()
        actions.append(f"{action} {kind} {name}")

    # ---- cluster facts --------------------------------------------------------------------

    async def _has_monitoring(self) -> bool:
        now = time.monotonic()
        if self._monitoring is None or now - self._monitoring[0] > self._cache_s:
            self._monitoring = (now, await self.api.has_api(MONITORING_API))
        return self._monitoring[1]

    async def _kueue_version(self) -> str:
        """The Workload API version to speak: ``v1beta2`` where served, else ``v1beta1``."""
        now = time.monotonic()
        if self._kueue is None or now - self._kueue[0] > self._cache_s:
            chosen = kueue.VERSIONS[-1]
            for version in kueue.VERSIONS:
                if await self.api.has_api(f"{kueue.GROUP}/{version}"):
                    chosen = version
                    break
            self._kueue = (now, f"{kueue.GROUP}/{chosen}")
        return self._kueue[1]

    async def _has_groups(self) -> bool:
        """Whether the cluster serves LeaderWorkerSets (cached like the monitoring API)."""
        now = time.monotonic()
        if self._groups is None or now - self._groups[0] > self._cache_s:
            self._groups = (now, await self.api.has_api(groups.LWS_API))
        return self._groups[1]

    async def _cluster_nodes(self) -> list[JsonDict]:
        now = time.monotonic()
        if self._nodes is None or now - self._nodes[0] > self._cache_s:
            try:
                nodes = await self.api.list("Node")
            except ApiRejectedError as exc:  # no RBAC for nodes: the GPU check is skipped
                logger.debug("cannot list nodes, GPU capacity is not checked: %s", exc)
                nodes = []
            self._nodes = (now, nodes)
        return self._nodes[1]

    # ---- the pass ---------------------------------------------------------------------------

    async def _accepted_spec(self, run: RunRef) -> RunSpec | None:
        """The spec the children were last built from (the run's ConfigMap), if any."""
        cm = await self.api.get("ConfigMap", run.namespace, run.config_map)
        if cm is None or not controlled_by(cm, run):
            return None
        text = (cm.get("data") or {}).get("spec.yaml")
        if not text:
            return None
        try:
            return RunSpec.from_yaml(text, source=f"ConfigMap {run.config_map}")
        except ConfigError as exc:  # edited by hand: the current spec replaces it
            logger.warning("ignoring the unreadable accepted spec: %s", exc)
            return None

    async def _ensure_job(
        self,
        run: RunRef,
        manifest: JsonDict,
        live: JsonDict | None,
        *,
        actions: list[str],
    ) -> JsonDict | None:
        """Apply the trainer Job (server-side, like every child), replacing it while it is idle.

        Its pod template is immutable: a suspended Job with no pod and an outdated template is
        deleted and created anew (it resumes from its checkpoint); otherwise the live template
        is applied back, so the rest of the Job (``suspend``, ``activeDeadlineSeconds``...)
        follows the spec while the pods it runs keep theirs.
        """
        if live is not None and not controlled_by(live, run):
            raise ChildConflictError(
                f"Job {run.trainer} already exists and is not controlled by TrainingRun "
                f"{run.name}; rename the run or delete that Job"
            )
        if live is not None and annotation(live, TEMPLATE_HASH) != annotation(
            manifest, TEMPLATE_HASH
        ):
            state = status.job_state(live)
            if state.suspended and state.active == 0 and not state.finished:
                # No trainer pod runs: start over with the new template; it resumes from the
                # checkpoint directory like any restart.
                await self.api.delete("Job", run.namespace, run.trainer)
                self._record(actions, "Job", run.trainer, "deleted")
                logger.info(
                    "replacing the idle Job %s/%s with a new template", run.namespace, run.trainer
                )
                live = None
            else:
                manifest = copy.deepcopy(manifest)
                manifest["spec"]["template"] = live["spec"]["template"]
                manifest["metadata"]["annotations"][TEMPLATE_HASH] = annotation(live, TEMPLATE_HASH)
        if live is not None and status.job_state(live).finished:
            manifest = copy.deepcopy(manifest)
            manifest["spec"]["suspend"] = bool(live["spec"].get("suspend"))  # stays as it ended
        applied = await self.api.apply(manifest, field_manager=FIELD_MANAGER)
        if live is None:
            self._record(actions, "Job", run.trainer, "created")
        elif status.job_state(live).suspended != status.job_state(applied).suspended:
            action = "suspended" if status.job_state(applied).suspended else "resumed"
            self._record(actions, "Job", run.trainer, action)
        elif _version(applied) != _version(live):
            self._record(actions, "Job", run.trainer, "patched")
        return applied

    async def sync(self, body: Mapping[str, Any]) -> Outcome:
        """One reconcile pass over the TrainingRun ``body`` names; writes its status."""
        started = time.monotonic()
        actions: list[str] = []
        try:
            outcome = await self._sync(body, actions)
        except Exception:
            self.metrics.reconciles.labels("error").inc()
            raise
        finally:
            self.metrics.reconcile_duration.observe(time.monotonic() - started)
        self.metrics.reconciles.labels("rejected" if outcome.rejection else "ok").inc()
        return dataclasses.replace(outcome, actions=tuple(actions))

    async def _sync(self, body: Mapping[str, Any], actions: list[str]) -> Outcome:
        meta = body.get("metadata") or {}
        # Read the run afresh: kopf's copy may predate the last pass's status write, and the
        # conditions carry the history the next status depends on.
        current = await self.api.get(KIND, meta["namespace"], meta["name"])
        current_meta = (current or {}).get("metadata") or {}
        if (
            current is None
            or current_meta.get("uid") != meta.get("uid")
            or current_meta.get("deletionTimestamp")
        ):
            return Outcome(status={}, rejection=None)  # deleted (or being deleted): hands off
        run = RunRef(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
        generation = current_meta.get("generation")
        new_spec, rejection = validate(run.name, current.get("spec"))
        if new_spec is not None:
            new_spec = with_default_images(new_spec, self._run_images)
        accepted = await self._accepted_spec(run)
        if new_spec is not None and accepted is not None:
            rejection = immutable_changes(accepted, new_spec)
        spec = new_spec if rejection is None else accepted
        if spec is not None and kueue.suspended_by_kueue(current):
            # The operator's own suspend (the run is held by Kueue) is not the user's.
            spec = spec.model_copy(update={"suspend": False})
        if spec is None:
            observation = status.Observation(spec=None, rejection=rejection)
        else:
            labels = current_meta.get("labels") or {}
            observation = await self._apply_and_observe(
                run,
                spec,
                rejection,
                actions,
                queue=labels.get(KUEUE_QUEUE_LABEL),
                priority=labels.get(KUEUE_PRIORITY_LABEL),
                previous_status=current.get("status") or {},
                body=current,
            )
        new_status = status.compute(observation, current.get("status"), generation, _now())
        written = status.changed(new_status, current.get("status"))
        if written:
            try:
                await self.api.patch(
                    KIND, run.namespace, run.name, {"status": new_status}, subresource="status"
                )
            except ApiRejectedError as exc:
                written = False
                await self._status_refused(run, exc)
            else:
                self._status_refusals.discard(run.uid)
                for type_, reason, message in status.transitions(current.get("status"), new_status):
                    await self._event(run, type_, reason, message)
        if actions:
            await self._event(run, "Normal", "Reconciled", ", ".join(actions))
        return Outcome(status=new_status, rejection=rejection, status_written=written)

    async def release_orphaned(self, namespace: str, run_name: str) -> bool:
        """Take the :data:`kueue.RESOURCE_IN_USE` finalizer off the Workload of a deleted run
        once none of its pods holds resources any more (its pods terminate after it, within
        their grace period); Kueue then frees the quota. True when it did."""
        version = await self._kueue_version()
        if not await self.api.has_api(version):  # no Kueue: no Workload to release
            return False
        selector = {RUN_LABEL: run_name}
        held = [
            w
            for w in await self.api.list("Workload", namespace, selector, api_version=version)
            if kueue.RESOURCE_IN_USE in ((w.get("metadata") or {}).get("finalizers") or [])
        ]
        if not held:
            return False
        run = await self.api.get(KIND, namespace, run_name)
        run_meta = (run or {}).get("metadata") or {}
        if not kueue.idle(await self.api.list("Pod", namespace, selector)):
            return False
        released = False
        for workload in held:
            owners = {
                ref.get("uid")
                for ref in (workload.get("metadata") or {}).get("ownerReferences") or []
                if ref.get("kind") == KIND
            }
            if run is not None and run_meta.get("uid") in owners:
                continue  # the run lives: its own passes decide
            patch = kueue.finalizer_patch(workload, present=False)
            if patch is None:
                continue
            name = workload["metadata"]["name"]
            try:
                await self.api.patch(
                    "Workload", namespace, name, patch, api_version=workload["apiVersion"]
                )
            except ApiRejectedError as exc:
                if exc.status not in (404, 409):
                    raise
                continue  # gone, or written meanwhile: its next event tries again
            logger.info("released Workload %s/%s of the deleted run %s", namespace, name, run_name)
            released = True
        return released

    async def _status_refused(self, run: RunRef, exc: ApiRejectedError) -> None:
        """The API server refuses the run's status: say so once, in an Event and the log.

        The CRD's root validation rules (the name against the replicas spanning nodes,
        :data:`aflowrl.config.run.GROUP_NAME_RULES`) run on every write of the run, its status
        included, so a run created before a rule that it breaks can no longer be given a
        status; retrying cannot help, and the pass goes on (its children are still applied).
        """
        if run.uid in self._status_refusals:
            return
        self._status_refusals.add(run.uid)
        message = (
            f"the API server refuses this TrainingRun's status ({exc}); the run breaks a "
            "validation rule of the TrainingRun CRD (one added after it was created, such as "
            "the name's length against its multi-node replicas): recreate it so that it passes"
        )
        logger.warning("%s/%s: %s", run.namespace, run.name, message)
        await self._event(run, "Warning", STATUS_REFUSED, message)

    async def _event(self, run: RunRef, type_: str, reason: str, message: str) -> None:
        """Post a core/v1 Event about the run (``kubectl describe trainingrun`` lists them).

        Posted by the operator itself, not through kopf, so passes of the resync task (outside
        any kopf handler) report too. An Event that cannot be posted is only logged.
        """
        now = _now()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{run.name}.", "namespace": run.namespace},
            "involvedObject": {
                "apiVersion": f"{API_GROUP}/{API_VERSION}",
                "kind": KIND,
                "name": run.name,
                "namespace": run.namespace,
                "uid": run.uid,
            },
            "type": type_,
            "reason": reason,
            "message": message[:_MAX_EVENT_MESSAGE],
            "source": {"component": REPORTING_COMPONENT},
            "reportingComponent": REPORTING_COMPONENT,
            "reportingInstance": self._instance[:128],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.api.create(event)
        except (ApiRejectedError, ApiUnavailableError) as exc:
            logger.warning("cannot post the %s event of %s: %s", reason, run.name, exc)

    async def _apply_and_observe(
        self,
        run: RunRef,
        spec: RunSpec,
        rejection: Rejection | None,
        actions: list[str],
        *,
        queue: str | None = None,
        priority: str | None = None,
        previous_status: JsonDict | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> status.Observation:
        ns = run.namespace
        job_live = await self.api.get("Job", ns, run.trainer)
        ended = status.job_state(job_live)
        finished = ended.finished
        kept = finished and children.kept_after_end(
            spec, ended.completion_time, datetime.datetime.now(tz=datetime.UTC)
        )
        env_live = await self.api.get("Deployment", ns, run.environment)
        env_replicas = children.environment_replicas(
            spec, (env_live or {}).get("spec", {}).get("replicas") if env_live else None
        )
        wants_running = not spec.suspend and (kept or not finished)
        workload_manifest: JsonDict = {}
        workload_live: JsonDict | None = None
        admission = kueue.Admission()
        problems: list[status.Problem] = []
        try:
            run_pods = await self.api.list("Pod", ns, {RUN_LABEL: run.name})
            pods_gone = kueue.idle(run_pods)
        except ApiRejectedError as exc:
            problems.append(refused("list Pods", exc))
            # Unknown pods are never "gone": quota is held and nothing is released or reshaped.
            run_pods, pods_gone = [], False
        unqueued = False
        if await self._has_kueue():
            # The Workload is read whatever the label says: relabelling cannot escape it.
            version = await self._kueue_version()
            workload_live = await self.api.get("Workload", ns, run.workload, api_version=version)
            admission = kueue.admission(workload_live)
            choice = kueue.queueing(
                queue,
                workload_live,
                in_use=admission.reserved or not pods_gone,
                default_queue=queue is None
                and await self._local_queue(ns, kueue.DEFAULT_LOCAL_QUEUE, version) is True,
                manage_without_queue_name=self._manage_without_queue_name,
            )
            queue, unqueued = choice.queue, choice.unqueued
            if choice.refused:
                problems.append((kueue.QUEUE_IMMUTABLE, choice.refused))
            if choice.label_default and body is not None and pods_gone:
                await self._label_default_queue(run, dict(body), actions)
            if queue is None and workload_live is not None and not admission.finished:
                await self._drop_workload(run, workload_live, pods_gone, actions)
                workload_live, admission = None, kueue.Admission()
            multikueue = await self._multikueue_checks(admission, version)
            if multikueue:
                problems.append(
                    (
                        kueue.MULTIKUEUE_UNSUPPORTED,
                        f"the run's ClusterQueue dispatches through MultiKueue (admission check "
                        f"{', '.join(multikueue)}), which has no adapter for TrainingRuns: the "
                        "run cannot run on a worker cluster; queue it on a ClusterQueue without "
                        "MultiKueue",
                    )
                )
            if queue is not None and await self._local_queue(ns, queue, version) is False:
                problems.append(
                    (
                        kueue.LOCAL_QUEUE_MISSING,
                        f"LocalQueue {queue} does not exist in namespace {ns}: the run stays "
                        "queued until it does (or label the run with an existing one)",
                    )
                )
        if queue is not None:
            version = await self._kueue_version()
            # The pod sets are the pods as built before admission (Kueue's placement is not
            # part of a Workload's pod sets).
            unplaced = children.build(
                run,
                spec,
                children.Scale(True, env_replicas, trainer_suspended=True),
                monitoring_api=False,
            )
            workload_manifest = children.kueue_workload(
                run,
                spec,
                unplaced,
                queue=queue,
                priority=await self._priority(spec, priority, version, unplaced),
                api_version=version,
                max_execution_label=(((body or {}).get("metadata") or {}).get("labels") or {}).get(
                    kueue.MAX_EXEC_TIME_LABEL
                ),
            )
        # Compared by content, not by the hash a release wrote: a new release that renders
        # other details differently does not requeue an admitted run.
        reshaped = workload_live is not None and kueue.admitted_shape(
            (workload_live.get("spec") or {}).get("podSets") or []
        ) != kueue.admitted_shape(workload_manifest["spec"]["podSets"])
        admitted = admission.admitted and admission.active and not reshaped
        placement: dict[str, kueue.Placement] = {}
        unplaceable = ""
        if queue is not None and admitted:
            # Fails closed, as Kueue's BadPodSetsUpdateError: pods never start without (or
            # against) what admission says about their nodes.
            placement, unplaceable = await self._placement(admission)
            unplaceable = unplaceable or kueue.conflicts(
                workload_manifest["spec"]["podSets"], placement
            )
            if unplaceable:
                problems.append((kueue.PLACEMENT_FAILED, unplaceable))
                admitted, placement = False, {}
        held = (queue is not None or unqueued) and wants_running and not admitted
        try:
            if body is not None and await self._suspend_for_kueue(
                run, dict(body), held=held, actions=actions
            ):
                held = True
        except ApiRejectedError as exc:  # the children still follow ``held``
            problems.append(refused(f"patch {KIND} {run.name} spec.suspend", exc))
        services = wants_running and not held
        scale = children.Scale(
            services=services,
            environment_replicas=env_replicas,
            trainer_suspended=spec.suspend or held,
            placement=placement,
        )
        monitoring_api = await self._has_monitoring()
        wants_monitor = spec.monitoring.service_monitor.enabled
        if wants_monitor and not monitoring_api and run.uid not in self._warned_no_monitoring:
            self._warned_no_monitoring.add(run.uid)
            logger.warning(
                "%s/%s asks for a PodMonitor, but the cluster does not serve %s "
                "(install the prometheus-operator CRDs); pods keep prometheus.io annotations",
                run.namespace,
                run.name,
                MONITORING_API,
            )
        group_api = await self._has_groups()
        desired = children.build(
            run, spec, scale, monitoring_api=monitoring_api, group_api=group_api
        )

        if not group_api and groups.needs_api(spec):
            problems.append((groups.UNAVAILABLE, groups.unavailable_message(spec)))
        # The replica LeaderWorkerSets there are (to keep those a new template waits for, and
        # to delete the surplus after).
        found: list[tuple[children.Pruned, list[JsonDict]]] = []
        for pruned in desired.pruned:
            try:
                found.append((pruned, await self.api.list(pruned.kind, ns, pruned.labels)))
            except ApiRejectedError as exc:
                problems.append(refused(f"list {pruned.kind}s", exc))
        waiting: dict[str, JsonDict] = {}  # replicas whose new template waits for another's
        for pruned, objects in found:
            mine = {
                o["metadata"]["name"]: o
                for o in objects
                if o["metadata"]["name"] in pruned.keep and controlled_by(o, run)
            }
            sets = [
                (c.manifest, c.replicas or 0)
                for c in desired.children
                if c.kind == pruned.kind and c.name in pruned.keep
            ]
            waiting |= {name: mine[name] for name in groups.held_back(sets, mine, run_pods)}
        live: dict[tuple[str, str], JsonDict] = {}
        for child in desired.children:
            autoscaled = (child.kind, child.name) == ("Deployment", run.environment)
            bounds = spec.environment.replicas
            manifest = child.manifest
            if child.name in waiting and child.kind == groups.KIND:
                manifest = groups.keep_template(manifest, waiting[child.name])
            try:
                obj, action = await ensure(
                    self.api,
                    run,
                    manifest,
                    replicas=child.replicas,
                    autoscaled=autoscaled,
                    bounds=(bounds.min, bounds.max) if autoscaled else None,
                )
            except ChildConflictError as exc:
                problems.append(("ChildConflict", str(exc)))
                continue
            except ApiRejectedError as exc:
                problems.append(refused(f"apply {child.kind} {child.name}", exc))
                continue
            live[(child.kind, child.name)] = obj
            if action != "unchanged":
                self._record(actions, child.kind, child.name, action)
        surplus = [
            (pruned.kind, obj["metadata"]["name"])
            for pruned, objects in found
            for obj in objects
            if obj["metadata"]["name"] not in pruned.keep
        ]
        for kind, name in [*desired.absent, *surplus]:
            try:
                if await remove(self.api, run, kind, name):
                    self._record(actions, kind, name, "deleted")
            except ApiRejectedError as exc:  # the rest of the pass goes on
                problems.append(refused(f"delete {kind} {name}", exc))
        try:
            job_live = await self._ensure_job(
                run,
                desired.trainer_job,
                job_live,
                actions=actions,
            )
        except ChildConflictError as exc:
            problems.append(("ChildConflict", str(exc)))
            job_live = None
        except ApiRejectedError as exc:
            problems.append(refused(f"apply Job {run.trainer}", exc))

        pod_problems: dict[str, list[status.Problem]] = {}
        for pod in run_pods:
            component = ((pod.get("metadata") or {}).get("labels") or {}).get(COMPONENT_LABEL, "")
            pod_problems.setdefault(component, []).extend(status.pod_problems(pod))

        def workload(component: str) -> status.Workload:
            """The component's workloads (a Deployment, a StatefulSet, or LeaderWorkerSets:
            one per multi-node replica, seen together) and its pods' problems."""
            states = [
                status.workload_state(live.get((c.kind, c.name)), c.replicas or 0)
                for c in desired.children
                if c.replicas is not None
                and c.manifest["metadata"]["labels"].get(COMPONENT_LABEL) == component
            ]
            seen = functools.reduce(status.combine, states) if states else status.Workload()
            return dataclasses.replace(
                seen, problems=tuple(pod_problems.get(component, ())) + seen.problems
            )

        environment = workload("environment")
        if any(
            c.manifest["metadata"]["labels"].get(COMPONENT_LABEL) == "executor"
            and c.replicas is not None
            for c in desired.children
        ):
            environment = status.combine(environment, workload("executor"))
        unschedulable = (
            capacity.unschedulable(spec, await self._cluster_nodes()) if services else []
        )
        trainer = status.job_state(job_live, tuple(pod_problems.get("trainer", ())))
        components = (
            workload("rollout"),
            workload("learner"),
            environment,
        )
        queued: str | None = None
        deactivated = False
        admitted_condition: tuple[bool, str, str] | None = None
        if queue is not None:
            # Idle from the run's pods themselves (ready or not, terminating too), never from
            # its workloads' ready counts: a pod in its startup probe holds its GPUs as well.
            idle = trainer.active == 0 and pods_gone
            # PodsReady against what Kueue admitted, not the moment's desire: the environment
            # needs its floor (an HPA scale-up's new pods do not count against it), and a roll
            # the operator makes one replica at a time keeps a True PodsReady True.
            fixed = [workload("rollout"), workload("learner"), workload("executor")]
            every_pod_ready = (
                (trainer.ready > 0 or trainer.complete)
                and all(w.ready >= w.desired for w in fixed)
                and fixed[0].desired > 0
                and fixed[1].desired > 0
                and workload("environment").ready >= spec.environment.replicas.min
            )
            rolling = bool(waiting) or any(
                kueue.condition(obj, "UpdateInProgress").get("status") == "True"
                for (kind, _), obj in live.items()
                if kind == groups.KIND
            )
            if rolling and kueue.condition(workload_live, "PodsReady").get("status") == "True":
                every_pod_ready = True
            try:
                queued, deactivated = await self._sync_workload(
                    run,
                    workload_manifest,
                    workload_live,
                    admission,
                    reshaped=reshaped,
                    suspended=spec.suspend,
                    ended=trainer if finished and not kept else None,
                    idle=idle,
                    pods_ready=every_pod_ready,
                    actions=actions,
                )
            except ApiRejectedError as exc:  # the run stays held; Degraded says why
                problems.append(refused(f"sync Workload {run.workload}", exc))
                queued = None if spec.suspend else f"the Workload was refused: {exc}"
            admitted_condition = _admitted_condition(
                admission,
                admitted=admitted,
                queued=queued,
                deactivated=deactivated,
                suspended=spec.suspend,
                ended=finished and not kept,
            )
            if unplaceable and queued is None and not spec.suspend:
                queued = f"admitted, but its pods cannot be placed: {unplaceable}"
                admitted_condition = (False, kueue.PLACEMENT_FAILED, queued)
        elif unqueued and wants_running:
            queued = (
                f"the run names no LocalQueue ({KUEUE_QUEUE_LABEL} label) and the operator "
                "manages runs without one (manageJobsWithoutQueueName): it is held until it "
                "names one"
            )
            admitted_condition = (False, "NoQueueName", queued)
        observed = status.Observation(
            spec=spec,
            rejection=rejection,
            suspended=spec.suspend,
            queued=queued,
            rollout=components[0],
            learner=components[1],
            environment=components[2],
            trainer=trainer,
            unschedulable=tuple(unschedulable),
            apply_problems=tuple(problems),
            evicted=queued is not None and admission.evicted,
            deactivated=deactivated,
            admission=admitted_condition,
            kept=kept,
            last_error=status.last_error(
                run_pods, trainer, (previous_status or {}).get("lastError")
            ),
        )
        return observed

    async def _suspend_for_kueue(
        self, run: RunRef, body: JsonDict, *, held: bool, actions: list[str]
    ) -> bool:
        """Make the run's ``spec.suspend`` say whether Kueue holds it (:func:`kueue.suspend_patch`),
        merge-patched on the run itself (not its status) under the operator's field manager.

        The patch carries the run's ``resourceVersion``: on a conflict the run is read again and
        the decision taken on what it now says, so a user's suspend written meanwhile is never
        overwritten. Returns whether the run must stay stopped this pass although Kueue admits
        it: the operator's suspend could not be turned off (a user's suspend arrived meanwhile,
        or the run is gone); the next pass, which that write triggers, decides again.
        """
        attempted = False
        for _ in range(_SUSPEND_WRITE_TRIES):
            patch = kueue.suspend_patch(body, held=held)
            if patch is None:
                break
            attempted = True
            try:
                written = await self.api.patch(
                    KIND, run.namespace, run.name, patch, field_manager=FIELD_MANAGER
                )
            except ApiRejectedError as exc:
                if exc.status != 409:
                    raise
                logger.info("TrainingRun %s/%s changed meanwhile: %s", run.namespace, run.name, exc)
                written = None
                fresh = await self.api.get(KIND, run.namespace, run.name)
                if fresh is None or (fresh.get("metadata") or {}).get("uid") != run.uid:
                    return True
                body = fresh
                continue
            if written is None:
                return True
            action = "suspended for Kueue" if held else "unsuspended on admission"
            actions.append(f"spec.suspend {action}")
            body = written
            break
        return attempted and not held and bool((body.get("spec") or {}).get("suspend"))

    async def _has_kueue(self) -> bool:
        """Whether the cluster serves Kueue's Workload API (cached like the others)."""
        now = time.monotonic()
        if self._kueue_served is None or now - self._kueue_served[0] > self._cache_s:
            self._kueue_served = (now, await self.api.has_api(await self._kueue_version()))
        return self._kueue_served[1]

    async def _multikueue_checks(self, admitted: kueue.Admission, version: str) -> list[str]:
        """The Workload's admission checks that MultiKueue controls (unreadable ones skipped)."""
        found = []
        for name in admitted.checks:
            try:
                check = await self.api.get("AdmissionCheck", None, name, api_version=version)
            except ApiRejectedError as exc:
                logger.debug("cannot read AdmissionCheck %s: %s", name, exc)
                continue
            if ((check or {}).get("spec") or {}).get("controllerName") == (
                kueue.MULTIKUEUE_CONTROLLER
            ):
                found.append(name)
        return found

    async def _local_queue(self, namespace: str, name: str, version: str) -> bool | None:
        """Whether the LocalQueue exists (None: unknown, e.g. no RBAC to read it)."""
        try:
            found = await self.api.get("LocalQueue", namespace, name, api_version=version)
        except ApiRejectedError as exc:
            logger.debug("cannot read LocalQueue %s/%s: %s", namespace, name, exc)
            return None
        return found is not None

    async def _label_default_queue(self, run: RunRef, body: JsonDict, actions: list[str]) -> None:
        """Label the run with the namespace's ``default`` LocalQueue, as Kueue's defaulting
        webhooks label its own jobs, and suspend it (marked as Kueue's) in the same write, so
        it waits for admission (the write carries the run's version: a user's wins)."""
        version = (body.get("metadata") or {}).get("resourceVersion")
        patch: JsonDict = {"spec": {}}
        if not (body.get("spec") or {}).get("suspend"):
            # Queued from now on: suspended with it, as a run created with the label is.
            patch = kueue.suspend_patch(body, held=True) or patch
        patch["metadata"] = {
            **patch.get("metadata", {}),
            **({"resourceVersion": version} if version else {}),
            "labels": {KUEUE_QUEUE_LABEL: kueue.DEFAULT_LOCAL_QUEUE},
        }
        if not patch["spec"]:
            del patch["spec"]
        try:
            await self.api.patch(KIND, run.namespace, run.name, patch, field_manager=FIELD_MANAGER)
        except ApiRejectedError as exc:
            if exc.status != 409:
                raise
            return  # the user wrote meanwhile: the next pass decides again
        actions.append(f"labelled with LocalQueue {kueue.DEFAULT_LOCAL_QUEUE}")

    async def _drop_workload(
        self, run: RunRef, live: JsonDict, idle: bool, actions: list[str]
    ) -> None:
        """The run left Kueue (its label removed while it held no quota): its Workload goes
        once no pod of the run holds resources (finalizer first)."""
        if not idle or kueue.admission(live).reserved:
            return
        live_now = await self._in_use(run, live, present=False, actions=actions)
        if live_now is not None and await remove(
            self.api, run, "Workload", run.workload, api_version=live["apiVersion"]
        ):
            self._record(actions, "Workload", run.workload, "deleted")

    async def _placement(self, admitted: kueue.Admission) -> tuple[dict[str, kueue.Placement], str]:
        """Per pod set, what its admission adds to its pods (:func:`kueue.placement`), and why
        it cannot be known ("" when it can): a ResourceFlavor that cannot be read."""
        version = await self._kueue_version()
        objects: dict[str, JsonDict] = {}
        unreadable: list[str] = []
        for name in sorted({f for flavors in admitted.flavors.values() for f in flavors.values()}):
            try:
                found = await self.api.get("ResourceFlavor", None, name, api_version=version)
            except ApiRejectedError as exc:
                logger.warning("cannot read ResourceFlavor %s: %s", name, exc)
                unreadable.append(f"ResourceFlavor {name} cannot be read ({exc})")
                continue
            if found is None:
                unreadable.append(f"ResourceFlavor {name} does not exist")
            else:
                objects[name] = found
        if unreadable:
            return {}, (
                f"{'; '.join(unreadable)}: the run stays suspended, since its pods would start "
                "without the flavor's node labels and tolerations"
            )
        return kueue.placement(admitted, objects), ""

    async def _priority(
        self, spec: RunSpec, workload_class: str | None, version: str, desired: children.Desired
    ) -> kueue.Priority | None:
        """The run's priority as Kueue's integrations resolve it: the WorkloadPriorityClass
        its ``kueue.x-k8s.io/priority-class`` label names, else the PriorityClass of the first
        pod set whose pods name one (``scheduling.priorityClassName``, or a component's own
        ``pod.priorityClassName``; Kueue's ``ExtractPriority``), with that class's value."""
        templates = [groups.pod_template_of(c.manifest) for c in desired.children]
        templates.append(desired.trainer_job["spec"]["template"])
        pod_class = spec.scheduling.priority_class_name or next(
            (
                str(t["spec"]["priorityClassName"])
                for t in templates
                if t is not None and t["spec"].get("priorityClassName")
            ),
            None,
        )
        if workload_class:
            kind, name, api_version = kueue.WORKLOAD_PRIORITY_CLASS, workload_class, version
        elif pod_class:
            kind, name = kueue.PRIORITY_CLASS, pod_class
            api_version = "scheduling.k8s.io/v1"
        else:
            return None
        try:
            found = await self.api.get(kind, None, name, api_version=api_version)
        except ApiRejectedError as exc:  # no RBAC: as if the class were missing
            logger.warning("cannot read %s %s: %s", kind, name, exc)
            found = None
        value = (found or {}).get("value")
        if value is None and (kind, name) not in self._warned_priority:
            self._warned_priority.add((kind, name))
            logger.warning(
                "%s %s is missing or has no value: the run queues at the default priority",
                kind,
                name,
            )
        return kueue.Priority(name=name, kind=kind, value=int(value) if value is not None else None)

    async def _patch_workload(
        self, run: RunRef, live: JsonDict, patch: JsonDict, *, subresource: str = ""
    ) -> JsonDict | None:
        """Merge-patch the run's Workload; None when Kueue changed it meanwhile (HTTP 409: the
        next pass, which its change triggers, tries again) or it is gone."""
        try:
            return await self.api.patch(
                "Workload",
                run.namespace,
                run.workload,
                patch,
                subresource=subresource,
                api_version=live["apiVersion"],
            )
        except ApiRejectedError as exc:
            if exc.status != 409:
                raise
            logger.info("Workload %s/%s changed meanwhile: %s", run.namespace, run.workload, exc)
            return None

    async def _in_use(
        self, run: RunRef, live: JsonDict, *, present: bool, actions: list[str]
    ) -> JsonDict | None:
        """Put (``present``) or take away the Workload's :data:`kueue.RESOURCE_IN_USE`
        finalizer; the Workload as it now is (None when Kueue wrote meanwhile, or it is gone)."""
        patch = kueue.finalizer_patch(live, present=present)
        if patch is None:
            return live
        written = await self._patch_workload(run, live, patch)
        if written is not None:
            action = "held in use" if present else "released from use"
            self._record(actions, "Workload", run.workload, action)
        return written

    async def _sync_workload(
        self,
        run: RunRef,
        manifest: JsonDict,
        live: JsonDict | None,
        admitted: kueue.Admission,
        *,
        reshaped: bool,
        suspended: bool,
        ended: status.TrainerJob | None,
        idle: bool,
        pods_ready: bool,
        actions: list[str],
    ) -> tuple[str | None, bool]:
        """Keep the run's one Kueue Workload as Kueue's own job integrations keep theirs.

        Returns why the run is held (None when it is not) and whether Kueue deactivated it.
        The Workload is created once; it is replaced only when its pod sets no longer match
        the spec (Kueue does not let them change), and then only while no pod runs. A finished
        run marks it ``Finished``; ``spec.suspend`` sets ``spec.active`` false (and back);
        an evicted run gives its quota back once idle (:func:`kueue.release`); ``PodsReady``
        follows the pods.
        """
        version = manifest["apiVersion"]
        queue = manifest["spec"]["queueName"]
        now = _now()
        if ended is not None:
            patch = None
            if live is not None:
                patch = kueue.finished(live, ended.complete, ended.failure_message, now)
            if live is not None and patch is not None:
                finished = await self._patch_workload(run, live, patch, subresource="status")
                if finished is not None:
                    live = finished
                    self._record(actions, "Workload", run.workload, "finished")
            if live is not None and idle:  # nothing of the run holds resources any more
                await self._in_use(run, live, present=False, actions=actions)
            return None, False
        if live is not None and reshaped and idle:
            # Kueue does not let pod sets change: a new Workload, once no pod of the run holds
            # what the old one admitted (its finalizer goes first, as Kueue's workload.Delete).
            live = await self._in_use(run, live, present=False, actions=actions)
            if live is not None and await remove(
                self.api, run, "Workload", run.workload, api_version=version
            ):
                self._record(actions, "Workload", run.workload, "deleted")
            live = None
        if live is not None and not reshaped:
            live = await self._in_use(run, live, present=True, actions=actions) or live
        if live is None:
            if suspended:
                return None, False  # nothing to queue until the run resumes
            _, action = await ensure(self.api, run, manifest)
            self._record(actions, "Workload", run.workload, action)
            return f"waiting for Kueue to admit the run (queue {queue})", False
        if not admitted.reserved and not reshaped:
            # Kueue refuses changes to a Workload holding quota; before, keep it in step.
            live, action = await ensure(self.api, run, manifest)
            if action != "unchanged":
                self._record(actions, "Workload", run.workload, action)
        elif not reshaped:
            # A WorkloadPriorityClass changed on a running run: Kueue's job reconciler moves
            # its Workload's priority too (preemption orders by it); adding or removing one
            # while running is what Kueue refuses.
            patch = kueue.priority_patch(live, manifest)
            if patch is not None and await self._patch_workload(run, live, patch):
                self._record(actions, "Workload", run.workload, "reprioritised")
        ours = annotation(live, kueue.SUSPENDED_BY) is not None
        if suspended and admitted.active:
            patch = {
                "metadata": {"annotations": {kueue.SUSPENDED_BY: "true"}},
                "spec": {"active": False},
            }
            live = await self._patch_workload(run, live, patch) or live
            self._record(actions, "Workload", run.workload, "deactivated")
        elif not suspended and not admitted.active and ours:
            patch = {
                "metadata": {"annotations": {kueue.SUSPENDED_BY: None}},
                "spec": {"active": True},
            }
            live = await self._patch_workload(run, live, patch) or live
            self._record(actions, "Workload", run.workload, "activated")
        if admitted.evicted and idle:
            release = kueue.release(live, now)
            if release is not None:
                released = await self._patch_workload(run, live, release, subresource="status")
                if released is not None:
                    live = released
                    self._record(actions, "Workload", run.workload, "released")
                    why = f" ({admitted.reason})" if admitted.reason else ""
                    await self._event(
                        run,
                        "Normal",
                        "Requeued",
                        f"every pod stopped after the eviction{why}: the quota is given back "
                        f"and Kueue requeues Workload {run.workload}",
                    )
        ready = kueue.pods_ready(live, pods_ready, now)
        if ready is not None:
            await self._patch_workload(run, live, ready, subresource="status")
        why = f": {admitted.message}" if admitted.message else ""
        if suspended:
            return None, False
        if reshaped:
            return (
                "the run's pod sets changed: its Workload is replaced once its pods stop",
                False,
            )
        if not admitted.active and not ours:
            return f"deactivated by Kueue (spec.active is false){why}", True
        if admitted.admitted:
            return None, False
        if admitted.evicted:
            cause = f" ({admitted.reason})" if admitted.reason else ""
            return f"evicted by Kueue{cause}{why}; the run is held until Kueue readmits it", False
        return f"waiting for Kueue to admit the run (queue {queue}){why}", False


def refused(what: str, exc: ApiRejectedError) -> status.Problem:
    """The Degraded problem of a request the API server refused (``what``: the verb and the
    object, e.g. ``delete NetworkPolicy demo-ingress``): reason ``Forbidden`` when RBAC
    refused it (HTTP 403), else ``ChildRejected``. The pass goes on without it."""
    reason = status.FORBIDDEN if exc.status == 403 else "ChildRejected"
    return reason, f"{what} refused: {exc}"


def _admitted_condition(
    admission: kueue.Admission,
    *,
    admitted: bool,
    queued: str | None,
    deactivated: bool,
    suspended: bool,
    ended: bool,
) -> tuple[bool, str, str]:
    """The run's ``Admitted`` condition under Kueue: (status, reason, message); its changes
    are the Events of admission, eviction, deactivation and requeue."""
    if ended:
        return False, "Finished", "the run has finished: its Workload is Finished, no quota held"
    if suspended:
        return False, "Suspended", "spec.suspend is true: its Workload is inactive, no quota held"
    if admitted:
        flavors = sorted({f for by in admission.flavors.values() for f in by.values()})
        on = f" on flavors {', '.join(flavors)}" if flavors else ""
        return True, "Admitted", f"admitted by Kueue{on}: the run runs"
    message = queued or "waiting for Kueue"
    if deactivated:
        return False, "Deactivated", message
    if admission.evicted:
        return False, "Evicted", message
    return False, "Queued", message
