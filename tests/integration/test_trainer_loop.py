"""The trainer's loop over the real rollout and learner services and a toy environment.

The environment here is a test double (toy_env.py) so these tests are fast and deterministic;
tests/e2e/ runs the same loop against the real environment service. Checked: rows reach the
learner and change the policy, new weights reach the rollout, the run directory, checkpoints
and an exact resume, failover when an environment replica stops, off-policy overlap.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from policy_services import learner_and_rollout, start_service
from toy_env import ACTIONS, ToyEnv, serve_toy

from aflowrl._proto.v1 import rollout_pb2
from aflowrl.config import RunSpec
from aflowrl.search import encoding
from aflowrl.trainer import app
from aflowrl.trainer.acting import action_log_probs, prompt_of

SERVICES_SPEC = """
policy: {dtype: float32, value: {enabled: false}}
learner:
  fsdp: {mixedPrecision: none}
  loss: {miniBatchSize: 8, microBatchSize: 8, klCoef: 0.01}
  optimizer: {lr: 0.005}
environment: {search: {maxSteps: 2, selection: ucb, valueSource: none}}
trainer: {tasksPerIteration: 2, groupSize: 2}
"""
"""The policy gradient alone (no value replies): on the 2-layer built-in model, three steps of
the value's cross-entropy move the shared output layer more than the small advantages do, so
the direction of the action probabilities is checked without it (the value is tested in
test_policy_acting_path and the e2e runs)."""


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """One rollout and one learner process shared by the module's tests."""
    root = tmp_path_factory.mktemp("policy")
    spec_file = root / "spec.yaml"
    spec_file.write_text(SERVICES_SPEC)
    with learner_and_rollout(spec_file, root) as (learner, rollout):
        yield rollout, learner


def _spec(tmp_path, **trainer) -> RunSpec:
    doc = RunSpec.from_yaml(SERVICES_SPEC).to_document()
    doc["trainer"].update({"checkpointDir": str(tmp_path), "finalTestEval": True, **trainer})
    return RunSpec.from_document(doc)


async def _train(spec, policy, env_servers, run_dir, **kwargs):
    rollout, learner = policy
    targets = [f"127.0.0.1:{server.port}" for server, _ in env_servers]
    services = app.connect(spec, env=targets, rollout=[rollout.target], learner=learner.target)
    return await app.train(spec, services, run_dir, **kwargs)


async def _p_good(rollout_target: str) -> float:
    """P(action 1) under the rollout's current weights, on a fixed observation."""
    from aflowrl.trainer.clients import RolloutClient

    client = RolloutClient([rollout_target])
    # The observation of an episode's first step, as the toy replicas render it.
    first = {"step": 0, "max": 2, "score": 0.5, "anchor": "seed", "best": 0.5}
    observation = ToyEnv("probe")._observation(first).text
    item = rollout_pb2.CandidateSet(
        prompt=prompt_of(observation), candidates=encoding.action_replies(ACTIONS)
    )
    [(scores, _)] = await client.score([item])
    await client.close()
    return float(np.exp(action_log_probs(scores, len(ACTIONS)))[0])


