"""Pushing the learner's new weights to every rollout replica; the trainer calls it each iteration.

Three transports behind one interface (:class:`WeightSync`, chosen by ``weightTransport.type``):

- ``grpc`` (:class:`GrpcWeightSync`): one ``PushWeights`` call; learner rank 0 streams the weights
  straight to every replica behind its version (:mod:`aflowrl.learner.push`), one tensor at a
  time, and answers with what each replica did. A replica that fails does not stop the others.
- ``filesystem`` (:class:`FilesystemWeightSync`): the learner exports a safetensors directory on
  the shared volume (``ExportWeights``), then every replica is told to load it (``LoadWeights``).
- ``nccl`` (:class:`NcclWeightSync`): one weight group per replica, learner rank 0 and that
  replica's engine workers (:mod:`aflowrl.models.broadcast`; every group's store on learner rank
  0 at ``weightTransport.port``), formed on first use, and every push is one broadcast to the
  groups of the replicas behind at once: ``BroadcastWeights`` on the learner (every learner rank
  gathers once, rank 0 sends each bucket of ``bucketMib`` to every group) while each of those
  replicas runs ``ReceiveWeights``. A group that breaks off (its replica died or stalled past the
  deadline) is aborted and costs that replica only: the others take the version over their own
  groups; the lost replica is reloaded from a filesystem export under ``fallbackPath``
  (``ExportWeights`` + ``LoadWeights``) when it still answers, else reported failed, and its
  group is formed anew when it is next behind. A replica's group is reused only while the
  replica answers with the incarnation (a random id per rollout process, in ``Status``) it had
  when the group formed: a replica restarted at the same address gets a new group, never the
  dead ranks of the old one, and the other replicas' groups are untouched.

Replicas already at (or past) the learner's version are skipped, so a push can be repeated after a
partial failure. This module is torch-free (it only calls the services).
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc
from grpc import aio

from aflowrl._proto.v1 import learner_pb2, rollout_pb2
from aflowrl.common.client import ChannelOptions, error_from_rpc
from aflowrl.config import RunSpec
from aflowrl.trainer.clients import LearnerClient, RolloutClient

logger = logging.getLogger(__name__)

_MIB = 1024 * 1024


@dataclass(frozen=True)
class ReplicaResult:
    """What one rollout replica did with a push."""

    target: str
    version: int | None
    """The version it serves after the push (None if it could not be asked)."""
    error: str | None = None
    """Why it did not take the new weights; None when it did or was already up to date."""
    skipped: bool = False
    """Already at (or past) the pushed version."""
    bytes: int = 0
    seconds: float = 0.0
    fallback: bool = False
    """Reloaded from a filesystem export after its broadcast broke off (nccl)."""


@dataclass(frozen=True)
class PushReport:
    """The outcome of one push."""

    version: int
    """The learner's policy version that was pushed."""
    replicas: list[ReplicaResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.error is None for r in self.replicas)

    @property
    def failed(self) -> list[ReplicaResult]:
        return [r for r in self.replicas if r.error is not None]


class WeightSync(abc.ABC):
    """Moves the learner's current weights to the rollout replicas."""

    @abc.abstractmethod
    async def push(self) -> PushReport:
        """Push the learner's current version to every replica that is behind."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release channels (idempotent)."""


