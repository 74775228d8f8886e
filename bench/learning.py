"""Does the policy learn? GiGPO and GRPO against a random policy on the surrogate executor.

One set of local services (two environment replicas with the surrogate executor, an hf rollout,
a learner) runs every training: before each, the learner reloads the checkpoint of its initial
weights and optimiser (its version lifted above the rollout's, so the push reaches it), so every
run starts from the same fresh tiny policy. Methods:

- ``gigpo``: the trainer with ``learner.algorithm.type: gigpo`` (episode + step groups);
- ``grpo``: ``grpo`` (episode groups only), same learner and hyper-parameters;
- ``random``: uniform over the admissible actions, nothing trained.

Each runs with 3 seeds (``trainer.seed``: task seeds and sampling). After training, the final
policy plays ``--eval-tasks`` x 4 evaluation episodes (nothing trained:
:func:`aflowrl.trainer.evaluate.evaluate_policy`) on held-out tasks, task seeds training never
draws (:func:`aflowrl.trainer.tasks.held_out_tasks`), chosen by the seed but the same for every
method (a paired design: each method meets the same problems). Printed per method, as
mean ± standard error over the seeds: the final episode return (the mean return of those
evaluation episodes), the training return of the last ``--last`` iterations, the best
validation score of the run and that workflow's test score; then
GiGPO's margin over random in standard errors (sqrt(se_gigpo^2 + se_random^2)) on the final
return. The best validation score is the run's final comparison's
(:mod:`aflowrl.trainer.final`): the best workflows the run kept, scored on the whole validation
split (an episode scores only its own subset of problems, where a perfect score is common and
says little). The learning problem (choice mode over at most 9 numbered actions, the tiny model's
learning rate) is the embedded default run's (``aflowrl/local/default_run.yaml``), without
checkpoints.

    python bench/learning.py [--seeds 0 1 2] [--iterations N] [--last 4] [--eval-tasks 16]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import tempfile
import time
from pathlib import Path

from aflowrl.config import RunSpec
from aflowrl.local.launcher import default_run, local_services, local_spec
from aflowrl.trainer import app
from aflowrl.trainer.acting import UniformActor
from aflowrl.trainer.clients import EnvironmentClient, LearnerClient, RolloutClient
from aflowrl.trainer.evaluate import evaluate_policy, policy_actor
from aflowrl.trainer.records import RunDirectory
from aflowrl.trainer.tasks import held_out_tasks


def _base() -> RunSpec:
    """The embedded default run's learning problem, without checkpoints."""
    doc = default_run().to_document()
    doc["trainer"].update({"checkpointEvery": 0, "finalTestEval": True})
    return RunSpec.from_document(doc)


METHODS = ("gigpo", "grpo", "random")


def _variant(base: RunSpec, method: str, seed: int, args: argparse.Namespace) -> RunSpec:
    doc = base.to_document()
    doc["trainer"].update({"seed": seed, "iterations": args.iterations})
    if method == "grpo":
        doc["learner"]["algorithm"] = {
            "type": "grpo",
            "gamma": doc["learner"]["algorithm"]["gamma"],
        }
    return RunSpec.from_document(doc)


def _mean_se(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return mean, se


EVAL_EPISODES = 4
"""Evaluation episodes per held-out task."""


Result = tuple[float, float, float, float]
"""(final episode return, last training iterations' return, best validation score, its test
score) of one run."""


async def _bench(args: argparse.Namespace, root: Path) -> dict[str, list[Result]]:
    base = local_spec(_base(), root)
    results: dict[str, list[Result]] = {m: [] for m in args.methods}
    async with local_services(base, root) as (targets, _group):
        learner = LearnerClient(targets.learner)
        rollout = RolloutClient(targets.rollout)
        env = EnvironmentClient(targets.env)
        initial = root / "initial-policy"
        await learner.save(str(initial), b"")
        for method in args.methods:
            for seed in args.seeds:
                spec = _variant(base, method, seed, args)
                top = max((await rollout.versions()).values())
                await learner.load(str(initial), min_policy_version=top + 1)
                run_dir = root / f"{method}-{seed}"
                services = app.connect(
                    spec, env=targets.env, rollout=targets.rollout, learner=targets.learner
                )
                started = time.perf_counter()
                random_policy = method == "random"
                result = await app.train(
                    spec,
                    services,
                    run_dir,
                    actor=UniformActor("choice") if random_policy else None,
                    train_policy=not random_policy,
                )
                records = RunDirectory(run_dir).read_metrics()
                last = statistics.fmean(r["charts/episode_return"] for r in records[-args.last :])
                # The final comparison's first row: the best workflow on the validation split.
                chosen = result.final_rows[0]
                best = chosen.validation_score if chosen.validation_score is not None else math.nan
                # The final policy (or the random one) on held-out tasks, nothing trained.
                tasks = held_out_tasks(
                    base.environment.training_benchmarks, args.eval_tasks, seed=seed
                )
                actor = UniformActor("choice") if random_policy else policy_actor(spec, rollout)
                played = await evaluate_policy(
                    spec, env, actor, tasks, episodes_per_task=EVAL_EPISODES, seed=seed
                )
                final = statistics.fmean(e.episode_return for e in played)
                results[method].append((final, last, best, chosen.test_mean))
                print(
                    f"{method:>7} seed {seed}: final return {final:+.4f} (training, last "
                    f"{args.last}: {last:+.4f}), best validation {best:.3f} ({chosen.name}), "
                    f"test {chosen.test_mean:.3f} ({time.perf_counter() - started:.0f} s)",
                    flush=True,
                )
        await learner.close()
        await rollout.close()
        await env.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=default_run().trainer.iterations)
    parser.add_argument("--last", type=int, default=4, help="iterations averaged at the end")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--keep", metavar="DIR", help="keep every run's directory under DIR")
    parser.add_argument(
        "--eval-tasks", type=int, default=16, help="evaluation tasks (4 episodes each)"
    )
    args = parser.parse_args()
    if args.keep:
        results = asyncio.run(_bench(args, Path(args.keep)))
    else:
        with tempfile.TemporaryDirectory(prefix="aflowrl-learning-") as tmp:
            results = asyncio.run(_bench(args, Path(tmp)))
    header = ("final episode return", "training return", "best validation", "its test score")
    print(f"\n{'method':<8}" + "".join(f"{h:>22}" for h in header))
    summary = {}
    for method in args.methods:
        final, last, best, test = (_mean_se([run[k] for run in results[method]]) for k in range(4))
        summary[method] = final
        print(
            f"{method:<8}{final[0]:>+13.4f} ± {final[1]:.4f}{last[0]:>+13.4f} ± {last[1]:.4f}"
            f"{best[0]:>14.3f} ± {best[1]:.3f}{test[0]:>14.3f} ± {test[1]:.3f}"
        )
    if not {"gigpo", "random"} <= summary.keys():
        return
    (g_mean, g_se), (r_mean, r_se) = summary["gigpo"], summary["random"]
    margin = (g_mean - r_mean) / math.sqrt(g_se**2 + r_se**2)
    verdict = "beats" if margin > 2 else "does NOT beat"
    print(f"\nGiGPO {verdict} random by more than two standard errors: margin {margin:.1f} SE")


if __name__ == "__main__":
    main()
