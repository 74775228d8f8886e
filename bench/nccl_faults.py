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
   replica), the shape of a group of ``tp x pp`` workers;
4. **never_arrives**: rank 0 forms group "lonely" whose other member never comes (its engine
   died before joining), with a deadline of ``--form-deadline`` seconds; meanwhile group
   "other" forms and takes a version. "lonely" must fail at its own deadline (the communicator
   initialised eagerly, then aborted: :class:`~aflowrl.models.broadcast.Formation`), after
   "other"'s push, and "other" must take a second version afterwards (the abort left the
   process and its other communicators whole);
5. **arrives_late**: the member of group "late" starts joining ``--late-s`` seconds after rank 0
   (within the deadline): the group forms and takes a version.

Push, kill and tp2 run together (kill uses push's groups); each case prints one
``PASS``/``FAIL`` line with its figures.

On CUDA the groups are NCCL communicators. One GPU holds every member: NCCL refuses two ranks of
one communicator on the same device of one host, so each process sets its own ``NCCL_HOSTID``
and the members talk as different hosts would, over NCCL's socket transport on loopback (no
NVLink, no shared memory): the MB/s are a floor, not what NVLink or InfiniBand give. On CPU the
groups are gloo (what the tests run).

    python bench/nccl_faults.py [--device cuda|cpu] [--gib 4.5] [--timeout 30]
        [--cases push,kill,tp2,never_arrives,arrives_late]
    python bench/nccl_faults.py --device cpu --gib 0.05 --timeout 40 --form-deadline 30  # gloo
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
import threading
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
    delay_s: float = 0.0,
) -> None:
    """Receive each (group, rank, size, version) of ``plan`` in turn, joining each group once;
    with ``kill_after`` (GiB), die by SIGKILL once that much of the last one has landed; with
    ``delay_s``, start joining that much later (a member that arrives late)."""
    try:
        device = _setup(role, device_name)
        import torch

        if device.type == "cuda":
            torch.zeros(1, device=device)  # CUDA initialised before the delay, not after
        time.sleep(delay_s)

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
        steps.get()  # B' has been started
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


