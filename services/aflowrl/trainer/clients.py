"""The trainer's clients of the three services: every channel the trainer opens is made here.

- :class:`EnvironmentClient`: the environment replicas behind one target, with routing by
  consistent hashing (:mod:`aflowrl.trainer.routing`) and failover. ``Project(state, action)``
  gives the child workflow's hash without evaluating it; ``Step`` then goes to the replica
  owning that hash, so trajectories of a group that reach the same workflow share its
  evaluation (each replica caches evaluations); an invalid action (no child hash) goes to the
  episode's replica; ``Evaluate`` goes to the owner of the workflow's hash, ``Reset`` to the
  owner of a key the caller chooses (the seed workflow's hash). A replica that answers
  UNAVAILABLE (after the channel's own retries) is marked down for a cool-down and the call
  moves to the next replica on the ring; every call routed here is idempotent, so the retry is
  safe. :meth:`EnvironmentClient.refresh` re-resolves the target (a headless Service's new pods
  join) and gives keys back to a down replica once it is SERVING again.
- :class:`RolloutClient`: the rollout replicas; a batch is split over them in contiguous
  shares, and a replica that is unavailable hands its share to the next.
- :class:`LearnerClient`: the learner's rank 0. A row's decision becomes a ``Sequence`` (text
  mode: prompt and response tokens) or a ``ChoiceDecision`` (choice mode: prompt, every
  candidate's tokens, the chosen index), so the learner scores exactly what the rollout
  scored. ``Train`` is never retried (it would train twice); the idempotent calls are retried
  by the channel.

The weight transports (:mod:`aflowrl.trainer.weight_sync`) use the channels of a
:class:`LearnerClient` and a :class:`RolloutClient`. Channels come from
:func:`aflowrl.common.client.make_channel`. With TLS, a channel to a replica's IP verifies the
server certificate against the Service name the IP was resolved from (``server_name``), so
certificates carry Service DNS names, never pod IPs. Used by :mod:`aflowrl.trainer.app` and the
loop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import numpy as np
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from aflowrl._proto.v1 import (
    common_pb2,
    environment_pb2,
    environment_pb2_grpc,
    learner_pb2,
    learner_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
)
from aflowrl.common.client import ChannelOptions, error_from_rpc, make_channel, target_host
from aflowrl.errors import InvalidInputError
from aflowrl.search import encoding
from aflowrl.trainer.errors import NoReplicaError
from aflowrl.trainer.routing import HashRing
from aflowrl.trainer.rows import Decision

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _server_name(target: str | Sequence[str], server_name: str | None) -> str | None:
    if server_name is not None or not isinstance(target, str):
        return server_name
    return target_host(target)


def replica_targets(target: str) -> list[str]:
    """Every ``ip:port`` behind a target (a headless Service name resolves to all pods).

    ``dns:///host:port`` and ``host:port`` are resolved; ``ipv4:a:p,b:p`` lists are split.
    """
    if target.startswith("ipv4:"):
        return target.removeprefix("ipv4:").split(",")
    address = target.removeprefix("dns:///").removeprefix("dns:")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise InvalidInputError(f"{target!r} is not host:port", field="rollout target")
    infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    addresses = sorted({f"{info[4][0]}:{port}" for info in infos if info[0] == socket.AF_INET})
    return addresses or [f"{host}:{port}"]


class RolloutClient:
    """The rollout replicas behind a target; batches split over them."""

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        options: ChannelOptions | None = None,
        resolve: Callable[[str], list[str]] = replica_targets,
        server_name: str | None = None,
        max_in_flight: int = 512,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight: {max_in_flight} is below 1")
        self.target = target
        self.max_in_flight = max_in_flight
        """Calls this client keeps in flight to one replica; more wait here. A replica refuses
        calls beyond its ``grpc.maxConcurrentRpcs`` (a burst of sibling steps can be thousands), so
        the trainer sets this below it."""

        self.options = options or ChannelOptions(timeout_s=600.0)
        self.server_name = _server_name(target, server_name)
        """Name verified on the replicas' certificates; default: the host of ``target``."""
        self._resolve = resolve
        self._stubs: dict[str, Any] = {}
        self._channels: dict[str, aio.Channel] = {}

    def refresh(self) -> list[str]:
        """Re-resolve the replicas (a headless Service's pods)."""
        targets = self._resolve(self.target) if isinstance(self.target, str) else self.target
        addresses = sorted(set(targets))
        for address in addresses:
            if address not in self._stubs:
                channel = make_channel(address, self.options, server_name=self.server_name)
                self._channels[address] = channel
                self._stubs[address] = rollout_pb2_grpc.RolloutServiceStub(channel)
        return addresses

    @property
    def addresses(self) -> list[str]:
        return sorted(self._stubs) if self._stubs else self.refresh()

    async def _on_replicas(
        self, shares: int, invoke: Callable[[Any, int], Awaitable[T]], what: str
    ) -> list[T]:
        """``invoke(stub, share)`` for every share, share k first on replica k (mod n)."""
        addresses = self.addresses

        async def one(share: int) -> T:
            errors = []
            for attempt in range(len(addresses)):
                address = addresses[(share + attempt) % len(addresses)]
                try:
                    return await invoke(self._stubs[address], share)
                except aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.UNAVAILABLE:
                        raise error_from_rpc(exc, f"rollout {what} on {address}") from exc
                    errors.append(f"{address}: {exc.details()}")
                    logger.warning("rollout replica %s unavailable: %s", address, exc.details())
            raise NoReplicaError(f"rollout {what}: no replica answered ({'; '.join(errors)})")

        return list(await asyncio.gather(*(one(k) for k in range(shares))))

    def _split(self, count: int) -> list[range]:
        shares = max(1, min(count, len(self.addresses)))
        bounds = np.linspace(0, count, shares + 1).round().astype(int)
        return [range(int(a), int(b)) for a, b in itertools.pairwise(bounds)]

    async def score(
        self, items: Sequence[rollout_pb2.CandidateSet]
    ) -> list[tuple[rollout_pb2.CandidateScores, int]]:
        """Candidate scores of every item, with the weight version that scored it."""
        parts = self._split(len(items))

        async def invoke(stub: Any, share: int) -> rollout_pb2.ScoreCandidatesResponse:
            request = rollout_pb2.ScoreCandidatesRequest(items=[items[i] for i in parts[share]])
            response: rollout_pb2.ScoreCandidatesResponse = await stub.ScoreCandidates(request)
            return response

        responses = await self._on_replicas(len(parts), invoke, "ScoreCandidates")
        return [(item, int(r.weight_version)) for r in responses for item in r.items]

    async def generate(
        self,
        prompts: Sequence[common_pb2.Prompt],
        sampling: rollout_pb2.SamplingParams,
        *,
        seeds: Sequence[int] = (),
    ) -> list[tuple[rollout_pb2.PromptCompletions, int]]:
        """One completion list per prompt, with the weight version that generated it; ``seeds``
        (none, or one per prompt) seed each prompt's completions on their own."""
        if seeds and len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
        parts = self._split(len(prompts))

        async def invoke(stub: Any, share: int) -> rollout_pb2.GenerateResponse:
            request = rollout_pb2.GenerateRequest(
                prompts=[prompts[i] for i in parts[share]],
                sampling=sampling,
                prompt_seeds=[seeds[i] for i in parts[share]] if seeds else [],
            )
            response: rollout_pb2.GenerateResponse = await stub.Generate(request)
            return response

        responses = await self._on_replicas(len(parts), invoke, "Generate")
        return [(result, int(r.weight_version)) for r in responses for result in r.results]

    def channel(self, address: str) -> aio.Channel:
        """The channel to replica ``address`` (opened by :meth:`refresh`)."""
        if address not in self._channels:
            self.refresh()
        return self._channels[address]

    def stub(self, address: str) -> Any:
        """RolloutServiceStub of replica ``address`` (typed for the sync API; asyncio here)."""
        if address not in self._stubs:
            self.refresh()
        return self._stubs[address]

    async def versions_or_errors(self, addresses: Sequence[str]) -> list[int | str]:
        """Each replica's serving version, or the error that prevented asking it."""

        async def one(address: str) -> int | str:
            try:
                status = await self.stub(address).Status(rollout_pb2.RolloutStatusRequest())
            except aio.AioRpcError as exc:
                return str(error_from_rpc(exc, f"Status of {address}"))
            return int(status.weight_version)

        return list(await asyncio.gather(*(one(a) for a in addresses)))

    async def versions(self) -> dict[str, int]:
        """The weight version each replica serves."""

        async def one(address: str) -> int:
            try:
                reply = await self._stubs[address].Status(
                    rollout_pb2.RolloutStatusRequest(), timeout=30.0
                )
            except aio.AioRpcError as exc:
                raise error_from_rpc(exc, f"rollout Status on {address}") from exc
            return int(reply.weight_version)

        addresses = self.addresses
        return dict(zip(addresses, await asyncio.gather(*(one(a) for a in addresses)), strict=True))

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._stubs.clear()


