"""The nccl transport's broadcast (on gloo here) against a bare torch.distributed broadcast.

One sender (learner rank 0) and ``--receivers`` members (rollout workers), each a process, join a
:class:`aflowrl.models.broadcast.WeightGroup` over loopback (``--per-replica``: one group per
receiver, rank 0 in each, sending to all at once through a
:class:`~aflowrl.models.broadcast.Fanout`, as the trainer forms them). Each round moves a
model's tensors (``--tensors`` of ``--tensor-mib``, float32, plus small ones like norms) two
ways, both ending at a barrier, so the time is until every member has everything:

- bare: ``ProcessGroup.broadcast`` of the same bytes in the same messages, already packed (the
  collective alone: nothing to pack, check or load);
- aflow-rl: :func:`~aflowrl.models.broadcast.send_weights` from named tensors (packing each
  bucket, header, manifest, trailer) to :func:`~aflowrl.models.broadcast.receive_weights`
  (unpacking each bucket into named views, checking the manifest against the model's shapes);
  ``--load`` also copies every tensor into a model-sized set of parameters, as the hf engine
  does (vLLM loads on the GPU instead).

Prints MB/s of both (median of ``--rounds``), each round's ratio and the median ratio. With
NCCL on GPUs the same code runs; this machine measures gloo only.

    python bench/weight_broadcast.py [--receivers 1] [--bucket-mib 64] [--load] [--per-replica]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from aflowrl.models import broadcast, weights

MIB = 1024 * 1024
CPU = torch.device("cpu")


def _tensors(args: argparse.Namespace) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    elements = args.tensor_mib * MIB // 4
    out: dict[str, torch.Tensor] = {}
    for i in range(args.tensors):
        out[f"layers.{i}.weight"] = torch.randn(elements, generator=generator)
        out[f"layers.{i}.norm"] = torch.randn(4096, generator=generator)
    return out


def _member(rank: int, args: argparse.Namespace, port: int, results: Any) -> None:
    torch.set_num_threads(1)
    timeout = timedelta(seconds=120)
    store = (
        broadcast.GroupStore(port, timeout_s=120).store
        if rank == 0
        else dist.TCPStore("127.0.0.1", port, timeout=timeout)  # type: ignore[attr-defined]
    )
    world = args.receivers + 1

    def join(name: str, group_rank: int, size: int) -> broadcast.WeightGroup:
        rendezvous = broadcast.Rendezvous("127.0.0.1", port, name, group_rank, size, timeout_s=120)
        return broadcast.WeightGroup.join(rendezvous, CPU, store=store)

    if not args.per_replica:
        groups = [join("bench", rank, world)]
    elif rank == 0:  # one group per receiver, as the trainer forms one per replica
        groups = [join(f"bench-{r}", 0, 2) for r in range(1, world)]
    else:
        groups = [join(f"bench-{rank}", 1, 2)]
    fanout = broadcast.Fanout(groups)
    # A group of its own for the barriers that end each measurement.
    barrier = dist.ProcessGroupGloo(  # type: ignore[attr-defined]
        dist.PrefixStore("barrier", store),
        rank,
        world,
        timeout,  # type: ignore[attr-defined]
    )
    tensors = _tensors(args)
    specs = [weights.spec_of(n, t) for n, t in tensors.items()]
    manifest = weights.Manifest.of(1, specs)
    bucket_bytes = args.bucket_mib * MIB
    plan = weights.plan_buckets(manifest.tensors, bucket_bytes, solo_bytes=broadcast.SOLO_BYTES)
    packed = [
        torch.cat([tensors[manifest.tensors[i].name].view(-1).view(torch.uint8) for i in r])
        for r in plan
    ]
    targets = {n: torch.empty_like(t) for n, t in tensors.items()}
    shapes = {s.name: s.shape for s in specs}

    def run_bare() -> float:
        barrier.barrier().wait()
        started = time.perf_counter()
        for buffer in packed:
            fanout.broadcast(buffer if rank == 0 else torch.empty_like(buffer))
        barrier.barrier().wait()
        return time.perf_counter() - started

    def run_ours(version: int) -> float:
        barrier.barrier().wait()
        started = time.perf_counter()
        if rank == 0:
            broadcast.send_weights(groups, version, tensors.items(), specs, bucket_bytes)
        else:

            def load(bucket: list[tuple[str, torch.Tensor]]) -> None:
                if args.load:
                    for name, tensor in bucket:
                        targets[name].copy_(tensor)

            broadcast.receive_weights(
                groups[0],
                accept=broadcast.Expectation(version, version - 1, shapes).check,
                start=lambda: None,
                load=load,
                finish=lambda: None,
            )
        barrier.barrier().wait()
        return time.perf_counter() - started

    bare, ours = [], []
    for round_ in range(args.rounds + 1):  # round 0 warms up
        # Alternate which goes first, so a change of load on a shared machine hits both alike.
        if round_ % 2:
            ours_s, bare_s = run_ours(round_ + 1), run_bare()
        else:
            bare_s, ours_s = run_bare(), run_ours(round_ + 1)
        if round_:
            bare.append(bare_s)
            ours.append(ours_s)
    if rank == 0:
        results.put((manifest.total_bytes, len(plan), bare, ours))
    for group in groups:
        group.close()


def main(args: argparse.Namespace) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    context = mp.get_context("spawn")
    results = context.Queue()
    members = [
        context.Process(target=_member, args=(r, args, port, results))
        for r in range(args.receivers + 1)
    ]
    for process in members:
        process.start()
    nbytes, buckets, bare, ours = results.get(timeout=1800)
    for process in members:
        process.join(60)
    bare_rate = nbytes / statistics.median(bare) / 1e6
    ours_rate = nbytes / statistics.median(ours) / 1e6
    # Each round's two runs are back to back: their ratio is compared with the machine as it
    # was that moment (its speed drifts between rounds on a shared machine).
    ratios = [b / o for b, o in zip(bare, ours, strict=True)]
    print(
        f"payload: {nbytes / 1e6:.1f} MB in {buckets} buckets of {args.bucket_mib} MiB, "
        f"{args.receivers} receiver(s), "
        f"{'one group per receiver' if args.per_replica else 'one group'}, gloo over loopback"
    )
    print(f"bare torch.distributed broadcast   {bare_rate:8.1f} MB/s (median of {args.rounds})")
    what = "send/receive_weights + load" if args.load else "send/receive_weights"
    print(f"aflow-rl {what:26s} {ours_rate:8.1f} MB/s")
    print(f"per round aflow-rl/bare: {' '.join(f'{r:.3f}' for r in ratios)}")
    print(f"ratio aflow-rl/bare = {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--receivers", type=int, default=1)
    parser.add_argument("--tensors", type=int, default=24)
    parser.add_argument("--tensor-mib", type=int, default=8)
    parser.add_argument("--bucket-mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--load", action="store_true", help="copy into parameters (hf engine)")
    parser.add_argument(
        "--per-replica",
        action="store_true",
        help="one group per receiver (rank 0 sends to all at once), as the trainer forms them",
    )
    main(parser.parse_args())