class _Replicas:
    """The learner and every rollout replica, through the trainer's clients."""

    def __init__(
        self,
        learner: str,
        rollouts: Sequence[str],
        options: ChannelOptions,
        rollout_server_name: str | None = None,
    ) -> None:
        self.learner = LearnerClient(learner, options=options)
        self.rollout = RolloutClient(
            list(rollouts), options=options, server_name=rollout_server_name
        )
        self.targets = list(rollouts)
        self.server_name = rollout_server_name

    async def versions(self) -> list[int | str]:
        """Each replica's serving version, or the error that prevented asking it."""
        return await self.rollout.versions_or_errors(self.targets)

    async def statuses(self) -> list[rollout_pb2.RolloutStatusResponse | str]:
        """Each replica's Status, or the error that prevented asking it."""

        async def one(target: str) -> rollout_pb2.RolloutStatusResponse | str:
            try:
                reply: rollout_pb2.RolloutStatusResponse = await self.rollout.stub(target).Status(
                    rollout_pb2.RolloutStatusRequest(), timeout=30.0
                )
            except aio.AioRpcError as exc:
                return str(error_from_rpc(exc, f"Status of {target}"))
            return reply

        return list(await asyncio.gather(*(one(t) for t in self.targets)))

    async def export(self, dtype: str) -> learner_pb2.ExportWeightsResponse:
        """The learner's next version directory of the transport (what the rollout loads)."""
        try:
            reply: learner_pb2.ExportWeightsResponse = await self.learner.stub.ExportWeights(
                learner_pb2.ExportWeightsRequest(dtype=dtype)
            )
        except aio.AioRpcError as exc:
            raise error_from_rpc(exc, "learner ExportWeights") from exc
        return reply

    async def load(self, i: int, path: str, version: int) -> ReplicaResult:
        target = self.targets[i]
        begun = time.perf_counter()
        try:
            reply = await self.rollout.stub(target).LoadWeights(
                rollout_pb2.LoadWeightsRequest(path=path, version=version)
            )
        except aio.AioRpcError as exc:
            return ReplicaResult(target, None, error=str(error_from_rpc(exc, "LoadWeights")))
        return ReplicaResult(
            target,
            int(reply.weight_version),
            bytes=reply.bytes,
            seconds=time.perf_counter() - begun,
        )

    async def close(self) -> None:
        await self.learner.close()
        await self.rollout.close()


class GrpcWeightSync(WeightSync):
    """Learner rank 0 streams to every replica (module docstring)."""

    def __init__(
        self,
        learner: str,
        rollouts: Sequence[str],
        *,
        chunk_bytes: int = 4 * _MIB,
        dtype: str = "",
        options: ChannelOptions | None = None,
        rollout_server_name: str | None = None,
    ) -> None:
        self._replicas = _Replicas(
            learner, rollouts, options or ChannelOptions(timeout_s=3600.0), rollout_server_name
        )
        self.chunk_bytes = chunk_bytes
        self.dtype = dtype

    async def push(self) -> PushReport:
        started = time.perf_counter()
        replicas = self._replicas
        request = learner_pb2.PushWeightsRequest(
            targets=replicas.targets,
            chunk_bytes=self.chunk_bytes,
            dtype=self.dtype,
            server_name=replicas.server_name or "",
        )
        try:
            reply: learner_pb2.PushWeightsResponse = await replicas.learner.stub.PushWeights(
                request
            )
        except aio.AioRpcError as exc:
            raise error_from_rpc(exc, "learner PushWeights") from exc
        report = PushReport(
            int(reply.policy_version),
            [
                ReplicaResult(
                    r.target,
                    int(r.weight_version) if not r.error else None,
                    error=r.error or None,
                    skipped=r.skipped,
                    bytes=r.bytes,
                    seconds=r.seconds,
                )
                for r in reply.replicas
            ],
            time.perf_counter() - started,
        )
        _log(report, "grpc")
        return report

    async def close(self) -> None:
        await self._replicas.close()


class FilesystemWeightSync(WeightSync):
    """Export on the shared volume, then ``LoadWeights`` on every replica."""

    def __init__(
        self,
        learner: str,
        rollouts: Sequence[str],
        *,
        dtype: str = "",
        options: ChannelOptions | None = None,
        rollout_server_name: str | None = None,
    ) -> None:
        self._replicas = _Replicas(
            learner, rollouts, options or ChannelOptions(timeout_s=600.0), rollout_server_name
        )
        self.dtype = dtype

    async def push(self) -> PushReport:
        started = time.perf_counter()
        replicas = self._replicas
        export = await replicas.export(self.dtype)
        version = int(export.policy_version)
        before = await replicas.versions()

        async def one(i: int) -> ReplicaResult:
            target, seen = replicas.targets[i], before[i]
            if isinstance(seen, str):
                return ReplicaResult(target, None, error=seen)
            if seen >= version:
                return ReplicaResult(target, seen, skipped=True)
            return await replicas.load(i, export.path, version)

        results = await asyncio.gather(*(one(i) for i in range(len(replicas.targets))))
        report = PushReport(version, list(results), time.perf_counter() - started)
        _log(report, "filesystem")
        return report

    async def close(self) -> None:
        await self._replicas.close()


@dataclass
class _Group:
    """One replica's weight group (learner rank 0 + that replica's engine workers)."""

    name: str
    incarnation: str
    """The replica's process id (Status) when the group formed: a replica restarted at the
    same address reports another, and its group is formed anew rather than reused."""


