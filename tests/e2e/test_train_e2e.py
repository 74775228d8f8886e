"""End to end: a short training through real gRPC services on this machine, and its faults.

Every service is a real process (two environment replicas with the surrogate executor and the
sandbox, an hf rollout, a learner), started by the local launcher as ``aflowrl train`` starts
them. Checked:

- a short training writes every artifact, changes the policy's weights, and the rollout acts
  with each new version;
- an environment replica killed mid-iteration: the run completes, its steps served by the other;
- ``aflowrl train`` stopped (SIGTERM) or killed (SIGKILL) after a checkpoint and started again:
  it resumes, and ``metrics.jsonl`` holds every iteration exactly once; no service is left behind
  either time;
- Ctrl-C while the services start: the run stops, nothing left behind.

Bad inputs (unknown benchmark, missing data, unreachable executor, a spec error) are refused
before any work starts: tests/unit/local/test_train_cli.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from aflowrl._proto.v1 import rollout_pb2
from aflowrl.config import RunSpec
from aflowrl.local.launcher import local_services, local_spec
from aflowrl.search import encoding
from aflowrl.trainer import app
from aflowrl.trainer.acting import action_log_probs, prompt_of
from aflowrl.trainer.clients import RolloutClient
from aflowrl.trainer.tasks import is_held_out_seed

pytestmark = pytest.mark.slow

SPEC = """
policy: {dtype: float32}
learner:
  fsdp: {mixedPrecision: none}
  optimizer: {lr: 0.01}
  loss: {miniBatchSize: 8, microBatchSize: 8, klCoef: 0.01}
environment:
  evaluation: {maxProblems: 4, repeats: 1, pools: {heldOutSplit: test}}
  search: {maxSteps: 2, maxAdmissibleActions: 6, maxObservationChars: 1500}
trainer: {iterations: 3, tasksPerIteration: 2, groupSize: 2, checkpointEvery: 1}
"""
"""A few small iterations: 2 tasks x 2 episodes x 2 steps, four problems per evaluation; the
held-out comparison at the end on chunks of the test split, as the embedded default's."""


def _spec(run_dir: Path, **trainer) -> RunSpec:
    doc = RunSpec.from_yaml(SPEC).to_document()
    doc["trainer"].update(trainer)
    return local_spec(RunSpec.from_document(doc), run_dir)


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _leftovers(run_dir: Path) -> list[str]:
    """Command lines of live processes serving this run (their -f file is in the run dir)."""
    marker = str(run_dir.resolve())
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().split()[2]
        except (FileNotFoundError, ProcessLookupError, IndexError, PermissionError):
            continue
        if marker in cmdline and "serve" in cmdline and state != "Z":
            found.append(f"{proc.name}: {cmdline}")
    return found