async def test_the_loop_trains_pushes_records_and_checkpoints(policy, tmp_path):
    rollout, _ = policy
    servers = [await serve_toy("a"), await serve_toy("b")]
    spec = _spec(tmp_path, iterations=3, checkpointEvery=2)
    before = await _p_good(rollout.target)
    try:
        result = await _train(spec, policy, servers, tmp_path)
    finally:
        for server, _ in servers:
            await server.stop()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1, 2]
    first = records[0]
    assert first["charts/episodes"] == 4 and first["charts/steps"] == 8
    assert first["charts/rows_trained"] == 8 and first["charts/valid_action_ratio"] == 1.0
    assert math.isfinite(first["losses/policy"]) and first["losses/kl"] >= 0
    assert first["weights/replicas_failed"] == 0
    versions = [r["policy_version"] for r in records]
    assert versions == [versions[0], versions[0] + 1, versions[0] + 2]
    assert 0 < first["time/overhead_ratio"] < 1 and first["time/train"] > 0
    # Both replicas served steps: routed by child hash.
    assert all(env.steps > 0 for _, env in servers), ([env.steps for _, env in servers], records)
    checkpoints = json.loads((tmp_path / "checkpoints.json").read_text())["checkpoints"]
    assert [c["iteration"] for c in checkpoints] == [2, 3]
    assert (tmp_path / "checkpoints" / "iter-000003" / "complete.json").is_file()
    assert (tmp_path / "curves.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "spec.yaml").is_file() and (tmp_path / "final.md").is_file()
    assert [row.name for row in result.final_rows][:1] == ["seed"]  # best = the seed (no graphs)
    assert "cot_sc" in result.final_table
    # The rollout serves the learner's last version, and the policy moved towards action 1.
    from aflowrl.trainer.clients import RolloutClient

    client = RolloutClient([rollout.target])
    assert (await client.versions())[rollout.target] == versions[-1]
    await client.close()
    assert await _p_good(rollout.target) > before


async def test_a_resumed_run_records_every_iteration_once(policy, tmp_path):
    servers = [await serve_toy("a")]
    try:
        await _train(_spec(tmp_path, iterations=2, checkpointEvery=1), policy, servers, tmp_path)
        # The trainer stopped after its checkpoint at 2; as if it had crashed in iteration 3,
        # after writing a record that the checkpoint does not cover:
        with (tmp_path / "metrics.jsonl").open("a") as out:
            out.write(json.dumps({"iteration": 2, "charts/episode_return": 9.0}) + "\n")
        resumed = await _train(
            _spec(tmp_path, iterations=4, checkpointEvery=1, finalTestEval=False),
            policy,
            servers,
            tmp_path,
        )
    finally:
        for server, _ in servers:
            await server.stop()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1, 2, 3]
    assert records[2]["charts/episode_return"] != 9.0
    assert resumed.state.iteration == 4
    # The rollout had served the version saved at 2: the restored weights got a higher one.
    assert records[2]["policy_version"] > records[1]["policy_version"] + 1


