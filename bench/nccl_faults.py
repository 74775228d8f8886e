"""The nccl transport on real communicators: a large push, a replica killed mid-broadcast, tp=2.

Learner rank 0 and the receivers (rollout workers) are processes on one machine, each joining
:class:`aflowrl.models.broadcast.WeightGroup` over loopback, one group per replica as the trainer
forms them, and moving a model-sized set of bfloat16 tensors (``--gib``) with
:func:`~aflowrl.models.broadcast.send_weights` / :func:`~aflowrl.models.broadcast.receive_weights`
into parameters preallocated on the receiver's device. Every receiver then compares each tensor
with the sender's, bit for bit. Three phases, each in its own processes but the learner's, which
lives through all of them:

1. **push**: one version to replicas A and B at once (a :class:`~aflowrl.models.broadcast.Fanout`
   over two groups); MB/s per replica;
2. **kill**: the next version; B kills itself (SIGKILL) after ``--kill-after-gib`` of it has
   landed. The learner must name B's group broken (aborted on its deadline, ``--timeout``), A must
   receive the whole version, and the learner must go on: then a fresh B' joins a new group and
   both A and B' take a third version;
3. **tp2**: one group of three members (rank 0 and the two workers of a tensor-parallel-2
   replica), the shape of a group of ``tp x pp`` workers.

On CUDA the groups are NCCL communicators. One GPU holds every member: NCCL refuses two ranks of
one communicator on the same device of one host, so each process sets its own ``NCCL_HOSTID``
and the members talk as different hosts would, over NCCL's socket transport on loopback (no
NVLink, no shared memory): the MB/s are a floor, not what NVLink or InfiniBand give. On CPU the
groups are gloo (what the tests run).

    python bench/nccl_faults.py [--device cuda|cpu] [--gib 4.5] [--timeout 30]
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import multiprocessing as mp
import os
import signal
import socket
import sys
import time
import traceback
from typing import Any

MIB = 1024 * 1024
GIB = 1024 * MIB
TENSOR_MIB = 256


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _layout(gib: float) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes: 256 MiB bf16 matrices plus a small norm beside each (packed)."""
    count = max(1, int(gib * GIB) // (TENSOR_MIB * MIB))
    rows = TENSOR_MIB * MIB // 2 // 4096
    out: list[tuple[str, tuple[int, ...]]] = []
    for i in range(count):
        out.append((f"layers.{i}.weight", (rows, 4096)))
        out.append((f"layers.{i}.norm", (4096,)))
    return out


def _tensor(name: str, shape: tuple[int, ...], version: int, device: Any) -> Any:
    """The same bits in every process (seeded per name and version on the device)."""
    import torch

    seed = (sum(name.encode()) * 1_000_003 + len(name) * 7919 + version * 104_729) % (2**31)
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=generator, device=device, dtype=torch.float32).to(
        torch.bfloat16
    )


def _setup(role: str, device_name: str) -> Any:
    os.environ["NCCL_HOSTID"] = f"aflowrl-bench-{role}"  # one "host" per process (docstring)
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_IB_DISABLE", "1")
    import torch

    if device_name == "cuda":
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
    torch.set_num_threads(1)
    return torch.device("cpu")


def _join(  # noqa: PLR0917 - a bench's plain helper
    port: int, group: str, rank: int, size: int, timeout_s: float, device: Any, store: Any = None
) -> Any:
    from aflowrl.models import broadcast

    rendezvous = broadcast.Rendezvous("127.0.0.1", port, group, rank, size, timeout_s=timeout_s)
    return broadcast.WeightGroup.join(rendezvous, device, store=store)


