"""Where an iteration's wall time goes: the share of each phase, and the trainer's own overhead.

Runs a short local training (every service a real local process, the surrogate executor) and
reads the per-iteration timings the trainer records (``time/<phase>``, ``time/iteration``,
``time/service_calls``; :mod:`aflowrl.trainer.clock`). Prints, averaged over the iterations after
the first (which warms caches and compiles nothing but still starts cold), each phase's share of
the iteration's wall time and the overhead ratio: time with no service call in flight (advantage
computation, bookkeeping, records, plots) over the iteration time. Episodes act and step
independently, so ``generate`` and ``step`` overlap (each is the wall time during which at least
one such call was in flight) and the shares may add up to more than 100%.

    python bench/throughput.py [-f run.yaml] [--iterations 4]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

from aflowrl import presets
from aflowrl.cli._io import load_spec
from aflowrl.config import RunSpec
from aflowrl.local.launcher import local_spec
from aflowrl.local.run import run_local
from aflowrl.trainer.metrics import PHASES
from aflowrl.trainer.records import RunDirectory


def _spec(path: str | None, iterations: int, run_dir: Path) -> RunSpec:
    doc = (load_spec(path) if path else presets.load()).to_document()
    doc["trainer"].update({"iterations": iterations, "finalTestEval": False, "checkpointEvery": 2})
    return local_spec(RunSpec.from_document(doc), run_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-f", "--file", help="RunSpec file; default: the embedded default")
    parser.add_argument("--iterations", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="aflowrl-throughput-") as tmp:
        run_dir = Path(tmp)
        spec = _spec(args.file, args.iterations, run_dir)
        asyncio.run(run_local(spec, run_dir))
        records = RunDirectory(run_dir).read_metrics()
    measured = records[1:] if len(records) > 1 else records
    total = statistics.fmean(r["time/iteration"] for r in measured)
    print(
        f"{len(measured)} iterations measured (after the first), mean {total:.2f} s each; "
        f"{spec.trainer.tasks_per_iteration} x {spec.trainer.group_size} episodes of "
        f"{spec.environment.search.max_steps} steps on "
        f"{', '.join(spec.environment.training_benchmarks)}"
    )
    print(f"{'phase':<14}{'seconds':>9}{'share':>8}")
    for phase in PHASES:
        seconds = statistics.fmean(r[f"time/{phase}"] for r in measured)
        print(f"{phase:<14}{seconds:>9.2f}{seconds / total:>8.1%}")
    calls = statistics.fmean(r["time/service_calls"] for r in measured)
    overhead = statistics.fmean(r["time/overhead_ratio"] for r in measured)
    print(f"{'in services':<14}{calls:>9.2f}{calls / total:>8.1%}")
    print(f"trainer overhead (no service call in flight) / iteration time: {overhead:.3f}")


if __name__ == "__main__":
    main()