async def test_a_resumed_run_sends_its_last_iteration_to_the_trackers_again(
    policy, tmp_path, monkeypatch
):
    """A stop after an iteration's checkpoint and before its tracker call (a SIGKILL there)
    would leave that iteration out of TensorBoard for good: the resumed run sends it again."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from aflowrl.trainer import tracking

    log = tracking.TensorBoardTracker.log

    def stopped_before_its_tracker_call(self, step, scalars):
        if step != 1:
            log(self, step, scalars)

    doc = _spec(tmp_path, iterations=2, checkpointEvery=1, finalTestEval=False).to_document()
    doc["monitoring"]["loggers"] = ["tensorboard"]
    servers = [await serve_toy("a")]
    try:
        with monkeypatch.context() as patch:
            patch.setattr(tracking.TensorBoardTracker, "log", stopped_before_its_tracker_call)
            await _train(RunSpec.from_document(doc), policy, servers, tmp_path)
        doc["trainer"]["iterations"] = 3
        await _train(RunSpec.from_document(doc), policy, servers, tmp_path)
    finally:
        for server, _ in servers:
            await server.stop()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1, 2]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = events.Scalars("charts/episode_return")
    assert [s.step for s in scalars] == [0, 1, 2]
    assert [s.value for s in scalars] == pytest.approx(
        [r["charts/episode_return"] for r in records], rel=1e-6
    )


async def test_a_stopped_environment_replica_fails_over(policy, tmp_path):
    # Replica a answers six calls and stops itself on its seventh: the point of failure is a
    # request count, so the failover happens however fast either side runs. (Resets and
    # Projects are routed by episode key: 16 episodes' worth over the ring of two replicas.)
    servers = [await serve_toy("a", stop_after_calls=6), await serve_toy("b")]
    spec = _spec(tmp_path, iterations=2, checkpointEvery=0, finalTestEval=False)
    try:
        result = await _train(spec, policy, servers, tmp_path)
    finally:
        stopping = servers[0][1].stopping
        if stopping is not None:
            await stopping
        await servers[0][0].stop()
        await servers[1][0].stop()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1] and result.state.iteration == 2
    assert servers[0][1].stopping is not None  # a got a seventh call, so it stopped
    assert sum(r["env/failovers"] for r in records) >= 1
    assert records[-1]["env/replicas_live"] == 1
    assert all(r["charts/steps"] == 8 for r in records)  # no step was lost


async def test_off_policy_overlap_corrects_stale_rows(policy, tmp_path):
    servers = [await serve_toy("a")]
    spec = _spec(
        tmp_path, iterations=3, checkpointEvery=0, finalTestEval=False, offPolicy={"enabled": True}
    )
    try:
        await _train(spec, policy, servers, tmp_path)
    finally:
        await servers[0][0].stop()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1, 2]
    later = records[1:]
    assert any(r["charts/staleness_mean"] > 0 for r in later)
    assert all(r["charts/rows_dropped_stale"] == 0 for r in records)
    stale = [r for r in later if r["charts/rows_recomputed"] > 0]
    assert stale and all(0 < r["charts/is_weight_mean"] <= 2.0 for r in stale)


@pytest.mark.parametrize("algorithm", [{"type": "grpo"}, {"type": "grpo", "leaveOneOut": True}])
async def test_grpo_and_rloo_train_on_the_same_services(policy, tmp_path, algorithm):
    doc = _spec(tmp_path, iterations=1, finalTestEval=False).to_document()
    doc["learner"]["algorithm"] = algorithm
    servers = [await serve_toy("a")]
    try:
        await _train(RunSpec.from_document(doc), policy, servers, tmp_path)
    finally:
        await servers[0][0].stop()
    [record] = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert record["charts/rows_trained"] == 8 and math.isfinite(record["losses/policy"])


async def test_ppo_trains_the_critic_on_gae_returns(tmp_path):
    spec_file = tmp_path / "spec.yaml"
    doc = RunSpec.from_yaml(SERVICES_SPEC).to_document()
    doc["learner"]["algorithm"] = {"type": "ppo", "gamma": 0.9, "lam": 0.9}
    spec_file.write_text(json.dumps(doc))
    learner = start_service("learner", spec_file, tmp_path)
    rollout = start_service("rollout", spec_file, tmp_path)
    servers = [await serve_toy("a")]
    try:
        doc["trainer"].update(
            {"iterations": 2, "checkpointDir": str(tmp_path), "finalTestEval": False}
        )
        await _train(RunSpec.from_document(doc), (rollout, learner), servers, tmp_path / "run")
    finally:
        await servers[0][0].stop()
        assert rollout.stop() == 0 and learner.stop() == 0
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["iteration"] for r in records] == [0, 1]
    assert all(math.isfinite(r["losses/value"]) and r["losses/value"] > 0 for r in records)
    assert all(r["time/logprob"] > 0 for r in records)  # the critic's values were asked for


async def test_the_same_seed_and_weights_give_the_same_run(policy, tmp_path):
    """Seeded and reproducible on CPU: two runs from the same weights record the same numbers."""
    from aflowrl.trainer.clients import LearnerClient, RolloutClient

    rollout, learner = policy
    learner_client = LearnerClient(learner.target)
    rollout_client = RolloutClient([rollout.target])
    await learner_client.save(str(tmp_path / "start"), b"")
    runs = []
    for attempt in ("first", "second"):
        top = max((await rollout_client.versions()).values())
        await learner_client.load(str(tmp_path / "start"), min_policy_version=top + 1)
        servers = [await serve_toy("a")]
        try:
            spec = _spec(tmp_path / attempt, iterations=2, checkpointEvery=0, finalTestEval=False)
            await _train(spec, policy, servers, tmp_path / attempt)
        finally:
            await servers[0][0].stop()
        lines = (tmp_path / attempt / "metrics.jsonl").read_text().splitlines()
        runs.append([json.loads(line) for line in lines])
    await learner_client.close()
    await rollout_client.close()
    keys = ("charts/episode_return", "charts/advantage_mean", "losses/policy", "losses/kl")
    for first, second in zip(*runs, strict=True):
        assert [first[k] for k in keys] == [second[k] for k in keys]


async def test_fused_selection_gets_the_trainers_values_from_the_real_environment(policy, tmp_path):
    """The real environment service (in this process; surrogate executor, HumanEval) refuses
    fused selection without V(s): the trainer sends its anchor Monte-Carlo table."""
    from aflowrl.envsvc.server import running_server
    from aflowrl.trainer.state import CheckpointIndex, TrainerState

    doc = _spec(tmp_path, iterations=2, checkpointEvery=2, finalTestEval=False).to_document()
    doc["environment"]["evaluation"] = {"maxProblems": 3, "repeats": 1}
    doc["environment"]["search"].update(
        {
            "selection": "fused",
            "valueSource": "anchor-mc",
            "maxAdmissibleActions": 6,
            "maxObservationChars": 1500,
        }
    )
    spec = RunSpec.from_document(doc)
    rollout, learner = policy
    async with running_server(spec, host="127.0.0.1", port=0, metrics_port=None) as env:
        services = app.connect(
            spec, env=[f"127.0.0.1:{env.port}"], rollout=[rollout.target], learner=learner.target
        )
        result = await app.train(spec, services, tmp_path)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1] and result.state.iteration == 2
    assert all(r["charts/valid_action_ratio"] == 1.0 for r in records)
    [entry] = CheckpointIndex(tmp_path).entries()
    saved = TrainerState.from_bytes((Path(entry.path) / "client_state.bin").read_bytes(), source="")
    assert saved.values is not None and saved.values["returns"]["anchors"]
    # The best workflows came back as JSON from the environment's steps.
    index = json.loads((tmp_path / "best" / "index.json").read_text())
    assert index and all("workflow.json" in entry["files"] for entry in index)


def _wandb_history(run_file: Path) -> list[dict[str, float]]:
    """The history rows of an offline W&B run, read from its transaction log (``run-*.wandb``:
    LevelDB's log format, 32 KiB blocks of chunks with a 7-byte header, after a 7-byte file
    header; each record a ``wandb_internal_pb2.Record``)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    block, header = 32768, 7
    offset, pending, rows = 7, b"", []
    while offset + header <= len(data):
        left = block - offset % block
        if left < header:
            offset += left
            continue
        _, length, kind = struct.unpack("<IHB", data[offset : offset + header])
        if length == 0 and kind == 0:  # the rest of the block is padding
            offset += left
            continue
        pending += data[offset + header : offset + header + length]
        offset += header + length
        if kind in (1, 4):  # a FULL chunk, or the LAST of a record's chunks
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append(
                    {
                        item.key or "/".join(item.nested_key): json.loads(item.value_json)
                        for item in record.history.item
                    }
                )
    return rows