class NcclWeightSync(WeightSync):
    """One broadcast per push over one weight group per replica (module docstring)."""

    def __init__(
        self,
        learner: str,
        rollouts: Sequence[str],
        *,
        port: int,
        bucket_bytes: int,
        dtype: str = "",
        timeout_s: float = 600.0,
        options: ChannelOptions | None = None,
        rollout_server_name: str | None = None,
    ) -> None:
        self._replicas = _Replicas(
            learner, rollouts, options or ChannelOptions(timeout_s=3600.0), rollout_server_name
        )
        self.master = learner_host(learner)
        self.port = port
        self.bucket_bytes = bucket_bytes
        self.dtype = dtype
        self.timeout_s = timeout_s
        self._groups: dict[int, _Group] = {}
        """Each replica's group, by replica index."""

    async def push(self) -> PushReport:
        started = time.perf_counter()
        replicas = self._replicas
        version = await replicas.learner.version()
        statuses = await replicas.statuses()
        results: dict[int, ReplicaResult] = {}
        behind: list[int] = []
        gone: list[int] = []
        for i, status in enumerate(statuses):
            target = replicas.targets[i]
            if isinstance(status, str):
                results[i] = ReplicaResult(target, None, error=status)
                gone.append(i)
            elif status.weight_version < version or status.needs_reload:
                behind.append(i)
            else:
                results[i] = ReplicaResult(target, int(status.weight_version), skipped=True)
        # Unreachable replicas' groups are of no use (one comes back with a new incarnation).
        await asyncio.gather(*(self._dissolve(i) for i in gone))
        if behind:
            results.update(await self._push(version, behind, statuses))
        report = PushReport(
            version,
            [results[i] for i in range(len(replicas.targets))],
            time.perf_counter() - started,
        )
        _log(report, "nccl")
        return report

    async def _push(
        self,
        version: int,
        behind: list[int],
        statuses: Sequence[rollout_pb2.RolloutStatusResponse | str],
    ) -> dict[int, ReplicaResult]:
        """Broadcast to the groups of ``behind`` (each formed first if it has none, or its
        replica's incarnation changed); reload from the fallback export who broke off."""
        results: dict[int, ReplicaResult] = {}
        failed: dict[int, str] = {}
        members: list[int] = []
        for i in behind:
            group = self._groups.get(i)
            if group is not None and group.incarnation == _status(statuses[i]).incarnation:
                members.append(i)
                continue
            try:
                await self._form(i, _status(statuses[i]))
            except _GroupFailed as exc:
                logger.warning(
                    "could not form %s's weight group: %s", self._replicas.targets[i], exc
                )
                failed[i] = str(exc)
            else:
                members.append(i)
        if members:
            received = await self._broadcast(members, version)
            for i, outcome in received.items():
                if isinstance(outcome, ReplicaResult):
                    results[i] = outcome
                else:
                    failed[i] = outcome
            # A broken broadcast leaves its group unusable.
            await asyncio.gather(*(self._dissolve(i) for i in failed if i in self._groups))
        if failed:
            results.update(await self._reload(sorted(failed), version, failed))
        return results

    async def _form(self, i: int, status: rollout_pb2.RolloutStatusResponse) -> _Group:
        """Form replica ``i``'s group (closing its previous one): learner rank 0 + its ranks."""
        await self._dissolve(i)
        replicas = self._replicas
        target = replicas.targets[i]
        name = uuid.uuid4().hex[:12]
        world = 1 + max(1, int(status.weight_group_ranks))
        deadline = self.timeout_s + 30.0
        outcomes = await asyncio.gather(
            replicas.learner.stub.OpenWeightGroup(
                learner_pb2.OpenWeightGroupRequest(
                    group=name, world_size=world, timeout_s=self.timeout_s, replica=target
                ),
                timeout=deadline,
            ),
            replicas.rollout.stub(target).JoinWeightGroup(
                rollout_pb2.JoinWeightGroupRequest(
                    master_address=self.master,
                    port=self.port,
                    group=name,
                    rank_offset=1,
                    world_size=world,
                    timeout_s=self.timeout_s,
                ),
                timeout=deadline,
            ),
            return_exceptions=True,
        )
        errors = [_error_text(o, "forming the weight group") for o in outcomes if _failed(o)]
        group = _Group(name, status.incarnation)
        self._groups[i] = group
        if errors:
            await self._dissolve(i)
            raise _GroupFailed("; ".join(errors))
        logger.info("weight group %s formed with %s (%d ranks)", name, target, world)
        return group

    async def _broadcast(self, members: list[int], version: int) -> dict[int, ReplicaResult | str]:
        """One broadcast to the groups of ``members`` at once: each one's result, or the error
        that left it needing a reload."""
        replicas = self._replicas
        # The groups' own deadlines (per collective) end a stalled broadcast; this one only
        # bounds the calls: receivers may wait twice timeout_s (models.broadcast.Rendezvous).
        deadline = 2 * self.timeout_s + 60.0
        begun = time.perf_counter()
        send = replicas.learner.stub.BroadcastWeights(
            learner_pb2.BroadcastWeightsRequest(
                groups=[self._groups[i].name for i in members],
                bucket_bytes=self.bucket_bytes,
                dtype=self.dtype,
            ),
            timeout=deadline,
        )
        receives = [
            replicas.rollout.stub(replicas.targets[i]).ReceiveWeights(
                rollout_pb2.ReceiveWeightsRequest(group=self._groups[i].name, version=version),
                timeout=deadline,
            )
            for i in members
        ]
        sent, *answers = await asyncio.gather(send, *receives, return_exceptions=True)
        if isinstance(sent, aio.AioRpcError) and sent.code() == grpc.StatusCode.DATA_LOSS:
            # The learner refused its own weights (NaN or infinity): every receiver was told
            # and keeps its previous weights; the run cannot go on (PolicyDiverged).
            raise error_from_rpc(sent, "learner BroadcastWeights") from sent
        broken: dict[str, str] = {}
        if isinstance(sent, learner_pb2.BroadcastWeightsResponse):
            broken = dict(sent.broken)
        else:
            logger.warning("the learner's broadcast failed: %s", _error_text(sent, "broadcast"))
        out: dict[int, ReplicaResult | str] = {}
        for i, answer in zip(members, answers, strict=True):
            target = replicas.targets[i]
            if isinstance(answer, rollout_pb2.UpdateWeightsResponse):
                out[i] = ReplicaResult(
                    target,
                    int(answer.weight_version),
                    bytes=answer.bytes,
                    seconds=time.perf_counter() - begun,
                )
            elif (
                isinstance(answer, aio.AioRpcError)
                and answer.code().name == "FAILED_PRECONDITION"
                and self._groups[i].name not in broken
            ):
                # Refused as stale before loading, the broadcast drained: its weights are whole
                # and current, its group intact. (Refused because it is in no group, the
                # learner reports the group broken: reloaded below.)
                out[i] = ReplicaResult(target, None, skipped=True)
            elif isinstance(answer, aio.AioRpcError) and answer.code().name == "INVALID_ARGUMENT":
                # Refused before loading (another model): its weights are whole, and a reload
                # of the same export would be refused too.
                out[i] = ReplicaResult(target, None, error=_error_text(answer, "ReceiveWeights"))
            else:
                why = _error_text(answer, f"ReceiveWeights on {target}")
                learner_side = broken.get(self._groups[i].name)
                out[i] = f"{why} (learner: {learner_side})" if learner_side else why
        return out

    async def _reload(
        self, indices: list[int], version: int, why: dict[int, str]
    ) -> dict[int, ReplicaResult]:
        """Reload replicas from a filesystem export of the current version."""
        replicas = self._replicas
        try:
            export = await replicas.export(self.dtype)
        except Exception as exc:  # noqa: BLE001 - reported per replica, the push goes on
            return {
                i: ReplicaResult(
                    replicas.targets[i], None, error=f"{why[i]}; fallback export failed: {exc}"
                )
                for i in indices
            }
        loaded = await asyncio.gather(
            *(replicas.load(i, export.path, int(export.policy_version)) for i in indices)
        )
        out = {}
        for i, result in zip(indices, loaded, strict=True):
            if result.error is None:
                out[i] = ReplicaResult(
                    result.target,
                    result.version,
                    bytes=result.bytes,
                    seconds=result.seconds,
                    fallback=True,
                )
                logger.info(
                    "%s reloaded from %s after its broadcast failed (%s)",
                    result.target,
                    export.path,
                    why[i],
                )
            else:
                out[i] = ReplicaResult(
                    result.target, None, error=f"{why[i]}; fallback reload: {result.error}"
                )
        return out

    async def _dissolve(self, i: int) -> None:
        """Close replica ``i``'s group on the learner and the replica (best effort)."""
        group = self._groups.pop(i, None)
        if group is None:
            return
        replicas = self._replicas
        await asyncio.gather(
            replicas.learner.stub.CloseWeightGroup(
                learner_pb2.CloseWeightGroupRequest(group=group.name), timeout=60.0
            ),
            replicas.rollout.stub(replicas.targets[i]).LeaveWeightGroup(
                rollout_pb2.LeaveWeightGroupRequest(group=group.name), timeout=60.0
            ),
            return_exceptions=True,
        )

    async def close(self) -> None:
        await asyncio.gather(*(self._dissolve(i) for i in list(self._groups)))
        await self._replicas.close()


