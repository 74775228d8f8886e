"""The weight broadcast protocol on real gloo groups (members are threads of this process).

Header, manifest, buckets cut alike on both sides, trailer; a member that refuses drains the
broadcast without loading anything; a sender that dies after some buckets leaves a member that
had started loading with ``finish`` called and a :class:`BroadcastBrokenError`; a member that dies
makes the sender drop its group (reported broken) instead of waiting forever; with one group per
replica, a member that dies or stalls midway costs its own group only: the sender's other group
receives every bucket.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

from aflowrl.models import broadcast, weights
from aflowrl.models.errors import BroadcastBrokenError, StaleWeightsError, WeightMismatchError

CPU = torch.device("cpu")
KIB = 1024


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    sizes = {"embed": (64, 16), "a": (16, 16), "b": (16,), "c": (32, 16), "d": (8, 8), "e": (300,)}
    out = {n: torch.randn(s, generator=generator) for n, s in sizes.items()}
    out["b"] = out["b"].to(torch.bfloat16)
    return out


SHAPES = {n: tuple(t.shape) for n, t in _tensors().items()}


def _run(members: list[Callable[[broadcast.WeightGroup], Any]]) -> list[Any]:
    """Run each member (rank i) on its own thread in one fresh group; results or exceptions."""
    port, name = _port(), f"g{_port()}"
    store = broadcast.GroupStore(port, timeout_s=30)
    results: list[Any] = [None] * len(members)

    def member(rank: int) -> None:
        try:
            rendezvous = broadcast.Rendezvous(
                "127.0.0.1", port, name, rank, len(members), timeout_s=20
            )
            group = broadcast.WeightGroup.join(
                rendezvous, CPU, store=store.store if rank == 0 else None
            )
            try:
                results[rank] = members[rank](group)
            finally:
                group.close()
        except BaseException as exc:
            results[rank] = exc

    threads = [threading.Thread(target=member, args=(r,)) for r in range(len(members))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads), "a member hung"
    return results


class Receiver:
    """One member's engine: what it was asked to load, and when."""

    def __init__(self, version: int = 5, serving: int = 4) -> None:
        self.expectation = broadcast.Expectation(version, serving, dict(SHAPES))
        self.events: list[str] = []
        self.loaded: dict[str, torch.Tensor] = {}
        self.buckets: list[int] = []

    def __call__(self, group: broadcast.WeightGroup) -> broadcast.BroadcastResult:
        def load(bucket: list[tuple[str, torch.Tensor]]) -> None:
            self.events.append("load")
            self.loaded.update((n, t.clone()) for n, t in bucket)

        return broadcast.receive_weights(
            group,
            accept=self.expectation.check,
            start=lambda: self.events.append("start"),
            load=load,
            finish=lambda: self.events.append("finish"),
            on_bucket=self.buckets.append,
        )


def _sender(tensors: dict[str, torch.Tensor], bucket_bytes: int, version: int = 5):
    def send(group: broadcast.WeightGroup) -> broadcast.BroadcastResult:
        specs = [weights.spec_of(n, t) for n, t in tensors.items()]
        return broadcast.send_weights([group], version, tensors.items(), specs, bucket_bytes)

    return send


def test_every_member_gets_every_tensor_in_the_same_buckets():
    tensors = _tensors()
    first, second = Receiver(), Receiver()
    sent, got, also = _run([_sender(tensors, 4 * KIB), first, second])
    manifest = weights.build_manifest(5, tensors)
    plan = weights.plan_buckets(manifest.tensors, 4 * KIB)
    assert sent.buckets == got.buckets == also.buckets == len(plan) > 2
    assert first.buckets == [sum(manifest.tensors[i].nbytes for i in r) for r in plan]
    for receiver in (first, second):
        assert receiver.events == ["start"] + ["load"] * len(plan) + ["finish"]
        for name, tensor in tensors.items():
            assert receiver.loaded[name].dtype == tensor.dtype
            assert torch.equal(receiver.loaded[name], tensor)


