"""The nccl weight transport: learner rank 0 broadcasts buckets to each rollout replica's workers.

A :class:`WeightGroup` is a process group of its own, outside torch.distributed's default group
(the learner's ranks keep theirs; a vLLM worker keeps its tensor-parallel group): learner rank 0
and one replica's engine workers (one group per replica), a store on learner rank 0 at
``weightTransport.port`` (:class:`GroupStore`, shared by the groups), a name per group the
trainer forms, and a ``ProcessGroupNCCL`` on GPUs or a ``ProcessGroupGloo`` on CPUs. Rank 0
sends one broadcast to several groups at once (:class:`Fanout`). The protocol is the same on
both backends, so the CPU tests run the code the GPU runs:

1. header: int64 ``[MAGIC, PROTOCOL, version, manifest bytes, bucket bytes, total bytes,
   buckets, 0]``;
2. the manifest (:meth:`~aflowrl.models.weights.Manifest.to_json`, uint8);
3. the buckets of :func:`~aflowrl.models.weights.plan_buckets`: a tensor of at least
   ``SOLO_BYTES`` goes as it is (no copy), smaller ones (norms, biases) are packed, whole and
   concatenated, into uint8 buckets of at most ``weightTransport.bucketMib`` (as vLLM's
   ``packed_nccl_broadcast_producer`` packs);
4. trailer: int64 ``[END, version, buckets, total bytes, 0...]``.

A receiver applies the new weights only after the trailer: :func:`receive_weights` calls
``start`` before the first bucket, ``load`` per bucket and ``finish`` after the trailer, and a
broadcast that breaks off in between raises :class:`~aflowrl.models.errors.BroadcastBrokenError`
(after ``finish``, so an engine never keeps layers half-loaded: vLLM's layer-wise reload puts
the old tensors back where nothing arrived). A receiver that refuses the manifest (another
model, a stale version) still receives every bucket, drops them, and raises the refusal at the
end, so the collective never waits for it.

**Forming is bounded by the group's deadline** (:class:`Formation`): each member joins
through a store client of its own, the communicator is created eagerly at the join (NCCL:
non-blocking, so it can be aborted), and one tiny broadcast makes "formed" mean "every member
connected", all on a helper thread; a member that never arrives makes the join fail at
``timeout_s`` with the communicator aborted, costing its own group only. A sender whose
weights hold NaN or infinity sends a header that says so and nothing else
(:func:`send_refusal`): each receiver raises :class:`~aflowrl.models.errors.
NonFiniteWeightsError` before loading anything, and the group stays usable.

**Failure costs one group, never the process.** Every collective is waited for on the host
with a deadline (``work.wait(timeout)``: ``timeout_s`` on the sender, twice that on a receiver,
:attr:`Rendezvous.wait_s`); one that has not completed by then
(a member died or stalled: NCCL never reports a dead peer, and its ``.wait()`` alone only makes
the stream wait) aborts the communicator (``ProcessGroup.abort``) and raises
:class:`~aflowrl.models.errors.BroadcastBrokenError`. The process group's own timeout is set
beyond the deadline, and an NCCL group is built with ``TORCH_NCCL_ASYNC_ERROR_HANDLING=2``
(clean up the communicator, do not tear the process down): torch's watchdog, whose default takes
the whole process down (and with learner rank 0 the torchrun job), never acts first. On CPU,
gloo reports a member that died at the next collective ("Connection reset by peer"), and a
sender that fails closes the group so the other members fail at once too.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from aflowrl import envs
from aflowrl.models.errors import (
    BroadcastBrokenError,
    NonFiniteWeightsError,
    WeightMismatchError,
)
from aflowrl.models.weights import (
    Manifest,
    check_finite,
    check_manifest,
    plan_buckets,
    spec_of,
    unpack_bucket,
)

logger = logging.getLogger(__name__)

MAGIC = 0x61666C77  # "aflw"
END = 0x656E6421  # "end!"
PROTOCOL = 2
_WORDS = 8
REFUSED_NONFINITE = 1
"""The header's last word when the sender refuses to send its version (its weights hold NaN
or infinity, :func:`send_refusal`): the header is all that is broadcast."""
SOLO_BYTES = 1024 * 1024
"""Tensors this large are broadcast on their own: packing would copy them (bench/weight_broadcast
measures a third of gloo's time spent packing 8 MiB tensors), while a collective more costs
microseconds on NCCL and about a millisecond on gloo."""

NamedBucket = list[tuple[str, torch.Tensor]]

BACKEND_SLACK_S = 60.0
"""The process group's own timeout exceeds the collectives' deadline by this much, so the
deadline (which aborts the communicator) always acts before torch's watchdog."""
STORE_VERDICT_GRACE_S = 30.0
"""How long past the deadline a formation still on the store waits for the store's own timeout
(set to the deadline) to name the members that never arrived."""
RECEIVER_WAIT_FACTOR = 2.0
"""A receiver's deadline per collective in multiples of the sender's (:attr:`Rendezvous.wait_s`)."""
NCCL_CLEANUP_ONLY = "2"
"""``TORCH_NCCL_ASYNC_ERROR_HANDLING`` of weight groups: abort the communicator on an error or
timeout, never the process (torch's default tears the process down)."""


def group_backend(device: torch.device) -> str:
    """The collective a weight group on ``device`` uses: NCCL on CUDA, gloo elsewhere."""
    return "nccl" if device.type == "cuda" else "gloo"


@dataclass(frozen=True)
class Rendezvous:
    """Where and as whom to join a weight group."""

    host: str
    """Learner rank 0's address (the store's host)."""
    port: int
    """The store's port (weightTransport.port)."""
    group: str
    """The group's name: a new one for every group the trainer forms."""
    rank: int
    world_size: int
    timeout_s: float
    """Deadline of the join and of every collective (then the communicator is aborted)."""

    @property
    def wait_s(self) -> float:
        """How long this member waits for one collective: ``timeout_s`` on the sender (rank 0),
        twice that on a receiver, because the sender may spend one deadline on another
        replica's stalled group (:class:`Fanout`) before it sends this group's next bucket."""
        return self.timeout_s if self.rank == 0 else RECEIVER_WAIT_FACTOR * self.timeout_s


class GroupStore:
    """The TCP store of weight groups, hosted by learner rank 0 for its lifetime.

    Each group's members, rank 0 included, talk to it through a client of their own: a client
    serialises its calls, and one group's wait for a member that never comes would hold up
    every other group's rendezvous on a shared one.
    """

    def __init__(self, port: int, timeout_s: float) -> None:
        self.port = port
        self.store = dist.TCPStore(  # type: ignore[attr-defined]
            "0.0.0.0",
            port,
            is_master=True,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )


class WeightGroup:
    """One formed weight group (see module docstring)."""

    def __init__(self, pg: Any, rendezvous: Rendezvous, device: torch.device) -> None:
        self._pg: Any = pg
        self._lock = threading.Lock()
        self.rendezvous = rendezvous
        self.device = device
        self.backend = group_backend(device)

    @property
    def name(self) -> str:
        return self.rendezvous.group

    @classmethod
    def join(
        cls, rendezvous: Rendezvous, device: torch.device, *, store: Any = None
    ) -> WeightGroup:
        """Join (rank 0: with its own ``store``); returns once every member has joined, or
        raises :class:`BroadcastBrokenError` at ``rendezvous.timeout_s`` (:class:`Formation`)."""
        return Formation(rendezvous, device, store=store).wait()

    def _eager_connect(self) -> None:
        """Create the NCCL communicator now (:class:`Formation`)."""
        pg = self._pg
        if pg is None:
            raise BroadcastBrokenError(f"weight group {self.name} is closed")
        device = self.device
        if device.index is None:  # NCCL binds one device: this process's current one
            device = torch.device(device.type, torch.cuda.current_device())
        try:
            pg.eager_connect_single_device(device)
        except RuntimeError as exc:
            self.abort()
            raise BroadcastBrokenError(
                f"weight group {self.name}: the communicator could not be created: {exc}"
            ) from exc
        finally:
            del pg

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0's ``tensor`` into every member's (in place); raises when a member is gone."""
        self.complete(self.issue(tensor))

    def issue(self, tensor: torch.Tensor) -> Any:
        """Start broadcasting rank 0's ``tensor`` (:meth:`complete` waits for it)."""
        if self._pg is None:
            raise BroadcastBrokenError(f"weight group {self.name} is closed")
        options = dist.BroadcastOptions()
        options.rootRank = 0
        try:
            # No local reference to the group: abort() must hold the last one (see there).
            return self._pg.broadcast([tensor], options)
        except RuntimeError as exc:
            self.abort()
            raise BroadcastBrokenError(
                f"weight group {self.name}: a broadcast failed (communicator aborted): {exc}"
            ) from exc

    def complete(self, work: Any, until: float | None = None) -> None:
        """Wait on the host for a broadcast :meth:`issue` started, until ``until``
        (``time.monotonic()``; None: :attr:`Rendezvous.wait_s` from now); one that failed or did
        not complete by then aborts the communicator and raises."""
        wait_s = self.rendezvous.wait_s
        if until is not None:
            wait_s = max(until - time.monotonic(), 0.001)
        deadline = timedelta(seconds=wait_s)
        try:
            # On the host, with a deadline: NCCL's plain wait() only orders the stream.
            completed = work.wait(deadline)
        except RuntimeError as exc:
            self.abort()
            raise BroadcastBrokenError(
                f"weight group {self.name}: a broadcast failed or did not complete within "
                f"{self.rendezvous.wait_s:.0f}s (communicator aborted): {exc}"
            ) from exc
        if completed is False:
            self.abort()
            raise BroadcastBrokenError(
                f"weight group {self.name}: a broadcast did not complete within "
                f"{self.rendezvous.wait_s:.0f}s (communicator aborted)"
            )

    def abort(self) -> None:
        """Abort the communicator (a collective still pending on it fails) and leave the group:
        a dead or stalled member costs this group, never this process."""
        with self._lock:
            pg, self._pg = self._pg, None
        if pg is None:
            return
        try:
            pg.abort()
        except RuntimeError as exc:  # already torn down: nothing left to abort
            logger.debug("weight group %s abort: %s", self.name, exc)
        # Destroying a gloo group joins its worker threads, which wait out a stalled peer up to
        # the backend timeout: the last reference goes on a thread of its own, so an aborted
        # group never holds up the sender (and its other groups).
        box = [pg]
        del pg
        threading.Thread(
            target=_release, args=(box,), name=f"release-{self.name}", daemon=True
        ).start()

    def close(self) -> None:
        """Leave the group without waiting on its other members: an NCCL communicator is aborted
        (a graceful NCCL shutdown finalizes with every peer, and hangs on one that died or left:
        seen on an H200, learner rank 0 closing a group whose receiver had exited); a gloo group
        is shut down, so members still waiting on it fail at once."""
        if self.backend == "nccl":
            self.abort()
            return
        with self._lock:
            pg, self._pg = self._pg, None
        if pg is not None and hasattr(pg, "shutdown"):
            try:
                pg.shutdown()
            except RuntimeError as exc:  # already broken: nothing left to release
                logger.debug("weight group %s shutdown: %s", self.name, exc)
        del pg


def _new_process_group(
    backend: str, store: Any, rank: int, size: int, *, connect_s: float, timeout: timedelta
) -> Any:
    """A weight group's process group (tests put a fake in its place).

    NCCL: the communicator is non-blocking (``config.blocking = 0``, what
    ``TORCH_NCCL_USE_COMM_NONBLOCKING`` sets), so that :meth:`~WeightGroup.abort` can interrupt
    its initialisation (a blocking ``ncclCommInitRank`` waits for every rank, without a
    deadline), and its errors abort this communicator only. gloo connects to every member in
    its constructor, waiting ``connect_s`` at most (the formation's deadline); its collectives
    then get ``timeout``.
    """
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        options.config.blocking = 0
        # Read when the group is built: this group's errors abort its communicator only.
        with envs.scoped("TORCH_NCCL_ASYNC_ERROR_HANDLING", NCCL_CLEANUP_ONLY):
            return dist.ProcessGroupNCCL(store, rank, size, options)
    pg = dist.ProcessGroupGloo(store, rank, size, timedelta(seconds=max(connect_s, 0.001)))
    pg._set_default_timeout(timeout)
    return pg


def _probe(device: torch.device) -> torch.Tensor:
    """The formation's first collective: one word (tests put a fake device's in its place)."""
    return torch.zeros(1, dtype=torch.int64, device=device)


class Formation:
    """One member's formation of a weight group, bounded by ``rendezvous.timeout_s``.

    Forming runs on a helper thread of its own: connecting to the store, building the process
    group, initialising the communicator eagerly (NCCL: ``eager_connect_single_device``, a
    non-blocking ``ncclCommInitRank``; gloo connects in its constructor), then one tiny
    broadcast, so that "formed" means every member connected. :meth:`wait` waits for it until
    the deadline; a member that never arrives (its engine died before joining) makes the
    formation time out there: the communicator is aborted (close-by-abort, as a broken
    broadcast's) and :class:`BroadcastBrokenError` raised. The helper thread, left behind,
    ends by itself: gloo's constructor waits no longer than the deadline, an aborted NCCL
    initialisation returns, and a group that forms after all is aborted, never used.

    The caller's thread is held for the deadline (plus the moment the store takes to time out
    at it, when the members were still checking in), and only by its own group: other
    groups form, broadcast and close meanwhile (the learner forms off its command thread).
    """

    def __init__(self, rendezvous: Rendezvous, device: torch.device, *, store: Any = None) -> None:
        self.rendezvous = rendezvous
        self.device = device
        self.deadline = time.monotonic() + rendezvous.timeout_s
        self._store = store
        self._lock = threading.Lock()
        self._group: WeightGroup | None = None
        self._formed = False
        self._given_up = False
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._checked_in = threading.Event()  # the store phase is over, either way
        threading.Thread(target=self._form, name=f"form-{rendezvous.group}", daemon=True).start()

    @property
    def name(self) -> str:
        return self.rendezvous.group

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` gave it up (a formed group is then aborted)."""
        with self._lock:
            return self._given_up

    def _remaining(self) -> float:
        return max(self.deadline - time.monotonic(), 0.001)

    def _form(self) -> None:
        rendezvous = self.rendezvous
        try:
            store = self._store
            if store is None:
                store = dist.TCPStore(  # type: ignore[attr-defined]
                    rendezvous.host,
                    rendezvous.port,
                    is_master=False,
                    timeout=timedelta(seconds=self._remaining()),
                )
            prefixed = dist.PrefixStore(  # type: ignore[attr-defined]
                f"aflowrl-weights/{rendezvous.group}", store
            )
            self._check_in(prefixed)
            self._checked_in.set()
            backend = group_backend(self.device)
            pg = _new_process_group(
                backend,
                prefixed,
                rendezvous.rank,
                rendezvous.world_size,
                connect_s=self._remaining(),
                timeout=timedelta(seconds=rendezvous.wait_s + BACKEND_SLACK_S),
            )
            group = WeightGroup(pg, rendezvous, self.device)
            del pg
            with self._lock:
                if self._given_up:
                    group.abort()
                    return
                self._group = group
            if backend == "nccl":
                # Eager: the communicator is created now, under the deadline, not inside the
                # first broadcast of a push.
                group._eager_connect()
            group.complete(group.issue(_probe(self.device)), until=self.deadline)
            with self._lock:
                self._formed = not self._given_up
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter
            self._error = exc
        finally:
            self._checked_in.set()
            self._done.set()

    def _check_in(self, store: Any) -> None:
        """Wait, on the store alone, until every member has arrived; only then is a backend
        built. A member that never comes (its engine died before joining) thus times out here,
        before any NCCL communicator exists: on an H200, rank 0's probe broadcast on an eagerly
        initialised communicator whose peer never came could not be aborted (the abort itself
        timed out), and the process's other groups stalled behind it. The store's own wait is
        bounded by the deadline and needs no abort."""
        rendezvous = self.rendezvous
        store.set(f"arrived/{rendezvous.rank}", "1")
        everyone = [f"arrived/{rank}" for rank in range(rendezvous.world_size)]
        try:
            store.wait(everyone, timedelta(seconds=self._remaining()))
        except (RuntimeError, dist.DistError) as exc:
            missing = [key for key in everyone if not store.check([key])]
            raise BroadcastBrokenError(
                f"weight group {rendezvous.group}: {len(missing)} of "
                f"{rendezvous.world_size} members never arrived within "
                f"{rendezvous.timeout_s:.0f}s ({', '.join(missing)})"
            ) from exc

    def wait(self) -> WeightGroup:
        """The formed group; at the deadline (or once forming failed), the communicator is
        aborted and :class:`BroadcastBrokenError` raised."""
        self._done.wait(max(self.deadline - time.monotonic(), 0.0))
        if not self._checked_in.is_set():
            # Still on the store at the deadline: its own timeouts end that phase there too,
            # and its verdict (which members never arrived) beats a bare "not joined". The cap
            # only guards against a store that ignores its timeout.
            self._checked_in.wait(STORE_VERDICT_GRACE_S)
        with self._lock:
            group = self._group if self._formed else None
            self._given_up = group is None
        if group is not None:
            return group
        self.cancel()
        reason = f": {self._error}" if self._error is not None else ""
        raise BroadcastBrokenError(
            f"weight group {self.name}: not every one of {self.rendezvous.world_size} members "
            f"joined within {self.rendezvous.timeout_s:.0f}s (communicator aborted){reason}"
        ) from self._error

    def cancel(self) -> None:
        """Give up now (the group is being closed or re-formed): abort what has formed so far,
        and whatever forms later; a :meth:`wait` in progress raises."""
        with self._lock:
            self._given_up = True
            self._formed = False
            group = self._group
        if group is not None:
            group.abort()


def _release(box: list[Any]) -> None:
    """Drop an aborted group, taken out of ``box``: this thread holds its last reference."""
    pg = box.pop()
    del pg


@dataclass(frozen=True)
class Expectation:
    """What a receiver accepts (picklable: a vLLM worker process checks it)."""

    version: int
    """The version the trainer announced for this broadcast."""
    serving_version: int
    shapes: dict[str, tuple[int, ...]]
    """The engine's :meth:`~aflowrl.rollout.engine.RolloutEngine.parameter_shapes`."""

    def check(self, manifest: Manifest) -> None:
        if manifest.version != self.version:
            raise WeightMismatchError(
                f"the broadcast carries version {manifest.version}, the trainer announced "
                f"{self.version}",
                field="version",
            )
        check_manifest(
            manifest, self.shapes, serving_version=self.serving_version, field="broadcast"
        )


@dataclass(frozen=True)
class BroadcastResult:
    """What one broadcast moved."""

    manifest: Manifest
    buckets: int
    bytes: int
    broken: dict[str, str] = field(default_factory=dict)
    """Sender: the groups whose broadcast broke off (aborted), by name, with why."""


class Fanout:
    """Rank 0's side of one broadcast to several groups (one per replica) at once.

    Each tensor is issued on every live group, then each is waited for until one deadline
    (``timeout_s`` from the issue, :meth:`WeightGroup.complete`): the groups move the same
    buffer concurrently (one bucket in the learner's memory, whatever the number of groups),
    and a group that fails is aborted and dropped while the others go on. Stalled groups, any
    number of them, cost one deadline per broadcast; receivers wait twice as long
    (:attr:`Rendezvous.wait_s`), so a healthy group outlasts that wait.
    """

    def __init__(self, groups: Sequence[WeightGroup]) -> None:
        if not groups:
            raise ValueError("a broadcast needs at least one group")
        self.groups = list(groups)
        self.device = self.groups[0].device
        self.broken: dict[str, str] = {}

    @property
    def live(self) -> list[WeightGroup]:
        return [g for g in self.groups if g.name not in self.broken]

    def broadcast(self, tensor: torch.Tensor) -> None:
        """``tensor`` to every live group; raises :class:`_AllBroken` once none is left."""
        pending = []
        until = time.monotonic() + min(g.rendezvous.timeout_s for g in self.groups)
        for group in self.live:
            try:
                pending.append((group, group.issue(tensor)))
            except BroadcastBrokenError as exc:
                self._lost(group, exc)
        for group, work in pending:
            try:
                group.complete(work, until)
            except BroadcastBrokenError as exc:
                self._lost(group, exc)
        if not self.live:
            raise _AllBroken("every weight group broke off")

    def _lost(self, group: WeightGroup, exc: BroadcastBrokenError) -> None:
        logger.warning("weight group %s left out of the broadcast: %s", group.name, exc)
        self.broken[group.name] = str(exc)


class _AllBroken(BroadcastBrokenError):
    """No group of a :class:`Fanout` is left: the rest of the broadcast is skipped."""


def _words(*values: int, device: torch.device) -> torch.Tensor:
    padded = list(values) + [0] * (_WORDS - len(values))
    return torch.tensor(padded, dtype=torch.int64, device=device)


def send_weights(
    groups: Sequence[WeightGroup],
    version: int,
    tensors: Iterable[tuple[str, torch.Tensor]],
    specs: list[Any],
    bucket_bytes: int,
) -> BroadcastResult:
    """Rank 0: broadcast ``tensors`` (named, in the order of ``specs``) as header, buckets, trailer
    to every group of ``groups`` at once (:class:`Fanout`).

    ``tensors`` is consumed lazily, one bucket at a time (each may be a collective gather on the
    learner's ranks); every tensor must match its spec, or the receivers would cut the stream
    differently: a mismatch fails before its bucket is sent. A group that breaks off is aborted
    and named in the result's ``broken``; the others receive everything. Once every group has
    broken off, the rest is not sent (the caller drains ``tensors``).
    """
    group = Fanout(groups)
    try:
        return _send(group, version, tensors, specs, bucket_bytes)
    except _AllBroken:
        manifest = Manifest.of(version, specs)
        return BroadcastResult(manifest, 0, 0, dict(group.broken))


def _send(
    group: Fanout,
    version: int,
    tensors: Iterable[tuple[str, torch.Tensor]],
    specs: list[Any],
    bucket_bytes: int,
) -> BroadcastResult:
    device = group.device
    manifest = Manifest.of(version, specs)
    plan = plan_buckets(manifest.tensors, bucket_bytes, solo_bytes=SOLO_BYTES)
    blob = manifest.to_json()
    header = _words(
        MAGIC,
        PROTOCOL,
        version,
        len(blob),
        bucket_bytes,
        manifest.total_bytes,
        len(plan),
        device=device,
    )
    group.broadcast(header)
    group.broadcast(torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(device))
    stream = iter(tensors)
    # Buckets of several tensors are packed into one buffer, reused bucket after bucket (each
    # broadcast has completed before the next is packed): no allocation per bucket.
    sizes = [sum(manifest.tensors[i].nbytes for i in bucket) for bucket in plan]
    multi = [size for bucket, size in zip(plan, sizes, strict=True) if len(bucket) > 1]
    staging = torch.empty(max(multi, default=0), dtype=torch.uint8, device=device)
    for bucket, size in zip(plan, sizes, strict=True):
        parts = []
        for index in bucket:
            expected = manifest.tensors[index]
            name, tensor = next(stream)
            got = spec_of(name, tensor)
            if got != expected:
                raise WeightMismatchError(
                    f"tensor {index} is {got}, the manifest says {expected}", field="tensors"
                )
            parts.append(tensor.detach().to(device).contiguous().view(-1).view(torch.uint8))
        if len(parts) == 1:
            packed = parts[0]
        else:
            packed = staging[:size]
            torch.cat(parts, out=packed)
        group.broadcast(packed)
    group.broadcast(_words(END, version, len(plan), manifest.total_bytes, device=device))
    return BroadcastResult(manifest, len(plan), manifest.total_bytes, dict(group.broken))


def send_refusal(groups: Sequence[WeightGroup], version: int) -> BroadcastResult:
    """Rank 0: tell every group that ``version`` will not be sent (its weights hold NaN or
    infinity): a header alone, which each receiver raises as
    :class:`~aflowrl.models.errors.NonFiniteWeightsError` before loading anything. The groups
    stay usable for the next version."""
    fanout = Fanout(groups)
    with contextlib.suppress(_AllBroken):  # each broken group is named in the result
        fanout.broadcast(
            _words(MAGIC, PROTOCOL, version, 0, 0, 0, 0, REFUSED_NONFINITE, device=fanout.device)
        )
    return BroadcastResult(Manifest.of(version, []), 0, 0, dict(fanout.broken))


def receive_weights(
    group: WeightGroup,
    *,
    accept: Callable[[Manifest], None],
    start: Callable[[], None],
    load: Callable[[NamedBucket], None],
    finish: Callable[[], None],
    on_bucket: Callable[[int], None] | None = None,
) -> BroadcastResult:
    """A member's side of one broadcast (module docstring).

    ``accept`` raises to refuse the manifest (the buckets are then received and dropped, and
    the refusal raised after the trailer); ``on_bucket`` is told each bucket's size as it lands.
    """
    device = group.device
    try:
        header = _words(device=device)
        group.broadcast(header)
        magic, protocol, version, blob_size, bucket_bytes, total, count, refused = header.tolist()
        if magic != MAGIC or protocol != PROTOCOL:
            raise BroadcastBrokenError(
                f"not a weight broadcast header (magic {magic:#x}, protocol {protocol})"
            )
        if refused == REFUSED_NONFINITE:
            # Nothing follows; nothing was loaded: the old weights serve on, the group is whole.
            raise NonFiniteWeightsError(
                f"the learner refused to send version {version}: its weights hold NaN or "
                "infinity (the policy diverged)",
                field="broadcast",
            )
        blob = torch.empty(blob_size, dtype=torch.uint8, device=device)
        group.broadcast(blob)
    except RuntimeError as exc:
        raise BroadcastBrokenError(f"the weight broadcast broke off: {exc}") from exc
    manifest = Manifest.from_json(blob.cpu().numpy().tobytes())
    plan = plan_buckets(manifest.tensors, bucket_bytes, solo_bytes=SOLO_BYTES)
    if manifest.version != version or manifest.total_bytes != total or len(plan) != count:
        raise BroadcastBrokenError(
            f"header and manifest disagree (version {version} / {manifest.version}, "
            f"{total} / {manifest.total_bytes} bytes, {count} / {len(plan)} buckets)"
        )
    refusal: Exception | None = None
    try:
        accept(manifest)
    except Exception as exc:  # noqa: BLE001 - raised after the broadcast, which must go on
        refusal = exc
    started = False
    loaded = 0
    load_error: Exception | None = None
    try:
        if refusal is None:
            start()
            started = True
        for bucket in plan:
            specs = [manifest.tensors[i] for i in bucket]
            packed = torch.empty(sum(s.nbytes for s in specs), dtype=torch.uint8, device=device)
            group.broadcast(packed)
            if on_bucket is not None:
                on_bucket(packed.numel())
            if started and load_error is None and refusal is None:
                named = unpack_bucket(specs, packed)
                try:
                    check_finite(named)
                    load(named)
                    loaded += 1
                except NonFiniteWeightsError as exc:
                    # Refused like a bad manifest while nothing is loaded (the old weights
                    # serve on); after a loaded bucket the replica holds a mix: broken.
                    if loaded:
                        load_error = exc
                    else:
                        refusal = exc
                except Exception as exc:  # noqa: BLE001 - the others still need this member
                    load_error = exc
        trailer = _words(device=device)
        group.broadcast(trailer)
        if trailer.tolist()[:4] != [END, version, len(plan), total]:
            raise BroadcastBrokenError(f"bad trailer {trailer.tolist()[:4]}")
    except RuntimeError as exc:
        raise BroadcastBrokenError(
            f"the weight broadcast of version {version} broke off: {exc}"
        ) from exc
    finally:
        if started:
            finish()
    if load_error is not None:
        raise BroadcastBrokenError(
            f"loading version {version} failed midway: {load_error}"
        ) from load_error
    if refusal is not None:
        raise refusal
    return BroadcastResult(manifest, len(plan), total)


def drain(items: Iterator[Any]) -> None:
    """Consume an iterator (a learner rank that gathers but does not send)."""
    for _ in items:
        pass