def formation_learner(  # noqa: PLR0917 - a multiprocessing target takes positional arguments
    device_name: str,
    port: int,
    case: str,
    gib: float,
    timeout_s: float,
    form_deadline_s: float,
    results: Any,
) -> None:
    """Rank 0 of never_arrives or arrives_late (module docstring); it joins every group with a
    store client of its own, as the learner does."""
    faulthandler.dump_traceback_later(150)
    try:
        device = _setup("learner", device_name)
        import torch

        from aflowrl.models import broadcast, weights

        store = broadcast.GroupStore(port, timeout_s=timeout_s)  # hosted for the whole case
        layout = _layout(gib)

        def push(groups: list[Any], version: int) -> dict[str, Any]:
            source = [(n, _tensor(n, s, version, device)) for n, s in layout]
            specs = [weights.spec_of(n, t) for n, t in source]
            result = broadcast.send_weights(groups, version, iter(source), specs, 64 * MIB)
            if device.type == "cuda":
                torch.cuda.synchronize()
            return {"version": version, "bytes": result.bytes, "broken": dict(result.broken)}

        if case == "never_arrives":
            lonely: dict[str, Any] = {}

            def form_lonely() -> None:
                t0 = time.perf_counter()
                try:
                    _join(port, "lonely", 0, 2, form_deadline_s, device).close()
                    lonely["error"] = None
                except Exception as exc:  # noqa: BLE001 - the case's figure
                    lonely["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                lonely["seconds"] = round(time.perf_counter() - t0, 2)
                lonely["ended"] = time.monotonic()

            thread = threading.Thread(target=form_lonely)
            thread.start()
            other = _join(port, "other", 0, 2, timeout_s, device)
            formed = time.monotonic()
            first = push([other], 1)
            pushed = time.monotonic()
            thread.join()
            second = push([other], 2)  # after the abort: the process and its communicators
            other.close()
            results.put(
                {
                    "case": case,
                    "role": "learner",
                    "lonely_error": lonely["error"],
                    "lonely_seconds": lonely["seconds"],
                    "deadline_s": form_deadline_s,
                    "other_formed_before_lonely_ended": formed < lonely["ended"],
                    "other_pushed_before_lonely_ended": pushed < lonely["ended"],
                    "pushes": [first, second],
                }
            )
        else:
            t0 = time.perf_counter()
            group = _join(port, "late", 0, 2, timeout_s, device)
            joined_s = round(time.perf_counter() - t0, 2)
            out = push([group], 1)
            group.close()
            results.put({"case": case, "role": "learner", "joined_s": joined_s, **out})
        faulthandler.cancel_dump_traceback_later()
        del store
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which judges
        results.put({"case": case, "role": "learner", "error": f"{type(exc).__name__}: {exc}"})
        traceback.print_exc()
    results.close()
    results.join_thread()
    os._exit(0)


def run_formation_case(args: argparse.Namespace, case: str, ctx: Any) -> list[dict[str, Any]]:
    """One of never_arrives / arrives_late in processes of its own; its events."""
    results: Any = ctx.Queue()
    port = _free_port()
    gib = min(args.gib, 0.5)
    lead = ctx.Process(
        target=formation_learner,
        args=(args.device, port, case, gib, args.timeout, args.form_deadline, results),
    )
    lead.start()
    if case == "never_arrives":
        plan = [("other", 1, 2, 1), ("other", 1, 2, 2)]
        member = ctx.Process(
            target=receiver,
            args=("O", args.device, port, plan, gib, args.timeout, 0.0, results),
        )
    else:
        member = ctx.Process(
            target=receiver,
            args=("L", args.device, port, [("late", 1, 2, 1)], gib, args.timeout, 0.0, results),
            kwargs={"delay_s": args.late_s},
        )
    member.start()
    events: list[dict[str, Any]] = []
    expected = 3 if case == "never_arrives" else 2
    end = time.monotonic() + args.form_deadline + 2 * args.timeout + 120
    while len(events) < expected and time.monotonic() < end:
        try:
            event = results.get(timeout=1.0)
        except Exception:  # noqa: BLE001 - queue.Empty
            continue
        event.setdefault("case", case)
        events.append(event)
        print(json.dumps(event), flush=True)
        if "error" in event and event.get("role") == "learner":
            break
    for process in (lead, member):
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
    return events


def judge_formation(case: str, events: list[dict[str, Any]], deadline_s: float) -> bool:
    """Print the case's PASS/FAIL line; whether it passed."""
    learner_event = next((e for e in events if e.get("role") == "learner"), {})
    members = [e for e in events if e.get("role") in ("O", "L")]
    identical = bool(members) and all(e.get("identical") for e in members)
    errors = [e["error"] for e in events if e.get("error")]
    if case == "never_arrives":
        seconds = learner_event.get("lonely_seconds")
        failed_at_deadline = (
            seconds is not None
            and learner_event.get("lonely_error") is not None
            and "joined within" in str(learner_event.get("lonely_error"))
            and deadline_s - 1.0 <= seconds <= deadline_s + 20.0
        )
        ok = (
            failed_at_deadline
            and bool(learner_event.get("other_formed_before_lonely_ended"))
            and len(members) == 2
            and identical
            and not errors
        )
        figures = (
            f"lonely group failed after {seconds}s (deadline {deadline_s:.0f}s); other group "
            f"formed before it ended: {learner_event.get('other_formed_before_lonely_ended')}, "
            f"pushed: {learner_event.get('other_pushed_before_lonely_ended')}; "
            f"other's versions identical: {identical} ({len(members)}/2)"
        )
    else:
        ok = bool(learner_event) and identical and len(members) == 1 and not errors
        figures = f"joined after {learner_event.get('joined_s')}s; version identical: {identical}"
    if errors:
        figures += f"; errors: {errors}"
    print(f"{'PASS' if ok else 'FAIL'} {case}: {figures}", flush=True)
    return ok


CORE_CASES = ("push", "kill", "tp2")
FORMATION_CASES = ("never_arrives", "arrives_late")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--gib", type=float, default=4.5, help="bytes pushed per version")
    parser.add_argument("--timeout", type=float, default=30.0, help="the groups' deadline, s")
    parser.add_argument("--kill-after-gib", type=float, default=None)
    parser.add_argument("--json", help="also write every event here (JSON lines)")
    parser.add_argument(
        "--cases",
        default=",".join(CORE_CASES + FORMATION_CASES),
        help="comma-separated: push, kill, tp2 (these three run together), never_arrives, "
        "arrives_late",
    )
    parser.add_argument(
        "--form-deadline", type=float, default=10.0, help="never_arrives: the group's deadline, s"
    )
    parser.add_argument(
        "--late-s", type=float, default=5.0, help="arrives_late: how late the member comes, s"
    )
    args = parser.parse_args()
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(cases) - set(CORE_CASES + FORMATION_CASES))
    if unknown:
        parser.error(f"--cases: unknown {unknown}; known: {CORE_CASES + FORMATION_CASES}")
    ctx = mp.get_context("spawn")
    passed: list[bool] = []
    for case in FORMATION_CASES:
        if case in cases:
            events = run_formation_case(args, case, ctx)
            passed.append(judge_formation(case, events, args.form_deadline))
            if args.json:
                with open(args.json, "a") as fh:
                    fh.writelines(json.dumps(e) + "\n" for e in events)
    if any(c in cases for c in CORE_CASES):
        passed.append(run_core(args, ctx, [c for c in CORE_CASES if c in cases]) == 0)
    print(f"{'PASS' if all(passed) else 'FAIL'} all: {sum(passed)}/{len(passed)} case groups")
    return 0 if all(passed) else 1


def run_core(args: argparse.Namespace, ctx: Any, selected: list[str]) -> int:
    """push, kill and tp2 (module docstring), their checks filtered to ``selected``."""
    kill_after = args.kill_after_gib if args.kill_after_gib is not None else args.gib / 3
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
    steps.put("b2")
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
    return summarise(events, proc_b.exitcode, selected)


def summarise(events: list[dict[str, Any]], b_exit: int | None, selected: list[str]) -> int:
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
    common = [checks["learner alive to the end"], checks["no errors"]]
    status = 0
    for case in selected:
        mine = [ok for name, ok in checks.items() if name.startswith(f"{case}:")]
        ok = all(mine + common)
        status |= 0 if ok else 1
        print(f"{'PASS' if ok else 'FAIL'} {case}: {_figures(events, case)}", flush=True)
    return status


def _figures(events: list[dict[str, Any]], case: str) -> str:
    """The MB/s and seconds of a core case's pushes."""
    versions = {"push": (1,), "kill": (2, 3), "tp2": (4,)}[case]
    parts = []
    for event in events:
        if event.get("version") in versions and "MB/s" in event:
            parts.append(f"{event['role']} v{event['version']} {event['MB/s']} MB/s")
        if event.get("phase") == case and "seconds" in event and "version" in event:
            broken = list(event.get("broken") or [])
            parts.append(f"learner v{event['version']} {event['seconds']}s broken {broken}")
    return "; ".join(parts) or "no figures"


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "services"))
    sys.exit(main())