@pytest.mark.parametrize(
    ("receiver", "error"),
    [
        (Receiver(version=6), WeightMismatchError),  # the trainer announced another version
        (Receiver(serving=5), StaleWeightsError),  # this member serves that version already
    ],
)
def test_a_member_that_refuses_drains_the_broadcast_without_loading(receiver, error):
    tensors = _tensors()
    other = Receiver()
    sent, refused, got = _run([_sender(tensors, 4 * KIB), receiver, other])
    assert isinstance(refused, error), refused
    assert receiver.events == [] and receiver.loaded == {}
    assert len(receiver.buckets) == sent.buckets  # it took part in every bucket
    assert got.buckets == sent.buckets and set(other.loaded) == set(tensors)


def test_a_sender_that_dies_midway_leaves_the_member_broken_but_finished():
    tensors = _tensors()
    plan = weights.plan_buckets(weights.build_manifest(5, tensors).tensors, 2 * KIB)
    assert len(plan) > 3

    def dies_after_two_buckets(group: broadcast.WeightGroup) -> None:
        stream = iter(tensors.items())

        def two_buckets():
            for _ in range(len(plan[0]) + len(plan[1])):
                yield next(stream)
            group.close()  # the sender's process goes away here
            raise RuntimeError("sender died")

        specs = [weights.spec_of(n, t) for n, t in tensors.items()]
        broadcast.send_weights([group], 5, two_buckets(), specs, 2 * KIB)

    receiver = Receiver()
    died, broken = _run([dies_after_two_buckets, receiver])
    assert isinstance(died, RuntimeError)
    assert isinstance(broken, BroadcastBrokenError), broken
    assert receiver.events == ["start", "load", "load", "finish"]


def test_a_member_that_dies_makes_the_sender_fail_rather_than_wait():
    tensors = _tensors()

    def dies_at_once(group: broadcast.WeightGroup) -> None:
        group.close()

    sent, _ = _run([_sender(tensors, 2 * KIB), dies_at_once])
    assert isinstance(sent, broadcast.BroadcastResult), sent
    assert list(sent.broken) and sent.buckets == 0  # its only group broke: nothing more sent


def test_a_stalled_member_aborts_the_group_at_the_deadline_and_the_next_group_works():
    """A member that joined and then stalls (its process frozen: its sockets stay open, so no
    backend error ever comes): the sender's collective reaches the group's deadline, the
    communicator is aborted and BroadcastBrokenError raised, well before the process group's
    own timeout; a group formed next, without the stalled member, broadcasts in full."""
    tensors = _tensors()
    port, name = _port(), f"g{_port()}"
    store = broadcast.GroupStore(port, timeout_s=30)
    release = threading.Event()
    outcome: list[Any] = [None, None]

    def member(rank: int) -> None:
        rendezvous = broadcast.Rendezvous("127.0.0.1", port, name, rank, 2, timeout_s=3)
        try:
            group = broadcast.WeightGroup.join(
                rendezvous, CPU, store=store.store if rank == 0 else None
            )
            if rank == 0:
                try:
                    outcome[0] = _sender(tensors, 2 * KIB)(group)
                finally:
                    release.set()
                    group.close()
            else:
                release.wait(60 + broadcast.BACKEND_SLACK_S)  # stalled, but connected
                group.close()
        except BaseException as exc:
            outcome[rank] = exc

    threads = [threading.Thread(target=member, args=(r,)) for r in range(2)]
    for thread in threads:
        thread.start()
    threads[0].join(60)
    assert not threads[0].is_alive(), "the sender waited past the deadline"
    assert isinstance(outcome[0], broadcast.BroadcastResult), outcome[0]
    assert list(outcome[0].broken) == [name]
    assert "communicator aborted" in outcome[0].broken[name]
    threads[1].join(60)

    receiver = Receiver()
    sent, received = _run([_sender(tensors, 2 * KIB), receiver])
    assert isinstance(sent, broadcast.BroadcastResult), sent
    assert isinstance(received, broadcast.BroadcastResult), received
    for name_, tensor in tensors.items():
        assert torch.equal(receiver.loaded[name_], tensor)


