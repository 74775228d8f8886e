"""Routing environment calls to replicas by consistent hashing, with failover.

The environment service keeps no episode state, so any replica can serve any call; but each
replica caches evaluations, so calls that evaluate the same workflow should meet on the same
replica (CONTRACTS.md, "Environment service <-> trainer"):

- ``Project(state, action)`` on any replica (the one owning the episode's key, for stability)
  gives the child workflow's hash without evaluating it;
- ``Step`` goes to the replica owning that hash on a consistent-hash ring (Karger et al., 1997,
  "Consistent hashing and random trees"; 64 virtual nodes per replica), so trajectories of a
  group that reach the same workflow share its evaluation; an invalid action (no child hash)
  goes to the episode's replica;
- ``Evaluate`` goes to the owner of the workflow's hash, ``Reset`` to the owner of a key the
  caller chooses (the seed workflow's hash: every episode starts by evaluating it).

A replica that answers UNAVAILABLE (after the channel's own retries) is marked down for a
cool-down and the call moves to the next replica on the ring; every call here is idempotent, so
the retry is safe. A down replica gets keys back when :meth:`EnvironmentClient.refresh` finds it
SERVING again. ``refresh`` also re-resolves the target, so a headless Service's new pods join.
Used by the trainer (:mod:`aflowrl.trainer.loop`).
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from aflowrl._proto.v1 import environment_pb2, environment_pb2_grpc
from aflowrl.common.client import ChannelOptions, error_from_rpc, make_channel
from aflowrl.trainer.errors import NoReplicaError
from aflowrl.trainer.weight_sync import replica_targets

logger = logging.getLogger(__name__)

T = TypeVar("T")

VIRTUAL_NODES = 64
"""Points per replica on the ring: keys spread evenly, and a lost replica's keys spread over
all the others rather than landing on one neighbour."""


def key_hash(key: str) -> int:
    """A 64-bit position on the ring (first 8 bytes of SHA-256: stable across processes)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


class HashRing:
    """A consistent-hash ring over replica addresses."""

    def __init__(self, members: Sequence[str], *, vnodes: int = VIRTUAL_NODES) -> None:
        self.members = tuple(sorted(set(members)))
        points = sorted(
            (key_hash(f"{member}#{v}"), member) for member in self.members for v in range(vnodes)
        )
        self._hashes = [h for h, _ in points]
        self._owners = [m for _, m in points]

    def owners(self, key: str) -> list[str]:
        """Every member once, in ring order from ``key``'s position (the first owns the key)."""
        if not self.members:
            return []
        start = bisect.bisect(self._hashes, key_hash(key))
        seen: list[str] = []
        for i in range(len(self._owners)):
            member = self._owners[(start + i) % len(self._owners)]
            if member not in seen:
                seen.append(member)
                if len(seen) == len(self.members):
                    break
        return seen


@dataclass
class _Replica:
    address: str
    channel: aio.Channel
    stub: Any
    """EnvironmentServiceStub (typed for the sync API; this is an asyncio channel)."""
    down_until: float = 0.0
    calls: int = 0


@dataclass(frozen=True)
class Failover:
    """A call that moved to another replica."""

    method: str
    address: str
    """The replica that failed."""
    error: str


@dataclass
class RoutingStats:
    """Counters since the last :meth:`EnvironmentClient.take_stats`."""

    calls: dict[str, int] = field(default_factory=dict)
    """Calls served, per replica address."""
    failovers: list[Failover] = field(default_factory=list)


