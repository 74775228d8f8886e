"""Consistent hashing of environment calls, and failover to the next replica on the ring."""

from __future__ import annotations

import collections

import pytest

from aflowrl._proto.v1 import environment_pb2, environment_pb2_grpc
from aflowrl.common.client import ChannelOptions
from aflowrl.common.server import GrpcServer, ServerOptions, ServiceRegistration
from aflowrl.errors import InvalidInputError
from aflowrl.trainer.clients import EnvironmentClient
from aflowrl.trainer.errors import NoReplicaError
from aflowrl.trainer.routing import HashRing

SERVICE = environment_pb2.DESCRIPTOR.services_by_name["EnvironmentService"].full_name


def test_every_member_once_in_ring_order_and_the_owner_is_stable():
    ring = HashRing(["a:1", "b:1", "c:1"])
    owners = ring.owners("workflow-42")
    assert sorted(owners) == ["a:1", "b:1", "c:1"]
    assert HashRing(["c:1", "a:1", "b:1"]).owners("workflow-42") == owners


def test_losing_a_replica_moves_only_its_keys():
    keys = [f"key-{i}" for i in range(2000)]
    full = HashRing(["a:1", "b:1", "c:1", "d:1"])
    smaller = HashRing(["a:1", "b:1", "c:1"])
    moved = [k for k in keys if full.owners(k)[0] != smaller.owners(k)[0]]
    assert all(full.owners(k)[0] == "d:1" for k in moved)
    # ...and they go where the full ring already said: to the next replica on it.
    assert all(smaller.owners(k)[0] == full.owners(k)[1] for k in moved)
    shares = collections.Counter(full.owners(k)[0] for k in keys)
    assert min(shares.values()) > 0.15 * len(keys)  # 64 virtual nodes spread keys evenly


class _Env(environment_pb2_grpc.EnvironmentServiceServicer):
    """A test double recording which replica served what (the subject is the client)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.steps: list[str] = []

    async def Project(self, request, context):
        if request.action == "bad":
            raise InvalidInputError("not an action", field="action")
        child = "" if request.action == "invalid" else f"child-of-{request.action}"
        return environment_pb2.ProjectResponse(valid_action=bool(child), child_hash=child)

    async def Step(self, request, context):
        self.steps.append(request.action)
        return environment_pb2.StepResponse(
            state=request.state, reward=1.0, info=environment_pb2.StepInfo(child_hash=self.name)
        )

    async def Info(self, request, context):
        return environment_pb2.EnvInfoResponse(tasks=["humaneval"], executor_id=self.name)


async def _serve(name: str) -> tuple[GrpcServer, _Env]:
    servicer = _Env(name)
    registration = ServiceRegistration(
        servicer, environment_pb2_grpc.add_EnvironmentServiceServicer_to_server, SERVICE
    )
    server = GrpcServer(
        ServerOptions(component="environment", host="127.0.0.1", port=0, grace_s=0.1),
        [registration],
    )
    await server.start()
    return server, servicer


@pytest.fixture
async def two_replicas():
    servers = [await _serve("r0"), await _serve("r1")]
    yield servers
    for server, _ in servers:
        await server.stop()


def _client(servers) -> EnvironmentClient:
    options = ChannelOptions(timeout_s=5.0, max_attempts=2, initial_backoff_s=0.01)
    targets = [f"127.0.0.1:{server.port}" for server, _ in servers]
    return EnvironmentClient(targets, options=options, cooldown_s=60.0)


async def test_steps_go_to_the_owner_of_the_child_hash(two_replicas):
    client = _client(two_replicas)
    await client.refresh()
    for action in ("a1", "a2", "a3", "a4", "a5", "a6"):
        owner = client.route(f"child-of-{action}")[0]
        _, served_by = await client.step(b"s", action, episode_key="ep-1")
        assert served_by == owner
    # An invalid action has no child: it goes to the episode's replica.
    _, served_by = await client.step(b"s", "invalid", episode_key="ep-1")
    assert served_by == client.route("ep-1")[0]
    assert sum(client.take_stats().calls.values()) == 14  # a Project and a Step each
    await client.close()


async def test_a_dead_replica_is_skipped_and_its_keys_served_by_the_next(two_replicas):
    client = _client(two_replicas)
    await client.refresh()
    (server0, env0), (_, env1) = two_replicas
    dead = f"127.0.0.1:{server0.port}"
    action = next(
        a for a in (f"x{i}" for i in range(100)) if client.route(f"child-of-{a}")[0] == dead
    )
    await server0.stop()
    reply, served_by = await client.step(b"s", action, episode_key="ep-2")
    assert served_by != dead and reply.info.child_hash == "r1"
    assert env1.steps == [action] and env0.steps == []
    stats = client.take_stats()
    assert stats.failovers and all(f.address == dead for f in stats.failovers)
    assert client.live_addresses() == [a for a in client.addresses if a != dead]
    await client.close()


async def test_bad_input_is_not_retried_elsewhere(two_replicas):
    client = _client(two_replicas)
    with pytest.raises(InvalidInputError, match="not an action"):
        await client.step(b"s", "bad", episode_key="ep-3")
    assert not client.take_stats().failovers
    await client.close()


async def test_no_replica_left_is_a_clear_error(two_replicas):
    client = _client(two_replicas)
    await client.refresh()
    for server, _ in two_replicas:
        await server.stop()
    with pytest.raises(NoReplicaError, match="no replica answered"):
        await client.step(b"s", "a1", episode_key="ep-4")
    await client.close()


async def test_a_recovered_replica_takes_its_keys_back():
    server, _ = await _serve("r0")
    other, _ = await _serve("r1")
    client = _client([(server, None), (other, None)])
    await client.refresh()
    address = f"127.0.0.1:{server.port}"
    client._replicas[address].down_until = float("inf")  # as after a failure
    assert address not in client.live_addresses()
    await client.refresh()  # health says SERVING: back on the ring
    assert address in client.live_addresses()
    await client.close()
    await server.stop()
    await other.stop()


def test_the_default_channel_deadline_lets_a_step_run_its_whole_timeout():
    # gRPC takes the smaller of the channel's deadline and the call's: a default client whose
    # channel capped calls at 60 s cut every long Evaluate or Step short.
    client = EnvironmentClient(["127.0.0.1:1"], step_timeout_s=1234.0)
    assert client.options.timeout_s == 1234.0
    assert EnvironmentClient(["127.0.0.1:1"]).options.timeout_s == 1800.0
