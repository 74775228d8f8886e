"""A test harness: the emulated API server, a client for it, and the real operator (kopf) in a
thread of its own, cluster-wide, with a short resync interval. Used by ``conftest.py``."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import gc
import re
import sys
import threading
import urllib.parse
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import kmock
import kopf
import kubernetes
from kube_emulator import KubeEmulator

from aflowrl_operator import leader
from aflowrl_operator.handlers import OperatorConfig, build_registry

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "charts"))
import chart_rbac

RUNS = "aflowrl.io/v1alpha1/trainingruns"
NAMESPACE = "team-a"
DEPLOYMENTS = "apps/v1/deployments"
STATEFULSETS = "apps/v1/statefulsets"
JOBS = "batch/v1/jobs"
PODS = "v1/pods"
SERVICES = "v1/services"
POLICIES = "networking.k8s.io/v1/networkpolicies"
WORKLOADS = "kueue.x-k8s.io/v1beta2/workloads"
TINY: dict = {"environment": {"replicas": {"min": 2, "max": 4}}}
"""The smallest run the tests create: every component once, two environment servers."""
QUEUE = {"kueue.x-k8s.io/queue-name": "team-a"}
"""The label that queues a run in LocalQueue ``team-a`` (which every emulated Kueue has)."""
POD_SETS = ("rollout", "learner", "environment", "trainer")
"""A run's Kueue pod sets, in its Workload's order."""
RESYNC_S = 0.3
PEERING_LIFETIME_S = 3
TEST_LEASE = leader.LeaseConfig(
    name="aflow-rl-operator",  # the chart's, in its release namespace (its RBAC names it)
    namespace="aflow-rl",
    duration_s=10.0,
    renew_deadline_s=6.0,
    retry_s=0.3,
)
"""A Lease renewed often (a released one is taken over within a retry), with a deadline that
a loaded CI machine's pauses do not reach."""


class Operator:
    """One operator replica: kopf in a thread of its own with its own event loop, as
    ``kopf.testing.KopfRunner`` runs it (kopf cancels every task of its loop it did not start,
    and installs signal handlers in the main thread)."""

    def __init__(
        self,
        url: str,
        *,
        peering: str | None = None,
        priority: int = 0,
        lease: leader.LeaseConfig | None = None,
        identity: str | None = None,
    ) -> None:
        self.url = url
        self.peering = peering
        self.priority = priority
        self.lease = lease
        self.config = self._config()
        if identity is not None:
            self.config = dataclasses.replace(self.config, identity=identity)
        self._stop = threading.Event()
        self._memo = kopf.Memo()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _config(self) -> OperatorConfig:
        def kube() -> kubernetes.client.Configuration:
            config = kubernetes.client.Configuration()
            config.host = self.url
            return config

        def login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=self.url, insecure=True)

        return OperatorConfig(
            resync_interval_s=RESYNC_S,
            cluster_cache_s=0.0,
            retry_delay_s=0.2,
            kube=kube,
            login=login,
            peering_lifetime_s=PEERING_LIFETIME_S,
            lease=self.lease,
        )

    def _serve(self, ready: threading.Event) -> None:
        peering: dict[str, Any] = {"standalone": True}
        if self.peering is not None:
            peering = {
                "standalone": False,
                "peering_name": self.peering,
                "priority": self.priority,
            }
        try:
            asyncio.run(
                kopf.operator(
                    registry=build_registry(self.config),
                    clusterwide=True,
                    stop_flag=self._stop,
                    ready_flag=ready,
                    memo=self._memo,
                    identity=self.config.identity,
                    **peering,
                )
            )
        except BaseException as exc:
            self._error = exc

    async def start(self) -> None:
        assert self._thread is None, "the operator is already running"
        self._stop, ready = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self._thread.start()
        # Deadlines, not expectations: a loaded CI machine may take long to start or stop kopf.
        assert await asyncio.to_thread(ready.wait, 120), "the operator did not start"

    async def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        await asyncio.to_thread(self._thread.join, 120)
        alive, self._thread = self._thread.is_alive(), None
        assert not alive, "the operator did not stop"
        if self._error is not None:
            raise self._error

    def leading(self) -> bool:
        """Whether this replica holds the leader Lease now (False without leader election)."""
        elector: leader.LeaderElector | None = (self._memo or {}).get("elector")
        return elector is not None and elector.leading

    def passes(self) -> float:
        """Reconcile passes this replica finished (any result), from its own metrics."""
        registry = self.config.metrics.registry
        return sum(
            registry.get_sample_value("aflowrl_operator_reconciles_total", {"result": r}) or 0.0
            for r in ("ok", "rejected", "error")
        )