class _GroupFailed(Exception):
    """Forming a replica's weight group failed (it is reloaded from the filesystem)."""


def _status(status: rollout_pb2.RolloutStatusResponse | str) -> rollout_pb2.RolloutStatusResponse:
    assert not isinstance(status, str)
    return status


def _failed(outcome: object) -> bool:
    return isinstance(outcome, BaseException)


def _error_text(outcome: object, what: str) -> str:
    if isinstance(outcome, aio.AioRpcError):
        return str(error_from_rpc(outcome, what))
    return f"{what}: {outcome}"


def learner_host(target: str) -> str:
    """The host part of the learner's target (``dns:///host:port``, ``host:port``)."""
    address = target.removeprefix("dns:///").removeprefix("dns:").removeprefix("ipv4:")
    host = address.split(",")[0].rpartition(":")[0]
    return host.strip("[]") or "127.0.0.1"


def wire_dtype(spec: RunSpec) -> str:
    """The dtype weights travel in: "auto" is the rollout's own parameter dtype."""
    transport = spec.weight_transport
    if transport.type in ("grpc", "nccl") and transport.dtype != "auto":
        return transport.dtype
    if spec.policy.dtype != "auto":
        return spec.policy.dtype
    return "bfloat16" if spec.rollout.resources.gpus > 0 else "float32"


