"""How many problems an episode must score on for its step rewards to carry signal.

A step reward is the difference of two validation scores on the episode's N problems. For each
benchmark, the seed workflow and ``--actions`` of its admissible edits are scored on the whole
validation pool on two executor sample indices (0 and 1, the surrogate executor, in process).
Then, for each N of ``--sizes``, ``--subsets`` random N-problem subsets give each action two
readings of its reward, r0 and r1 (the same workflows and problems, other samples):

* noise sd(N) = sqrt(mean((r0 - r1)^2) / 2), the executor-sample noise of one reward (what the
  trainer reports as ``noise/reward_noise_sd``);
* signal sd = the sd across actions of their pool-wide reward (the mean of both readings),
  less the part of that spread that is noise: sqrt(max(var - noise_sd(pool)^2 / 2, 0));
* the same among the better half of the edits (those a policy is choosing among, once it has
  learnt to avoid the harmful ones), printed beside it;
* subset sd(N) = how far a subset's reward (both readings averaged) lies from the pool-wide
  one: which problems an episode drew is noise too, for a policy that must do well on others;
* SNR(N) = signal sd / noise sd(N), and the same with the subset spread added;
* the one-step oracle's lead over a uniformly random edit on each subset: choosing the best
  edit on reading 0 and scoring it on the same reading (``oracle same``: the ceiling a bench
  gets when it chooses and scores on one executor sample), and scoring it on reading 1
  (``oracle cross``: cross-fitted, the part of that lead that is not noise); mean ± SE over
  the subsets (they share problems, so the SE is a lower bound);
* the effective number of actions at the seed workflow: distinct outcome vectors (score per
  problem and sample) among the listed edits, edits that score exactly as the seed, or as
  another edit, counting once.

Prints one table per benchmark and a closing line with the smallest N whose SNR >= 1 and >= 2
for each, e.g. ``reward-noise: gsm8k N(snr>=1)=40 N(snr>=2)=160 ...``. Text benchmarks only
(code runs each sample's tests in the sandbox: slow).

    .venv/bin/python bench/reward_noise.py [--data-dir DIR] [--benchmarks gsm8k math drop]
        [--actions 8] [--sizes 5 10 20 40 80] [--subsets 20]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import statistics
import sys
from collections.abc import Sequence

from aflowrl.benchmarks import get_benchmark
from aflowrl.executor.surrogate import SurrogateExecutor
from aflowrl.rl.yardstick import distinct_outcomes, oracle_leads
from aflowrl.search import admissible_actions
from aflowrl.workflow import EvaluationResult, EvaluationSettings, Evaluator, library

TASK_TYPES = {"gsm8k": "math", "math": "math", "drop": "qa", "hotpotqa": "qa"}


def _scores(result: EvaluationResult) -> list[tuple[float, float]]:
    """(sample 0, sample 1) score of each problem, in pool order."""
    return [(p.samples[0].score, p.samples[1].score) for p in result.problems]


def _rms(values: Sequence[float]) -> float:
    return math.sqrt(math.fsum(v * v for v in values) / len(values)) if values else 0.0


async def measure(
    name: str, *, data_dir: str, actions: int, sizes: Sequence[int], subsets: int, max_pool: int
) -> dict[int, float]:
    """Print the table of one benchmark; return SNR by N (executor noise only)."""
    benchmark = get_benchmark(name)
    pool = benchmark.load("validate", data_dir)
    pool = random.Random(name).sample(pool, min(max_pool, len(pool)))
    evaluator = Evaluator(
        SurrogateExecutor(pool), benchmark, settings=EvaluationSettings(repeats=2)
    )
    seed = library.load("seed", TASK_TYPES[name])
    listed = list(admissible_actions(seed, 64))
    chosen = random.Random(f"{name}-actions").sample(listed, min(actions, len(listed)))
    base = _scores(await evaluator.evaluate(seed, pool))
    edits = [_scores(await evaluator.evaluate(c.child, pool)) for c in chosen]
    # per action, per problem: the reward's two readings
    per_problem = [
        [(c0 - b0, c1 - b1) for (c0, c1), (b0, b1) in zip(e, base, strict=True)] for e in edits
    ]
    full = [statistics.fmean((a + b) / 2 for a, b in rows) for rows in per_problem]
    full_noise = _rms(
        [
            statistics.fmean(a for a, _ in rows) - statistics.fmean(b for _, b in rows)
            for rows in per_problem
        ]
    ) / math.sqrt(2)
    spread = statistics.pvariance(full) if len(full) > 1 else 0.0
    signal = math.sqrt(max(spread - full_noise**2 / 2, 0.0))
    upper = sorted(full)[len(full) // 2 :]
    upper_signal = math.sqrt(max(statistics.pvariance(upper) - full_noise**2 / 2, 0.0))
    print(
        f"\n{name}: pool {len(pool)} problems, {len(chosen)} edits of the seed; "
        f"signal sd {signal:.4f} (actions' pool-wide rewards {min(full):+.3f}..{max(full):+.3f}); "
        f"among the better half of the edits {upper_signal:.4f}"
    )
    distinct = distinct_outcomes(edits)
    as_seed = sum(1 for e in edits if e == base)
    print(
        f"effective actions: {distinct} distinct outcome vectors among {len(edits)} listed edits "
        f"({as_seed} score exactly as the seed on every problem and sample)"
    )
    print(
        f"{'N':>6} {'noise sd':>9} {'subset sd':>9} {'SNR':>6} {'SNR+subset':>10} {'SNR half':>8} "
        f"{'oracle same':>14} {'oracle cross':>14}"
    )
    rng = random.Random(f"{name}-subsets")
    snr: dict[int, float] = {}
    for size in sizes:
        if size > len(pool):
            continue
        diffs: list[float] = []
        offsets: list[float] = []
        same: list[float] = []
        cross: list[float] = []
        for _ in range(subsets):
            picked = rng.sample(range(len(pool)), size)
            first: list[float] = []
            second: list[float] = []
            for rows, whole in zip(per_problem, full, strict=True):
                r0 = statistics.fmean(rows[i][0] for i in picked)
                r1 = statistics.fmean(rows[i][1] for i in picked)
                diffs.append(r0 - r1)
                offsets.append((r0 + r1) / 2 - whole)
                first.append(r0)
                second.append(r1)
            lead_same, lead_cross = oracle_leads(first, second)
            same.append(lead_same)
            cross.append(lead_cross)
        noise_sd = _rms(diffs) / math.sqrt(2)
        subset_sd = _rms(offsets)
        snr[size] = signal / noise_sd if noise_sd > 0 else math.inf
        both = signal / math.hypot(noise_sd, subset_sd) if noise_sd or subset_sd else math.inf
        half = upper_signal / noise_sd if noise_sd > 0 else math.inf
        print(
            f"{size:>6} {noise_sd:>9.4f} {subset_sd:>9.4f} {snr[size]:>6.2f} {both:>10.2f} "
            f"{half:>8.2f} {_mean_se(same):>14} {_mean_se(cross):>14}"
        )
    return snr


def _mean_se(values: Sequence[float]) -> str:
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):+.4f}±{se:.4f}"


def _smallest(snr: dict[int, float], at_least: float) -> str:
    found = [n for n, v in sorted(snr.items()) if v >= at_least]
    return str(found[0]) if found else f">{max(snr)}"


async def run(args: argparse.Namespace) -> None:
    parts: list[str] = []
    for name in args.benchmarks:
        snr = await measure(
            name,
            data_dir=args.data_dir,
            actions=args.actions,
            sizes=args.sizes,
            subsets=args.subsets,
            max_pool=args.max_pool,
        )
        parts.append(f"{name} N(snr>=1)={_smallest(snr, 1.0)} N(snr>=2)={_smallest(snr, 2.0)}")
    print("reward-noise: " + " ".join(parts))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=os.environ.get("AFLOWRL_DATA_DIR"))
    p.add_argument(
        "--benchmarks", nargs="+", default=["gsm8k", "math", "drop"], choices=sorted(TASK_TYPES)
    )
    p.add_argument("--actions", type=int, default=8)
    p.add_argument("--sizes", type=int, nargs="+", default=[5, 10, 20, 40, 80, 160])
    p.add_argument("--subsets", type=int, default=20)
    p.add_argument("--max-pool", type=int, default=200)
    args = p.parse_args()
    if not args.data_dir:
        sys.exit(
            "bench/reward_noise.py needs the AFlow splits: --data-dir DIR or $AFLOWRL_DATA_DIR"
        )
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