@dataclass
class _Replica:
    address: str
    channel: aio.Channel
    stub: Any
    """EnvironmentServiceStub (typed for the sync API; this is an asyncio channel)."""
    slots: asyncio.Semaphore
    """Bounds this client's calls in flight to the replica (``EnvironmentClient.max_in_flight``)."""
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


_REPLICA_GONE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
"""Codes on which an environment call moves to the next replica. UNAVAILABLE: the replica is
down or draining. CANCELLED reaches this client only from the server's side (a cancellation of
ours raises ``asyncio.CancelledError`` instead): a replica stopping cancels its in-flight calls
when its grace period ends, and gRPC's server refuses some calls beyond its
``maximum_concurrent_rpcs`` with CANCELLED rather than RESOURCE_EXHAUSTED when they arrive in a
burst, which ``EnvironmentClient.max_in_flight`` keeps this client from causing. Every
environment call may be repeated (a retried Step returns the same state and reward), so both
move on."""


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
        server_name: str | None = None,
        max_in_flight: int = 512,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight: {max_in_flight} is below 1")
        self.target = target
        self.max_in_flight = max_in_flight
        """Calls this client keeps in flight to one replica; more wait here. A replica refuses
        calls beyond its ``grpc.maxConcurrentRpcs`` (a burst of sibling steps can be thousands), so
        the trainer sets this below it."""

        # The channel's deadline caps every call's own (gRPC takes the smaller): by default it
        # lets the longest calls (Reset, Step, Evaluate) run for step_timeout_s.
        self.options = options or ChannelOptions(timeout_s=step_timeout_s)
        self.server_name = _server_name(target, server_name)
        """Name verified on the replicas' certificates; default: the host of ``target``."""
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
                channel = make_channel(address, self.options, server_name=self.server_name)
                stub = environment_pb2_grpc.EnvironmentServiceStub(channel)
                slots = asyncio.Semaphore(self.max_in_flight)
                self._replicas[address] = _Replica(address, channel, stub, slots)
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
                async with replica.slots:
                    response = await invoke(replica.stub)
            except aio.AioRpcError as exc:
                if exc.code() not in _REPLICA_GONE:
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