@pytest.mark.parametrize("how", ["dies", "stalls"])
def test_a_member_lost_midway_costs_its_own_group_and_the_other_group_gets_everything(how):
    """Rank 0 of two groups (two replicas) sends once to both; replica B's member dies (leaves
    its group) or stalls (stops taking part, sockets open: reaches the deadline) after two
    buckets. B's group is aborted and named broken; A's member receives every tensor."""
    tensors = _tensors()
    plan = weights.plan_buckets(weights.build_manifest(5, tensors).tensors, 2 * KIB)
    assert len(plan) > 3
    port = _port()
    store = broadcast.GroupStore(port, timeout_s=30)
    names = ("replica-a", "replica-b")
    release = threading.Event()
    outcome: dict[str, Any] = {}
    a = Receiver()

    def join(name: str, rank: int) -> broadcast.WeightGroup:
        rendezvous = broadcast.Rendezvous("127.0.0.1", port, name, rank, 2, timeout_s=3)
        return broadcast.WeightGroup.join(rendezvous, CPU, store=store.store if rank == 0 else None)

    def sender() -> None:
        groups: list[broadcast.WeightGroup] = []
        try:
            joined: list[Any] = [None, None]
            joiners = [
                threading.Thread(target=lambda i=i: joined.__setitem__(i, join(names[i], 0)))
                for i in range(2)
            ]
            for thread in joiners:
                thread.start()
            for thread in joiners:
                thread.join(60)
            groups = list(joined)
            specs = [weights.spec_of(n, t) for n, t in tensors.items()]
            outcome["sent"] = broadcast.send_weights(groups, 5, tensors.items(), specs, 2 * KIB)
        except BaseException as exc:
            outcome["sent"] = exc
        finally:
            release.set()
            for group in groups:
                group.close()

    def member_a() -> None:
        try:
            group = join(names[0], 1)
            try:
                outcome["a"] = a(group)
            finally:
                group.close()
        except BaseException as exc:
            outcome["a"] = exc

    def member_b() -> None:
        lost = threading.Event()
        group = join(names[1], 1)

        def after_bucket(_: int) -> None:
            if len(b.buckets) == 2:
                lost.set()
                if how == "dies":
                    group.close()
                else:
                    release.wait(60 + broadcast.BACKEND_SLACK_S)  # stalled, but connected
                    group.close()

        b = Receiver()
        try:
            broadcast.receive_weights(
                group,
                accept=b.expectation.check,
                start=lambda: None,
                load=lambda bucket: b.buckets.append(len(bucket)),
                finish=lambda: None,
                on_bucket=after_bucket,
            )
        except BaseException as exc:
            outcome["b"] = exc
        outcome["b lost"] = lost.is_set()

    threads = [threading.Thread(target=t) for t in (sender, member_a, member_b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads), "a member hung"
    sent = outcome["sent"]
    assert isinstance(sent, broadcast.BroadcastResult), sent
    assert list(sent.broken) == ["replica-b"] and sent.buckets == len(plan)
    assert outcome["b lost"] and isinstance(outcome["b"], BroadcastBrokenError), outcome
    assert isinstance(outcome["a"], broadcast.BroadcastResult), outcome["a"]
    assert a.events == ["start"] + ["load"] * len(plan) + ["finish"]
    for name, tensor in tensors.items():
        assert torch.equal(a.loaded[name], tensor)


class _RecordingGroup:
    """A process group's abort/shutdown, recorded (no communicator behind it)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def abort(self) -> None:
        self.calls.append("abort")

    def shutdown(self) -> None:
        self.calls.append("shutdown")


@pytest.mark.parametrize(("device", "expected"), [("cuda", "abort"), ("cpu", "shutdown")])
def test_closing_a_group_never_waits_on_its_members_on_nccl(device, expected):
    # A graceful NCCL shutdown finalizes with every peer and hung learner rank 0 on an H200 when
    # a receiver had exited (bench/nccl_faults.py): NCCL groups are aborted instead; gloo's
    # shutdown is kept because it makes the members still waiting fail at once.
    pg = _RecordingGroup()
    rendezvous = broadcast.Rendezvous("127.0.0.1", 1, "g", 0, 2, timeout_s=5)
    group = broadcast.WeightGroup(pg, rendezvous, torch.device(device))
    group.close()
    group.close()  # a second close is a no-op
    assert pg.calls == [expected]
    with pytest.raises(BroadcastBrokenError, match="closed"):
        group.issue(torch.zeros(1))


def _rank0_join(port: int, name: str, size: int, timeout_s: float, store: Any) -> Any:
    rendezvous = broadcast.Rendezvous("127.0.0.1", port, name, 0, size, timeout_s=timeout_s)
    return broadcast.WeightGroup.join(rendezvous, CPU, store=store.store)


def test_a_member_that_never_arrives_costs_its_group_its_own_deadline_and_no_more():
    """Rank 0 forms a group whose other member never comes (its engine died before joining):
    the join raises at the group's deadline (2 s), not at the process group's own timeout
    (``wait_s + BACKEND_SLACK_S``, 62 s), and meanwhile another group forms and broadcasts."""
    port = _port()
    store = broadcast.GroupStore(port, timeout_s=30)
    deadline_s = 2.0
    events: list[str] = []
    outcome: list[Any] = [None]
    started = threading.Event()

    def lonely() -> None:
        started.set()
        began = time.monotonic()
        try:
            _rank0_join(port, "lonely", 2, deadline_s, store)
        except BaseException as exc:
            outcome[0] = (exc, time.monotonic() - began)
        events.append("lonely gave up")

    thread = threading.Thread(target=lonely)
    thread.start()
    started.wait()
    # Another group forms and moves a whole version while "lonely" waits for its member.
    tensors = _tensors()
    receiver = Receiver()
    sent, received = _run([_sender(tensors, 4 * KIB), receiver])
    assert isinstance(sent, broadcast.BroadcastResult), sent
    assert isinstance(received, broadcast.BroadcastResult), received
    events.append("other group done")
    thread.join(120)
    assert not thread.is_alive(), "the join of a group whose member never came never returned"
    error, seconds = outcome[0]
    assert isinstance(error, BroadcastBrokenError), error
    assert "not every one of 2 members joined within 2s" in str(error)
    assert "communicator aborted" in str(error)
    backend_timeout = deadline_s + broadcast.BACKEND_SLACK_S
    assert seconds < backend_timeout / 2, (
        f"the join took {seconds:.1f}s: its deadline is {deadline_s}s, not the process "
        f"group's {backend_timeout:.0f}s"
    )


def test_a_member_that_arrives_late_within_the_deadline_joins_and_receives():
    """The receiver starts joining once rank 0 has waited a while (within the deadline)."""
    port, name = _port(), "late"
    store = broadcast.GroupStore(port, timeout_s=30)
    tensors = _tensors()
    receiver = Receiver()
    out: list[Any] = [None, None]
    rank0_waiting = threading.Event()

    def rank0() -> None:
        try:
            rank0_waiting.set()
            group = _rank0_join(port, name, 2, 30.0, store)
            try:
                out[0] = _sender(tensors, 4 * KIB)(group)
            finally:
                group.close()
        except BaseException as exc:
            out[0] = exc

    def late() -> None:
        rank0_waiting.wait()
        # Rank 0 has started forming; give it a moment on its own before arriving.
        time.sleep(1.0)
        try:
            rendezvous = broadcast.Rendezvous("127.0.0.1", port, name, 1, 2, timeout_s=30)
            group = broadcast.WeightGroup.join(rendezvous, CPU)
            try:
                out[1] = receiver(group)
            finally:
                group.close()
        except BaseException as exc:
            out[1] = exc

    threads = [threading.Thread(target=rank0), threading.Thread(target=late)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert not any(t.is_alive() for t in threads)
    assert isinstance(out[0], broadcast.BroadcastResult), out[0]
    assert isinstance(out[1], broadcast.BroadcastResult), out[1]
    for tensor_name, tensor in tensors.items():
        assert torch.equal(receiver.loaded[tensor_name], tensor)


class _FakeNcclGroup:
    """A ProcessGroupNCCL whose other members never arrive: its first collective never ends."""

    def __init__(self, calls: list[str], store: Any) -> None:
        self.calls = calls
        self.store = store

    def eager_connect_single_device(self, device: torch.device) -> None:
        self.calls.append(f"eager_connect {device}")

    def broadcast(self, tensors: list[torch.Tensor], options: Any) -> Any:
        self.calls.append("broadcast")
        calls = self.calls

        class Work:
            def wait(self, timeout: Any) -> bool:
                calls.append("wait")
                time.sleep(min(timeout.total_seconds(), 5.0))
                return False

        return Work()

    def abort(self) -> None:
        self.calls.append("abort")


def _fake_nccl(monkeypatch) -> tuple[list[str], list[tuple[str, float]]]:
    calls: list[str] = []
    built: list[tuple[str, float]] = []

    def fake(backend: str, store: Any, rank: int, size: int, *, connect_s: float, timeout: Any):
        built.append((backend, timeout.total_seconds()))
        calls.append("create")
        return _FakeNcclGroup(calls, store)

    monkeypatch.setattr(broadcast, "_new_process_group", fake)
    monkeypatch.setattr(broadcast, "_probe", lambda device: torch.zeros(1, dtype=torch.int64))
    return calls, built


def test_a_member_that_never_arrives_is_found_on_the_store_before_any_communicator_exists(
    monkeypatch,
):
    """bench/nccl_faults.py never_arrives on an H200: a probe broadcast on an eagerly created
    communicator whose peer never came could not be aborted (the abort timed out) and stalled
    the process's other groups. The members now check in on the store first, under the
    deadline, so a member that never comes costs no communicator at all."""
    calls, built = _fake_nccl(monkeypatch)
    rendezvous = broadcast.Rendezvous("127.0.0.1", 1, "g", 0, 2, timeout_s=1.0)
    with pytest.raises(BroadcastBrokenError, match=r"1 of 2 members never arrived within 1s"):
        broadcast.WeightGroup.join(rendezvous, torch.device("cuda", 0), store=dist.HashStore())
    assert calls == [] and built == []


def test_a_store_that_times_out_late_still_names_the_members_that_never_arrived(monkeypatch):
    """On a loaded machine the store's own timeout (set to the deadline) can fire after the
    caller's wait has reached the deadline: the caller then waits for the store's verdict
    instead of reporting a bare "not joined", and still no communicator is built."""
    calls, built = _fake_nccl(monkeypatch)
    check_in = broadcast.Formation._check_in

    def late_check_in(self: Any, store: Any) -> None:
        time.sleep(self.rendezvous.timeout_s + 1.0)  # the store is scheduled late, past it
        check_in(self, store)

    monkeypatch.setattr(broadcast.Formation, "_check_in", late_check_in)
    rendezvous = broadcast.Rendezvous("127.0.0.1", 1, "g", 0, 2, timeout_s=0.5)
    with pytest.raises(BroadcastBrokenError, match=r"1 of 2 members never arrived"):
        broadcast.WeightGroup.join(rendezvous, torch.device("cuda", 0), store=dist.HashStore())
    assert calls == [] and built == []


def test_an_nccl_group_is_initialised_eagerly_then_aborted_at_the_deadline(monkeypatch):
    """The NCCL order a GPU runs once every member has checked in (one that then dies before
    the communicator forms): the communicator is created non-blocking at the join (not lazily
    inside the first push), a first tiny collective is waited for until the deadline, then the
    communicator is aborted and the join raises."""
    calls, built = _fake_nccl(monkeypatch)
    store = dist.HashStore()
    store.set("aflowrl-weights/g/arrived/1", "1")  # the peer checked in, then vanished
    cuda = torch.device("cuda", 0)
    # A deadline with room for a loaded machine to reach the probe before it.
    rendezvous = broadcast.Rendezvous("127.0.0.1", 1, "g", 0, 2, timeout_s=3.0)
    with pytest.raises(BroadcastBrokenError, match="not every one of 2 members joined within"):
        broadcast.WeightGroup.join(rendezvous, cuda, store=store)
    deadline = time.monotonic() + 30
    while "abort" not in calls and time.monotonic() < deadline:
        time.sleep(0.05)
    assert calls == ["create", "eager_connect cuda:0", "broadcast", "wait", "abort"]
    assert built == [("nccl", 3.0 + broadcast.BACKEND_SLACK_S)]