class Cluster:
    """The emulated API server, a client for it, and the operator (which tests may restart, or
    run as several peering replicas)."""

    def __init__(self, emulator: KubeEmulator, server: kmock.Server) -> None:
        self.emulator = emulator
        self.server = server
        self.url = str(server.url).rstrip("/")
        self.operator = Operator(self.url)
        self.replicas: list[Operator] = []

    @property
    def config(self) -> OperatorConfig:
        return self.operator.config

    # ---- the operator ---------------------------------------------------------------------

    async def start_operator(self) -> None:
        await self.operator.start()

    async def stop_operator(self) -> None:
        try:
            await self.operator.stop()
        finally:
            for replica in self.replicas:
                await replica.stop()

    async def start_replica(self, peering: str, priority: int) -> Operator:
        """Another operator replica peering through ``peering`` with this priority."""
        replica = Operator(self.url, peering=peering, priority=priority)
        self.replicas.append(replica)
        await replica.start()
        return replica

    async def start_elected(
        self, identity: str, lease: leader.LeaseConfig = TEST_LEASE
    ) -> Operator:
        """Another operator replica, electing its leader through ``lease`` as ``identity``
        (a pod's name), standalone for kopf (no peering)."""
        replica = Operator(self.url, lease=lease, identity=identity)
        self.replicas.append(replica)
        await replica.start()
        return replica

    def passes(self) -> float:
        """Reconcile passes the operator finished (any result), from its own metrics."""
        return self.operator.passes()

    async def settle(self, passes: int = 3) -> None:
        """Wait until the operator has made ``passes`` more passes."""
        target = self.passes() + passes
        await self.eventually(lambda: self.passes() >= target, what=f"{passes} passes")

    # ---- the user's side ----------------------------------------------------------------

    async def create_run(
        self, name: str, spec: dict[str, Any], labels: dict[str, str] | None = None
    ) -> dict[str, Any]:
        body = {
            "apiVersion": "aflowrl.io/v1alpha1",
            "kind": "TrainingRun",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels or {}},
            "spec": copy.deepcopy(spec),
        }
        path = f"/apis/aflowrl.io/v1alpha1/namespaces/{NAMESPACE}/trainingruns"
        async with self.server.client.post(path, json=body) as response:
            assert response.status == 200, await response.text()
            result: dict[str, Any] = await response.json()
            return result

    async def patch_spec(self, name: str, spec_patch: dict[str, Any]) -> None:
        await self.emulator.patch_object(RUNS, NAMESPACE, name, {"spec": spec_patch})

    def run(self, name: str) -> dict[str, Any]:
        obj = self.emulator.read(RUNS, NAMESPACE, name)
        assert obj is not None, f"TrainingRun {name} is gone"
        return obj

    def child(self, resource: str, name: str) -> dict[str, Any] | None:
        return self.emulator.read(resource, NAMESPACE, name)

    def condition(self, name: str, type_: str) -> dict[str, Any] | None:
        conditions = (self.run(name).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == type_), None)

    async def wait_condition(
        self, name: str, type_: str, *, status: str | None = None, reason: str | None = None
    ) -> dict[str, Any]:
        """Wait until the run's condition ``type_`` has this status and/or reason; return it."""

        def check() -> dict[str, Any] | None:
            cond = self.condition(name, type_)
            if cond is None or status not in (None, cond["status"]):
                return None
            return cond if reason in (None, cond["reason"]) else None

        what = f"{type_}={status or '*'} ({reason or 'any reason'}) on {name}"
        found: dict[str, Any] = await self.eventually(check, what=what)
        return found

    async def eventually(
        self,
        check: Callable[[], Any] | Callable[[], Awaitable[Any]],
        *,
        within: float = 90.0,
        what: str = "",
    ) -> Any:
        """Poll ``check`` until it returns a truthy value (and return it)."""
        deadline = asyncio.get_running_loop().time() + within
        last: Any = None
        while True:
            with contextlib.suppress(AssertionError, KeyError, TypeError):
                last = check()
                if asyncio.iscoroutine(last):
                    last = await last
                if last:
                    return last
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timed out waiting for {what or check}: last saw {last!r}")
            await asyncio.sleep(0.05)


def chart_denies(
    requests: set[tuple[str, str, str]], values: dict[str, Any] | None = None
) -> list[tuple[str, str, str]]:
    """The (verb, group, resource) requests that the RBAC the chart (rendered with ``values``)
    binds to the operator's ServiceAccount does not grant in the runs' namespace."""
    policy = chart_rbac.operator_policy(values)
    return sorted(r for r in requests if not policy.allows(*r, NAMESPACE))


def status_condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    """The condition ``type_`` in any object's ``status.conditions`` ({} if it has none)."""
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == type_), {})


def events(cluster: Cluster, reason: str) -> list[dict[str, Any]]:
    """The Events with this reason in the runs' namespace."""
    return [e for e in cluster.emulator.all("v1/events", NAMESPACE) if e["reason"] == reason]