def receiver(  # noqa: PLR0917 - a multiprocessing target takes positional arguments
    role: str,
    device_name: str,
    port: int,
    plan: list[tuple[str, int, int, int]],
    gib: float,
    timeout_s: float,
    kill_after: float,
    results: Any,
) -> None:
    """Receive each (group, rank, size, version) of ``plan`` in turn, joining each group once;
    with ``kill_after`` (GiB), die by SIGKILL once that much of the last one has landed."""
    try:
        device = _setup(role, device_name)
        import torch

        from aflowrl.models import broadcast

        layout = _layout(gib)
        params = {n: torch.empty(s, dtype=torch.bfloat16, device=device) for n, s in layout}
        joined: dict[str, Any] = {}
        for step, (group_name, rank, size, version) in enumerate(plan):
            if group_name not in joined:  # a group lives on across versions, as in the trainer
                joined[group_name] = _join(port, group_name, rank, size, timeout_s, device)
            group = joined[group_name]
            landed = [0]
            kill_at = kill_after * GIB if kill_after and step == len(plan) - 1 else 0

            def on_bucket(
                nbytes: int, landed: list[int] = landed, kill_at: float = kill_at
            ) -> None:
                landed[0] += nbytes
                if kill_at and landed[0] >= kill_at:
                    results.put({"role": role, "event": "killing itself", "landed": landed[0]})
                    time.sleep(0.5)  # let the queue's feeder thread send it
                    os.kill(os.getpid(), signal.SIGKILL)

            def load(named: list[tuple[str, Any]]) -> None:
                for name, tensor in named:
                    params[name].view(-1).view(torch.uint8).copy_(
                        tensor.reshape(-1).view(torch.uint8)
                    )

            t0 = time.perf_counter()
            result = broadcast.receive_weights(
                group,
                accept=lambda manifest: None,
                start=lambda: None,
                load=load,
                finish=lambda: None,
                on_bucket=on_bucket,
            )
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            mismatched = [
                n for n, s in layout if not torch.equal(params[n], _tensor(n, s, version, device))
            ]
            results.put(
                {
                    "role": role,
                    "group": group_name,
                    "version": version,
                    "bytes": result.bytes,
                    "seconds": round(seconds, 2),
                    "MB/s": round(result.bytes / seconds / 1e6, 1),
                    "identical": not mismatched,
                    "mismatched": mismatched[:3],
                }
            )
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which judges
        results.put({"role": role, "error": f"{type(exc).__name__}: {exc}"})
        traceback.print_exc()
    # Out at once once reported: tearing NCCL down at interpreter exit can wait on peers that
    # are gone (the learner aborted their groups), which would hold the next phase up.
    results.close()
    results.join_thread()
    os._exit(0)