def _wait_no_leftovers(run_dir: Path, timeout: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while (left := _leftovers(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


async def _choice_scores(rollout: str, text: str) -> list[float]:
    client = RolloutClient([rollout])
    actions = [
        "add ScEnsemble after generate samples=5",
        "remove generate",
        "set generate samples=3",
    ]
    item = rollout_pb2.CandidateSet(
        prompt=prompt_of(text), candidates=encoding.action_replies(actions)
    )
    [(scores, _)] = await client.score([item])
    await client.close()
    return action_log_probs(scores, len(actions)).tolist()


async def test_a_short_training_through_real_services(tmp_path):
    spec = _spec(tmp_path)
    probe = "## Task\nBenchmark: HumanEval.\n## Current workflow (score 0.500)\nnode generate"
    async with local_services(spec, tmp_path) as (targets, _group):
        before = await _choice_scores(targets.rollout[0], probe)
        services = app.connect(
            spec, env=targets.env, rollout=targets.rollout, learner=targets.learner
        )
        result = await app.train(spec, services, tmp_path)
        after = await _choice_scores(targets.rollout[0], probe)
        client = RolloutClient(targets.rollout)
        serving = (await client.versions())[targets.rollout[0]]
        await client.close()
    assert _wait_no_leftovers(tmp_path) == []
    records = _records(tmp_path)
    assert [r["iteration"] for r in records] == [0, 1, 2]
    for record in records:
        assert record["charts/episodes"] == 4 and record["charts/steps"] == 8
        assert record["charts/rows_trained"] > 0 and np.isfinite(record["losses/policy"])
    # The weights changed, and each iteration acted with the version the previous one pushed.
    assert serving == records[-1]["policy_version"] == 3
    assert not np.allclose(before, after, atol=1e-6)
    for previous, record in itertools.pairwise(records):
        assert record["rollout/version_min"] == previous["policy_version"]
        assert record["rollout/version_max"] == previous["policy_version"]
    # The artifacts.
    assert (tmp_path / "spec.yaml").is_file()
    assert (tmp_path / "curves.png").read_bytes().startswith(b"\x89PNG")
    index = json.loads((tmp_path / "best" / "index.json").read_text())
    assert index and index[0]["validation_score"] == result.state.best_score
    first = tmp_path / index[0]["dir"]
    for name in ("workflow.json", "graph.py", "prompt.py", "workflow.png"):
        assert (first / name).is_file(), name
    final = json.loads((tmp_path / "final.json").read_text())
    names = [row["name"] for row in final]
    assert "seed" in names and {"io", "cot", "cot_sc", "medprompt", "self_refine"} <= set(names)
    assert all(0.0 <= row["test_mean"] <= 1.0 and row["num_problems"] > 0 for row in final)
    summary = (tmp_path / "final.md").read_text()
    assert "test score" in summary
    # the summary's sentences: the best workflow against the baselines, the policy's lead
    assert "In short: " in summary and "the policy it started from" in summary
    # Both policies played the same held-out tasks: consecutive seeds (disjoint test chunks).
    started = json.loads((tmp_path / "start_held_out.json").read_text())
    seeds = [episode["seed"] for episode in started]
    assert seeds == list(range(seeds[0], seeds[0] + 4)) and is_held_out_seed(seeds[0])
    assert [e.seed for e in result.held_out] == seeds
    for log in ("env-0", "env-1", "rollout-0", "learner"):
        assert (tmp_path / "logs" / f"{log}.log").is_file()
    # The default experiment trackers: TensorBoard's events, and each iteration's search tree.
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    trees = [json.loads(line) for line in (tmp_path / "trees.jsonl").read_text().splitlines()]
    assert [t["iteration"] for t in trees] == [0, 1, 2]


async def test_an_environment_replica_killed_mid_iteration(tmp_path):
    """Mid-iteration, deterministically: the second iteration's first Step kills env-0 and
    every Step of that iteration waits until it is dead, so each call routed to env-0 (about
    half of them: Project by episode, Step by child hash, over two replicas) fails over."""
    spec = _spec(tmp_path, iterations=2, checkpointEvery=0, finalTestEval=False)

    async with local_services(spec, tmp_path) as (targets, group):
        victim = next(c for c in group.children if c.name == "env-0")
        services = app.connect(
            spec, env=targets.env, rollout=targets.rollout, learner=targets.learner
        )
        step = services.env.step
        dead = asyncio.Event()
        killing: list[asyncio.Task[None]] = []

        async def kill() -> None:
            victim.signal_group(signal.SIGKILL)
            await asyncio.to_thread(victim.process.wait)
            dead.set()

        async def step_after_the_kill(*args, **kwargs):
            if kwargs["episode_key"].startswith("it1-"):
                if not killing:
                    killing.append(asyncio.create_task(kill()))
                await dead.wait()
            return await step(*args, **kwargs)

        services.env.step = step_after_the_kill  # type: ignore[method-assign]
        result = await app.train(spec, services, tmp_path)
    records = _records(tmp_path)
    assert [r["iteration"] for r in records] == [0, 1] and result.state.iteration == 2
    assert records[0]["env/failovers"] == 0 and records[0]["env/replicas_live"] == 2
    assert records[1]["env/failovers"] >= 1 and records[1]["env/replicas_live"] == 1
    assert all(r["charts/steps"] == 8 for r in records)  # every step was served
    assert _wait_no_leftovers(tmp_path) == []


_FROM_A_TERMINAL = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)
"""Runs the rest of its command line with Ctrl-C's default disposition, as a shell gives a
foreground command: under a suite run in the background (`make test &`, a CI runner) SIGINT is
inherited ignored, and Python then installs no KeyboardInterrupt handler."""


def _train_cli(run_dir: Path, spec_file: Path) -> subprocess.Popen[bytes]:
    train = ["-m", "aflowrl", "train", "-f", str(spec_file), "--run-dir", str(run_dir)]
    return subprocess.Popen(
        [sys.executable, "-c", _FROM_A_TERMINAL, *train],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_stopped_trainer_resumes_and_records_every_iteration_once(tmp_path, stop):
    run_dir = tmp_path / "run"
    spec_file = tmp_path / "run.yaml"
    doc = RunSpec.from_yaml(SPEC).to_document()
    # The first run cannot finish before the signal, however fast the machine (1000
    # iterations); the resumed run then goes two iterations past what the first recorded.
    doc["trainer"].update({"iterations": 1000, "checkpointEvery": 1, "finalTestEval": False})
    spec_file.write_text(json.dumps(doc))
    first = _train_cli(run_dir, spec_file)
    try:
        index = run_dir / "checkpoints.json"
        deadline = time.monotonic() + 600
        while not (index.is_file() and json.loads(index.read_text())["checkpoints"]):
            assert first.poll() is None, first.communicate()[0].decode()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 10 minutes"
            time.sleep(0.1)
        # SIGTERM stops it cleanly; SIGKILL gives it no chance (its services die with it).
        first.send_signal(stop)
        output = first.communicate(timeout=120)[0].decode()
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == (143 if stop == signal.SIGTERM else -signal.SIGKILL), output[-3000:]
    assert _wait_no_leftovers(run_dir) == [], f"services left behind after {stop.name}"
    done_before = len(_records(run_dir))
    assert done_before >= 1
    doc["trainer"]["iterations"] = done_before + 2
    spec_file.write_text(json.dumps(doc))
    second = _train_cli(run_dir, spec_file)
    output = second.communicate(timeout=900)[0].decode()
    assert second.returncode == 0, output[-3000:]
    assert [r["iteration"] for r in _records(run_dir)] == list(range(done_before + 2))
    assert "resumed from" in (run_dir / "logs" / "trainer.log").read_text()
    assert _wait_no_leftovers(run_dir) == []
    # TensorBoard (a default logger) shows every iteration once too: the resumed run's steps
    # replace what the stopped one logged after its checkpoint.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    steps = [s.step for s in events.Scalars("charts/episode_return")]
    assert steps == list(range(done_before + 2))


def test_ctrl_c_while_starting_leaves_nothing_behind(tmp_path):
    run_dir = tmp_path / "run"
    spec_file = tmp_path / "run.yaml"
    doc = RunSpec.from_yaml(SPEC).to_document()
    doc["trainer"]["iterations"] = 1000  # the run cannot end before the Ctrl-C, however fast
    spec_file.write_text(json.dumps(doc))
    process = _train_cli(run_dir, spec_file)
    try:
        deadline = time.monotonic() + 120
        while len(_leftovers(run_dir)) < 4:  # every service has started
            assert process.poll() is None, process.communicate()[0].decode()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=120)[0].decode()
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, output[-3000:]
    assert "interrupted" in output
    assert _wait_no_leftovers(run_dir) == []