def make_weight_sync(
    spec: RunSpec,
    learner: str,
    rollouts: Sequence[str],
    *,
    options: ChannelOptions | None = None,
    rollout_server_name: str | None = None,
) -> WeightSync:
    """The :class:`WeightSync` of ``spec.weightTransport`` between ``learner`` and ``rollouts``.

    ``rollouts`` lists every replica (see :func:`aflowrl.trainer.clients.replica_targets` for a
    headless Service); ``options`` are the run's channel options (auth token, TLS), whose
    deadline is raised to fit a push; with TLS the replicas' certificates are verified against
    ``rollout_server_name`` (that Service's DNS name).
    """
    transport = spec.weight_transport
    max_message = spec.grpc.max_message_mib * _MIB
    options = dataclasses.replace(
        options or ChannelOptions.from_spec(spec.grpc, timeout_s=3600.0),
        timeout_s=3600.0,
        max_message_bytes=max_message,
    )
    if transport.type == "grpc":
        return GrpcWeightSync(
            learner,
            rollouts,
            chunk_bytes=min(transport.chunk_mib * _MIB, max_message - 64 * 1024),
            dtype=wire_dtype(spec),
            options=options,
            rollout_server_name=rollout_server_name,
        )
    if transport.type == "filesystem":
        return FilesystemWeightSync(
            learner,
            rollouts,
            dtype=wire_dtype(spec),
            options=options,
            rollout_server_name=rollout_server_name,
        )
    return NcclWeightSync(
        learner,
        rollouts,
        port=transport.port,
        bucket_bytes=transport.bucket_mib * _MIB,
        dtype=wire_dtype(spec),
        timeout_s=transport.timeout_s,
        options=options,
        rollout_server_name=rollout_server_name,
    )


def _log(report: PushReport, transport: str) -> None:
    for failure in report.failed:
        logger.warning(
            "weights v%d not taken by %s: %s", report.version, failure.target, failure.error
        )
    logger.info(
        "pushed weights v%d over %s to %d/%d replicas in %.2fs",
        report.version,
        transport,
        sum(1 for r in report.replicas if r.error is None),
        len(report.replicas),
        report.seconds,
    )