@dataclass(frozen=True)
class Scored:
    """ComputeLogProbs results, one list per row."""

    logprobs: list[list[float]]
    values: list[list[float]] | None
    policy_version: int
    candidates: list[list[float]] | None = None
    """Per row, log pi of every candidate (choice rows; empty for text rows)."""


@dataclass(frozen=True)
class TrainRow:
    """One training sample, everything as wide as its decision."""

    decision: Decision
    old_logprobs: Sequence[float]
    advantages: Sequence[float]
    ref_logprobs: Sequence[float] = ()
    returns: Sequence[float] = ()
    old_values: Sequence[float] = ()
    value_target: float | None = None
    """Target of the decision's value replies (the step's discounted return)."""
    target_weights: Sequence[float] = ()
    """Supervised warm start: the target distribution over a choice's candidates."""
    candidate_old_logprobs: Sequence[float] = ()
    """Choice rows: log pi_old of every candidate (the update's diagnostics; needed with
    ``candidate_advantages``)."""
    candidate_advantages: Sequence[float] = ()
    """Choice rows, sibling step groups: an advantage for every candidate."""


def _sequence(decision: Decision) -> learner_pb2.Sequence:
    return learner_pb2.Sequence(
        prompt_token_ids=decision.prompt_ids,
        response_token_ids=decision.response_ids,
        value_token_ids=[common_pb2.TokenIds(ids=v) for v in decision.value_ids],
    )


def _choice(decision: Decision) -> learner_pb2.ChoiceDecision:
    return learner_pb2.ChoiceDecision(
        prompt_token_ids=decision.prompt_ids,
        candidate_token_ids=[common_pb2.TokenIds(ids=c) for c in decision.candidate_ids],
        chosen=decision.chosen,
        length_normalised=encoding.ACTIONS_LENGTH_NORMALISED,
        value_token_ids=[common_pb2.TokenIds(ids=v) for v in decision.value_ids],
    )