async def test_a_run_logs_its_scalars_to_tensorboard_wandb_offline_and_mlflow(
    policy, tmp_path, monkeypatch
):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    home = tmp_path / "home"  # W&B's own settings and caches: never the user's
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(home / name.lower()))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "unset")  # restored to what it was after
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")  # the mlflow logger sets it itself
    run_dir = tmp_path / "run"
    doc = _spec(run_dir, iterations=2, checkpointEvery=0, finalTestEval=False).to_document()
    doc["monitoring"]["loggers"] = ["console", "tensorboard", "wandb", "mlflow"]
    doc["monitoring"]["wandb"] = {"mode": "offline", "project": "aflowrl-tests"}
    doc["monitoring"]["mlflow"] = {"experiment": "tests", "runName": "loop"}
    servers = [await serve_toy("a")]
    try:
        await _train(RunSpec.from_document(doc), policy, servers, run_dir)
    finally:
        await servers[0][0].stop()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    headline = ("charts/episode_return", "charts/best_score", "losses/kl", "charts/clipfrac")

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    for key in headline:
        scalars = events.Scalars(key)
        assert [s.step for s in scalars] == [0, 1], key
        assert [s.value for s in scalars] == pytest.approx([r[key] for r in records], rel=1e-6)

    [offline] = (run_dir / "wandb").glob("offline-run-*")
    [run_file] = offline.glob("run-*.wandb")
    history = _wandb_history(run_file)
    assert [row["_step"] for row in history] == [0, 1]
    for key in headline:
        assert [row[key] for row in history] == pytest.approx([r[key] for r in records])

    client = MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("tests")
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "loop" and run.info.status == "FINISHED"
    for key in headline:
        history = client.get_metric_history(run.info.run_id, key)
        assert [m.step for m in history] == [0, 1]
        assert [m.value for m in history] == pytest.approx([r[key] for r in records])

    # The search tree of each iteration's best episode, for `aflowrl plot --tree`.
    recorded = [json.loads(line) for line in (run_dir / "trees.jsonl").read_text().splitlines()]
    assert [t["iteration"] for t in recorded] == [0, 1]
    for tree in recorded:
        assert tree["root"] in tree["nodes"] and len(tree["edges"]) == 2  # maxSteps
        assert all(e["parent"] in tree["nodes"] for e in tree["edges"])
