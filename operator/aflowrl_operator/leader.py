"""Leader election with a ``coordination.k8s.io/v1`` Lease: one operator replica works at a time.

Several operator replicas (a Deployment with more than one, or the old and the new pod of a
rolling update) watch the same runs; only the Lease's holder runs reconcile passes, so the
writes that must happen once (a Job replaced, a Workload deleted on a reshape, a run's
``spec.suspend``, Events, status writes) happen once. kopf's peering is a soft lock (each
replica reads the peers' heartbeats once per sweep); the Lease is a compare-and-swap: every
write of it carries the ``resourceVersion`` it read, and the API server refuses (409) a write
from a replica that read an older one, so two replicas never both win.

The protocol is client-go's (``k8s.io/client-go/tools/leaderelection``), on the Lease's own
fields: ``holderIdentity`` (the pod's name), ``leaseDurationSeconds``, ``acquireTime``,
``renewTime`` and ``leaseTransitions``. Every ``retry_s`` a replica reads the Lease: no Lease,
it creates one holding it; its own, it renews it; another's, it takes it over only after the
holder has not renewed for ``leaseDurationSeconds``, measured on this replica's own clock from
when it last saw the record change (so clock skew between nodes does not matter); an empty
holder (released on shutdown) is taken at once. A holder that cannot renew for
``renew_deadline_s`` (shorter than the lease duration) stops leading before anyone can take
over. Used by :mod:`aflowrl_operator.handlers`, which skips every pass while this replica does
not lead and runs one pass over every run when it starts leading.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from aflowrl_operator.errors import ApiRejectedError, ApiUnavailableError
from aflowrl_operator.kube import KubeApi

logger = logging.getLogger(__name__)

JsonDict = dict[str, Any]

API_VERSION = "coordination.k8s.io/v1"


@dataclasses.dataclass(frozen=True)
class LeaseConfig:
    """Where the Lease lives and its timing (client-go's defaults: 15 s, 10 s, 2 s)."""

    name: str
    """The Lease's name (the chart: ``<release>-operator``)."""
    namespace: str
    """Its namespace (the chart: the release's namespace)."""
    duration_s: float = 15.0
    """``leaseDurationSeconds``: how long a silent holder keeps the Lease (seconds)."""
    renew_deadline_s: float = 10.0
    """How long the holder keeps working without a successful renewal (seconds, below
    ``duration_s``, so it stops before another replica can take over)."""
    retry_s: float = 2.0
    """Seconds between two tries to acquire or renew."""

    def __post_init__(self) -> None:
        if not 0 < self.retry_s < self.renew_deadline_s < self.duration_s:
            raise ValueError(
                f"leader election needs 0 < retry ({self.retry_s}) < renew deadline "
                f"({self.renew_deadline_s}) < lease duration ({self.duration_s})"
            )


def _micro_time(now: datetime.datetime) -> str:
    """A ``MicroTime`` as the API server writes it."""
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """This replica's side of the election: :meth:`run` until cancelled, :attr:`leading`."""

    def __init__(
        self,
        api: KubeApi,
        config: LeaseConfig,
        identity: str,
        *,
        on_started_leading: Callable[[], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        self.api = api
        self.config = config
        self.identity = identity
        self._on_started = on_started_leading
        self._renewed: float | None = None  # monotonic time of the last successful write
        self._observed: tuple[Any, ...] | None = None  # the record last seen
        self._observed_at = 0.0
        self._started: set[asyncio.Task[None]] = set()

    @property
    def leading(self) -> bool:
        """Whether this replica holds the Lease and renewed it within the renew deadline."""
        return (
            self._renewed is not None
            and time.monotonic() - self._renewed < self.config.renew_deadline_s
        )

    def _lease(self, now: datetime.datetime, *, transitions: int) -> JsonDict:
        stamp = _micro_time(now)
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": round(self.config.duration_s),
            "acquireTime": stamp,
            "renewTime": stamp,
            "leaseTransitions": transitions,
        }

    async def try_once(self) -> bool:
        """Acquire or renew the Lease once; whether this replica leads now."""
        was_leading = self.leading
        try:
            won = await self._try()
        except (ApiUnavailableError, ApiRejectedError) as exc:
            logger.warning("leader election: cannot read or write Lease %s: %s", self._where, exc)
            won = False
        if won:
            self._renewed = time.monotonic()
            if not was_leading:
                logger.info("%s leads (Lease %s)", self.identity, self._where)
                if self._on_started is not None:
                    task: asyncio.Task[None] = asyncio.create_task(
                        self._on_started(), name="aflowrl leading"
                    )
                    self._started.add(task)
                    task.add_done_callback(self._started.discard)
        elif was_leading and not self.leading:
            logger.warning("%s no longer leads (Lease %s)", self.identity, self._where)
        return self.leading

    @property
    def _where(self) -> str:
        return f"{self.config.namespace}/{self.config.name}"

    async def _try(self) -> bool:
        config = self.config
        now = datetime.datetime.now(tz=datetime.UTC)
        lease = await self.api.get("Lease", config.namespace, config.name)
        if lease is None:
            body = {
                "apiVersion": API_VERSION,
                "kind": "Lease",
                "metadata": {"name": config.name, "namespace": config.namespace},
                "spec": self._lease(now, transitions=0),
            }
            return await self.api.create(body) is not None  # None: another replica was first
        spec = lease.get("spec") or {}
        version = lease["metadata"].get("resourceVersion")
        record = (spec.get("holderIdentity"), spec.get("renewTime"), version)
        if record != self._observed:
            self._observed, self._observed_at = record, time.monotonic()
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or config.duration_s)
        if holder and holder != self.identity:
            if time.monotonic() - self._observed_at < duration:
                self._renewed = None
                return False  # held, and renewed recently enough
            logger.info("Lease %s of %s expired: taking it over", self._where, holder)
        if holder == self.identity:
            new = {"renewTime": _micro_time(now), "holderIdentity": self.identity}
        else:
            new = self._lease(now, transitions=int(spec.get("leaseTransitions") or 0) + 1)
        patch = {"metadata": {"resourceVersion": version}, "spec": new}
        try:
            written = await self.api.patch("Lease", config.namespace, config.name, patch)
        except ApiRejectedError as exc:
            if exc.status != 409:
                raise
            logger.info("Lease %s changed meanwhile: another replica wrote it", self._where)
            self._renewed = None
            return False
        return written is not None

    async def run(self) -> None:
        """Acquire, then renew, every ``retry_s`` seconds, until cancelled."""
        while True:
            await self.try_once()
            await asyncio.sleep(self.config.retry_s)

    async def release(self) -> None:
        """Give the Lease up (on shutdown) so another replica takes over at once, not after
        the lease duration: the holder is emptied, guarded by the resourceVersion."""
        if not self.leading:
            return
        self._renewed = None
        for task in list(self._started):
            task.cancel()
        try:
            lease = await self.api.get("Lease", self.config.namespace, self.config.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            patch = {
                "metadata": {"resourceVersion": lease["metadata"].get("resourceVersion")},
                "spec": {
                    "holderIdentity": "",
                    "leaseDurationSeconds": 1,
                    "renewTime": _micro_time(datetime.datetime.now(tz=datetime.UTC)),
                },
            }
            await self.api.patch("Lease", self.config.namespace, self.config.name, patch)
            logger.info("%s released Lease %s", self.identity, self._where)
        except (ApiRejectedError, ApiUnavailableError) as exc:  # it expires instead
            logger.warning("cannot release Lease %s: %s", self._where, exc)