class LearnerClient:
    """The learner's rank 0 (module docstring)."""

    def __init__(self, target: str, *, options: ChannelOptions | None = None) -> None:
        self.target = target
        self.channel = make_channel(target, options or ChannelOptions(timeout_s=1800.0))
        self.stub: Any = learner_pb2_grpc.LearnerServiceStub(self.channel)
        """LearnerServiceStub (typed for the sync API; this is an asyncio channel)."""

    async def _call(self, what: str, call: Awaitable[T]) -> T:
        """Await ``call``; a failure becomes the domain error of its status (``what`` failed)."""
        try:
            return await call
        except aio.AioRpcError as exc:
            raise error_from_rpc(exc, f"learner {what} ({self.target})") from exc

    async def status(self) -> learner_pb2.LearnerStatusResponse:
        request = learner_pb2.LearnerStatusRequest()
        return await self._call("Status", self.stub.Status(request, timeout=60.0))

    async def version(self) -> int:
        """The policy version the learner holds."""
        return int((await self.status()).policy_version)

    async def compute_logprobs(
        self, decisions: Sequence[Decision], *, reference: bool = False, values: bool = False
    ) -> Scored:
        """Log-probs (and critic values) of every decision; choice rows get one value each."""
        request = learner_pb2.ComputeLogProbsRequest(reference=reference, values=values)
        request.sequences.extend(_sequence(d) for d in decisions if not d.is_choice)
        request.choices.extend(_choice(d) for d in decisions if d.is_choice)
        kind = "reference" if reference else "policy"
        reply: learner_pb2.ComputeLogProbsResponse = await self._call(
            f"ComputeLogProbs of the {kind}", self.stub.ComputeLogProbs(request)
        )
        # Replies come sequences first, then choices: put them back in the decisions' order.
        order = [i for i, d in enumerate(decisions) if not d.is_choice] + [
            i for i, d in enumerate(decisions) if d.is_choice
        ]
        logprobs: list[list[float]] = [[] for _ in decisions]
        out_values: list[list[float]] | None = [[] for _ in decisions] if values else None
        for k, i in enumerate(order):
            logprobs[i] = list(reply.logprobs[k].values)
            if out_values is not None:
                out_values[i] = list(reply.values[k].values)
        choices = [i for i, d in enumerate(decisions) if d.is_choice]
        candidates: list[list[float]] = [[] for _ in decisions]
        for i, scored in zip(choices, reply.candidate_logprobs, strict=False):
            candidates[i] = list(scored.values)
        return Scored(logprobs, out_values, int(reply.policy_version), candidates)

    async def train(
        self, rows: Sequence[TrainRow], iteration: int, *, supervised: bool = False
    ) -> tuple[dict[str, float], int]:
        """One policy update (the RL objective, or the warm start's ``supervised`` one);
        returns (namespaced metrics, the new policy version)."""
        objective = learner_pb2.OBJECTIVE_SFT if supervised else learner_pb2.OBJECTIVE_RL
        request = learner_pb2.TrainRequest(iteration=iteration, objective=objective)
        for row in rows:
            sample = request.samples.add()
            if row.decision.is_choice:
                sample.choice.CopyFrom(_choice(row.decision))
            else:
                sample.sequence.CopyFrom(_sequence(row.decision))
            sample.old_logprobs.extend(row.old_logprobs)
            sample.advantages.extend(row.advantages)
            sample.ref_logprobs.extend(row.ref_logprobs)
            sample.returns.extend(row.returns)
            sample.old_values.extend(row.old_values)
            if row.value_target is not None and row.decision.value_ids:
                sample.value_target = row.value_target
            sample.target_weights.extend(row.target_weights)
            sample.candidate_old_logprobs.extend(row.candidate_old_logprobs)
            sample.candidate_advantages.extend(row.candidate_advantages)
        reply: learner_pb2.TrainResponse = await self._call(
            f"Train of iteration {iteration}", self.stub.Train(request)
        )
        return dict(reply.metrics.values), int(reply.policy_version)

    async def save(self, path: str, client_state: bytes) -> learner_pb2.CheckpointResponse:
        request = learner_pb2.SaveCheckpointRequest(path=path, client_state=client_state)
        return await self._call(f"SaveCheckpoint {path}", self.stub.SaveCheckpoint(request))

    async def load(
        self, path: str, *, min_policy_version: int = 0
    ) -> learner_pb2.CheckpointResponse:
        request = learner_pb2.LoadCheckpointRequest(
            path=path, min_policy_version=min_policy_version
        )
        return await self._call(f"LoadCheckpoint {path}", self.stub.LoadCheckpoint(request))

    async def close(self) -> None:
        await self.channel.close()