def admitted_status(flavor: str | None = None, **extra: Any) -> dict[str, Any]:
    """A Workload's status as Kueue writes it on admission: quota reserved and admitted for
    one pod of each of :data:`POD_SETS`, on ``flavor`` (none named when None); ``extra``
    adds status fields (``admissionChecks``...)."""
    flavors = {"flavors": {"cpu": flavor}} if flavor else {}
    return {
        "conditions": [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
            {"type": "Admitted", "status": "True", "reason": "Admitted"},
        ],
        "admission": {
            "clusterQueue": "gpu",
            "podSetAssignments": [{"name": name, **flavors, "count": 1} for name in POD_SETS],
        },
        **extra,
    }


async def admit(cluster: Cluster, status: dict[str, Any], resource: str = WORKLOADS) -> None:
    """Kueue's part: write ``status`` (:func:`admitted_status`) on run ``demo``'s Workload
    (of the API version ``resource`` names), then wait until the operator starts the run."""
    await cluster.emulator.set_status(resource, NAMESPACE, "demo-kueue", status)
    await cluster.eventually(
        lambda: cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is False, what="admission"
    )


async def finish(cluster: Cluster) -> None:
    """The Job controller's part: run ``demo``'s trainer Job completes; then wait until the
    operator marks its Workload Finished (Succeeded) and the run says so."""
    complete = {"conditions": [{"type": "Complete", "status": "True"}], "active": 0}
    await cluster.emulator.set_status(JOBS, NAMESPACE, "demo-trainer", complete)
    await cluster.eventually(
        lambda: (
            status_condition(cluster.child(WORKLOADS, "demo-kueue"), "Finished").get("reason")
            == "Succeeded"
        ),
        what="the Workload Finished",
    )
    await cluster.wait_condition("demo", "Admitted", reason="Finished")


def local_queue(resource: str, namespace: str, name: str) -> dict[str, Any]:
    """A Kueue LocalQueue (of the API version ``resource`` names) pointing at ClusterQueue
    ``gpu``."""
    return {
        "apiVersion": resource.rsplit("/", 1)[0],
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": "gpu"},
    }


_API_SERVER_PORTS: set[int] = set()
"""The ports of every emulated API server this test session started."""
_RADDR = re.compile(r"raddr=\('127\.0\.0\.1', (\d+)\)")


def _to_api_server(warning: warnings.WarningMessage) -> bool:
    """Whether ``warning`` is about a client connection to an emulated API server."""
    peer = getattr(warning.source, "_extra", {}).get("peername")  # an asyncio transport
    if peer is None:  # a socket: its peer is in the text
        match = _RADDR.search(str(warning.message))
        peer = ("127.0.0.1", int(match.group(1))) if match else None
    return peer is not None and peer[0] == "127.0.0.1" and peer[1] in _API_SERVER_PORTS


def collect_client_leaks() -> None:
    """Collect garbage now and drop the warnings about kopf's connections to an emulated API
    server; any other ResourceWarning is warned again (and, under ``filterwarnings = error``,
    fails the test). kopf's aiohttp client, stopped mid-request (its tasks cancelled while a
    request reconnects or re-authenticates), can leave a connection unclosed. That costs a
    stopped operator nothing, but the socket is found by whichever later garbage collection
    runs, in whatever test runs then, which fails there. Collecting at each emulated cluster's
    start and end keeps those leaks out of unrelated tests and lets every other leak through."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    for warning in caught:
        if warning.category is ResourceWarning and _to_api_server(warning):
            continue
        warnings.warn_explicit(
            warning.message,
            warning.category,
            warning.filename,
            warning.lineno,
            source=warning.source,
        )


@contextlib.asynccontextmanager
async def emulated_cluster(
    *tables: dict[str, tuple[str, bool, bool]],
    chart_values: dict[str, Any] | None = None,
    operator: bool = True,
) -> AsyncIterator[Cluster]:
    """An emulated API server declaring ``tables`` of resources, enforcing the RBAC the chart
    (rendered with ``chart_values``) grants the operator, and the operator running against it
    (stopped on exit; ``operator=False``: none, the test starts its own replicas). A test may
    narrow ``cluster.emulator.policy`` (``Policy.without``)."""
    collect_client_leaks()
    async with KubeEmulator() as emulator, kmock.Server(emulator) as server:
        port = urllib.parse.urlsplit(str(server.url)).port
        assert port is not None
        _API_SERVER_PORTS.add(port)
        for table in tables:
            emulator.declare(table)
            for resource in table:
                if resource.endswith("/localqueues"):  # the queue the tests' runs name
                    await emulator.put_object(resource, local_queue(resource, NAMESPACE, "team-a"))
        emulator.policy = chart_rbac.operator_policy(chart_values)
        harness = Cluster(emulator, server)
        if operator:
            await harness.start_operator()
        try:
            yield harness
        finally:
            await harness.stop_operator()
            del harness
            collect_client_leaks()