def learner(  # noqa: PLR0917 - a multiprocessing target takes positional arguments
    device_name: str, port: int, gib: float, timeout_s: float, results: Any, steps: Any
) -> None:
    """Rank 0 through every phase; ``steps`` tells it when the next phase's receivers run."""
    faulthandler.dump_traceback_later(150)  # where it hangs, if it does (cancelled when done)
    try:
        device = _setup("learner", device_name)
        import torch

        from aflowrl.models import broadcast, weights

        layout = _layout(gib)
        store = broadcast.GroupStore(port, timeout_s=timeout_s).store

        def push(groups: list[Any], version: int) -> dict[str, Any]:
            source = [(n, _tensor(n, s, version, device)) for n, s in layout]
            specs = [weights.spec_of(n, t) for n, t in source]
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            result = broadcast.send_weights(groups, version, iter(source), specs, 64 * MIB)
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            del source
            return {
                "role": "learner",
                "version": version,
                "groups": [g.name for g in groups],
                "bytes": result.bytes,
                "seconds": round(seconds, 2),
                "broken": {k: v[:160] for k, v in result.broken.items()},
            }

        def join(name: str, size: int = 2) -> Any:
            return _join(port, name, 0, size, timeout_s, device, store=store)

        # 1. push: A and B, one group each, at once.
        a, b = join("A"), join("B")
        results.put({"phase": "push", **push([a, b], 1)})
        # 2. kill: B dies mid-broadcast; then B' replaces it and both take version 3.
        steps.get()
        out = push([a, b], 2)
        results.put({"phase": "kill", **out})
        b2 = join("B2")
        results.put({"phase": "kill", "after": True, **push([a, b2], 3)})
        t0 = time.perf_counter()
        a.close()  # as the trainer does when a replica's group is re-formed or dissolved
        b2.close()
        results.put({"role": "learner", "event": "closed A and B2", "seconds": round(
            time.perf_counter() - t0, 2)})  # fmt: skip
        # 3. tp2: one group of three.
        steps.get()
        tp = join("TP", size=3)
        results.put({"phase": "tp2", **push([tp], 4)})
        tp.close()
        faulthandler.cancel_dump_traceback_later()
        results.put({"role": "learner", "event": "done", "alive": True})
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which judges
        results.put({"role": "learner", "error": f"{type(exc).__name__}: {exc}"})
        traceback.print_exc()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--gib", type=float, default=4.5, help="bytes pushed per version")
    parser.add_argument("--timeout", type=float, default=30.0, help="the groups' deadline, s")
    parser.add_argument("--kill-after-gib", type=float, default=None)
    parser.add_argument("--json", help="also write every event here (JSON lines)")
    args = parser.parse_args()
    kill_after = args.kill_after_gib if args.kill_after_gib is not None else args.gib / 3
    ctx = mp.get_context("spawn")
    results: Any = ctx.Queue()
    steps: Any = ctx.Queue()
    port = _free_port()
    events: list[dict[str, Any]] = []

    def collect(count: int, deadline_s: float) -> None:
        end = time.monotonic() + deadline_s
        got = 0
        while got < count and time.monotonic() < end:
            try:
                event = results.get(timeout=1.0)
            except Exception:  # noqa: BLE001 - queue.Empty
                continue
            events.append(event)
            print(json.dumps(event), flush=True)
            if "error" not in event and "event" not in event:
                got += 1

    def start(role: str, plan: list[tuple[str, int, int, int]], kill: float = 0.0) -> Any:
        process = ctx.Process(
            target=receiver,
            args=(role, args.device, port, plan, args.gib, args.timeout, kill, results),
        )
        process.start()
        return process

    budget = 6 * args.timeout + 120
    lead = ctx.Process(
        target=learner, args=(args.device, port, args.gib, args.timeout, results, steps)
    )
    lead.start()
    # A lives through push and kill; B dies in kill (SIGKILL by its own hand).
    proc_a = start("A", [("A", 1, 2, 1), ("A", 1, 2, 2), ("A", 1, 2, 3)])
    proc_b = start("B", [("B", 1, 2, 1), ("B", 1, 2, 2)], kill=kill_after)
    collect(3, budget)  # learner + A + B of version 1
    steps.put("kill")
    collect(2, budget)  # learner's version 2 (B broken) + A's version 2
    proc_b.join(timeout=30)
    proc_b2 = start("B2", [("B2", 1, 2, 3)])
    collect(3, budget)  # learner's version 3 + A + B2
    for process in (proc_a, proc_b2):
        process.join(timeout=60)
    steps.put("tp2")
    tp = [start(f"TP{r}", [("TP", r, 3, 4)]) for r in (1, 2)]
    collect(3, budget)  # learner + TP1 + TP2
    collect(0, 5)
    lead.join(timeout=60)
    for process in tp:
        process.join(timeout=60)
    try:
        while True:
            event = results.get(timeout=1.0)
            events.append(event)
            print(json.dumps(event), flush=True)
    except Exception:  # noqa: BLE001 - queue.Empty: nothing more
        pass
    if args.json:
        with open(args.json, "a") as fh:
            for event in events:
                fh.write(json.dumps(event) + "\n")
    return summarise(events, proc_b.exitcode)


def summarise(events: list[dict[str, Any]], b_exit: int | None) -> int:
    def find(**match: Any) -> dict[str, Any] | None:
        for event in events:
            if all(event.get(k) == v for k, v in match.items()):
                return event
        return None

    checks = {
        "push: A identical": bool((e := find(role="A", version=1)) and e["identical"]),
        "push: B identical": bool((e := find(role="B", version=1)) and e["identical"]),
        "kill: B died by SIGKILL": b_exit == -signal.SIGKILL,
        "kill: learner names B broken, not A": bool(
            (e := find(phase="kill", version=2)) and list(e["broken"]) == ["B"]
        ),
        "kill: A identical": bool((e := find(role="A", version=2)) and e["identical"]),
        "kill: next version reaches A and B'": bool(
            (e := find(phase="kill", version=3))
            and not e["broken"]
            and (a := find(role="A", version=3))
            and a["identical"]
            and (b := find(role="B2", version=3))
            and b["identical"]
        ),
        "tp2: both workers identical": bool(
            (e := find(role="TP1", version=4))
            and e["identical"]
            and (f := find(role="TP2", version=4))
            and f["identical"]
        ),
        "learner alive to the end": bool(find(role="learner", event="done")),
        "no errors": not any("error" in e for e in events),
    }
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "services"))
    sys.exit(main())