class EnvironmentClient:
    """The environment replicas behind one target, with routing and failover (module docstring)."""

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        options: ChannelOptions | None = None,
        step_timeout_s: float = 1800.0,
        cooldown_s: float = 10.0,
        resolve: Callable[[str], list[str]] = replica_targets,
    ) -> None:
        self.target = target
        self.options = options or ChannelOptions(timeout_s=60.0)
        self.step_timeout_s = step_timeout_s
        self.cooldown_s = cooldown_s
        self._resolve = resolve
        self._replicas: dict[str, _Replica] = {}
        self._ring = HashRing([])
        self._stats = RoutingStats()

    # ---- membership --------------------------------------------------------------------------

    def _addresses(self) -> list[str]:
        if isinstance(self.target, str):
            return self._resolve(self.target)
        return list(self.target)

    async def refresh(self) -> list[str]:
        """Re-resolve the target, open channels to new replicas, revive recovered ones."""
        addresses = sorted(set(await asyncio.to_thread(self._addresses)))  # DNS may block
        for address in addresses:
            if address not in self._replicas:
                channel = make_channel(address, self.options)
                stub = environment_pb2_grpc.EnvironmentServiceStub(channel)
                self._replicas[address] = _Replica(address, channel, stub)
        for address in [a for a in self._replicas if a not in addresses]:
            await self._replicas.pop(address).channel.close()
        self._ring = HashRing(addresses)
        down = [r for r in self._replicas.values() if r.down_until > 0]
        await asyncio.gather(*(self._probe(r) for r in down))
        return addresses

    async def _probe(self, replica: _Replica) -> None:
        stub = health_pb2_grpc.HealthStub(replica.channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=2.0)
        except aio.AioRpcError:
            return
        if reply.status == health_pb2.HealthCheckResponse.SERVING:
            logger.info("environment replica %s is serving again", replica.address)
            replica.down_until = 0.0

    @property
    def addresses(self) -> list[str]:
        return list(self._ring.members)

    def live_addresses(self) -> list[str]:
        now = time.monotonic()
        return [a for a in self._ring.members if self._replicas[a].down_until <= now]

    def route(self, key: str) -> list[str]:
        """Replicas to try for ``key``: live ones in ring order, then the down ones."""
        now = time.monotonic()
        owners = self._ring.owners(key)
        live = [a for a in owners if self._replicas[a].down_until <= now]
        return live + [a for a in owners if a not in live]

    def take_stats(self) -> RoutingStats:
        """The counters since the last call, and reset them."""
        stats, self._stats = self._stats, RoutingStats()
        return stats

    # ---- calls -------------------------------------------------------------------------------

    async def _call(
        self, method: str, key: str, invoke: Callable[[Any], Awaitable[T]]
    ) -> tuple[T, str]:
        """``invoke(stub)`` on the replicas for ``key`` in turn until one answers."""
        if not self._replicas:
            await self.refresh()
        errors: list[str] = []
        for address in self.route(key):
            replica = self._replicas[address]
            try:
                response = await invoke(replica.stub)
            except aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise error_from_rpc(exc, f"environment {method} on {address}") from exc
                replica.down_until = time.monotonic() + self.cooldown_s
                reason = f"{exc.code().name}: {exc.details()}"
                errors.append(f"{address}: {reason}")
                self._stats.failovers.append(Failover(method, address, reason))
                logger.warning(
                    "environment replica %s unavailable for %s (%s); trying the next one",
                    address,
                    method,
                    reason,
                )
                continue
            replica.calls += 1
            self._stats.calls[address] = self._stats.calls.get(address, 0) + 1
            return response, address
        raise NoReplicaError(
            f"environment {method}: no replica answered ({'; '.join(errors) or 'none known'})"
        )

    async def reset(
        self, request: environment_pb2.ResetRequest, *, key: str
    ) -> environment_pb2.ResetResponse:
        """Start an episode on the replica owning ``key``."""
        timeout = self.step_timeout_s
        response, _ = await self._call(
            "Reset", key, lambda stub: stub.Reset(request, timeout=timeout)
        )
        return response  # type: ignore[no-any-return]

    async def step(
        self,
        state: bytes,
        action: str,
        *,
        episode_key: str,
        values: environment_pb2.StateValues | None = None,
    ) -> tuple[environment_pb2.StepResponse, str]:
        """Project, then Step on the owner of the child's hash; returns (response, replica).

        ``values`` is V(s) for ``fused`` selection of the next parent.
        """
        project = environment_pb2.ProjectRequest(state=state, action=action)
        projected, _ = await self._call(
            "Project", episode_key, lambda stub: stub.Project(project, timeout=60.0)
        )
        key = projected.child_hash or episode_key
        request = environment_pb2.StepRequest(state=state, action=action, values=values)
        timeout = self.step_timeout_s
        response, address = await self._call(
            "Step", key, lambda stub: stub.Step(request, timeout=timeout)
        )
        return response, address

    async def evaluate(
        self, request: environment_pb2.EvaluateRequest, *, key: str
    ) -> environment_pb2.EvaluateResponse:
        """Evaluate a workflow on the replica owning ``key`` (its hash)."""
        timeout = self.step_timeout_s
        response, _ = await self._call(
            "Evaluate", key, lambda stub: stub.Evaluate(request, timeout=timeout)
        )
        return response  # type: ignore[no-any-return]

    async def info(self) -> list[environment_pb2.EnvInfoResponse]:
        """``Info`` of every live replica (those that fail are marked down)."""
        if not self._replicas:
            await self.refresh()

        async def one(address: str) -> environment_pb2.EnvInfoResponse | None:
            replica = self._replicas[address]
            try:
                reply: environment_pb2.EnvInfoResponse = await replica.stub.Info(
                    environment_pb2.EnvInfoRequest(), timeout=30.0
                )
            except aio.AioRpcError as exc:
                logger.warning("environment replica %s: Info failed: %s", address, exc.details())
                replica.down_until = time.monotonic() + self.cooldown_s
                return None
            return reply

        replies = await asyncio.gather(*(one(a) for a in self.live_addresses()))
        return [r for r in replies if r is not None]

    async def close(self) -> None:
        for replica in self._replicas.values():
            await replica.channel.close()
        self._replicas.clear()
        self._ring = HashRing([])
