"""One environment replica serving several benchmarks, over real gRPC, with the surrogate executor.

Replicas run in this process (``running_server``) on AFlow's real split files: ``multi`` serves
GSM8K and MATH (training) and DROP (held out); ``gsm8k`` serves GSM8K alone. Checked: Info lists
every served benchmark; Reset, Step, Project and Evaluate dispatch on the task's benchmark; an
episode moves between a replica of its benchmark and one serving several with byte-identical
results; an unserved or unknown benchmark is INVALID_ARGUMENT naming the field; and a
workflow's scores on a benchmark are the same whatever else the replica serves (the surrogate
indexes every served benchmark's problems), here and for all six benchmarks at the executor.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from aflowrl._proto.v1 import environment_pb2 as pb
from aflowrl._proto.v1 import environment_pb2_grpc as pbg
from aflowrl.benchmarks import BENCHMARK_NAMES, get_benchmark
from aflowrl.common.client import ChannelOptions, make_channel
from aflowrl.config import RunSpec
from aflowrl.envsvc.server import running_server
from aflowrl.executor.surrogate.executor import SurrogateExecutor, load_problems
from aflowrl.workflow import Evaluator, library


def _doc(data: Path, benchmarks: list[str], held_out: list[str] | None = None) -> dict[str, Any]:
    return {
        "environment": {
            "benchmarks": benchmarks,
            "heldOutBenchmarks": held_out or [],
            "data": {"dir": str(data)},
            "evaluation": {"maxProblems": 6, "repeats": 1},
            "search": {"maxSteps": 4, "selection": "ucb", "valueSource": "none"},
        }
    }


@asynccontextmanager
async def _replica(doc: dict[str, Any]) -> AsyncIterator[pbg.EnvironmentServiceStub]:
    spec = RunSpec.model_validate(doc)
    async with running_server(spec, host="127.0.0.1", port=0, metrics_port=None) as server:
        channel = make_channel(
            f"127.0.0.1:{server.port}", ChannelOptions(max_attempts=1, timeout_s=120)
        )
        try:
            yield pbg.EnvironmentServiceStub(channel)
        finally:
            await channel.close()


@asynccontextmanager
async def _replicas(data: Path) -> AsyncIterator[tuple[Any, Any]]:
    async with (
        _replica(_doc(data, ["gsm8k", "math"], ["drop"])) as multi,
        _replica(_doc(data, ["gsm8k"])) as single,
    ):
        yield multi, single


async def _refused(call: Any) -> str:
    with pytest.raises(aio.AioRpcError) as caught:
        await call
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    return str(caught.value.details())


async def _play(stubs: list[Any], task: str, seed: int, actions: list[int]) -> list[Any]:
    """Reset on the first stub, then step, stub i serving step i (round robin)."""
    reply = await stubs[0].Reset(pb.ResetRequest(task=task, seed=seed, episode_id="moving"))
    trace: list[Any] = [(reply.state, reply.observation.text, reply.seed_score)]
    state = reply.state
    for i, k in enumerate(actions):
        stub = stubs[(i + 1) % len(stubs)]
        projected = await stub.Project(
            pb.ProjectRequest(state=state, action=f"<action>{k}</action>")
        )
        step = await stub.Step(pb.StepRequest(state=state, action=f"<action>{k}</action>"))
        assert step.info.valid_action and projected.child_hash == step.info.child_hash
        trace.append((step.state, step.observation.text, step.reward, step.info.child_score))
        state = step.state
        if step.done:
            break
    return trace


async def test_one_replica_serves_every_configured_benchmark(aflow_data):
    async with _replicas(aflow_data) as (multi, single):
        info = await multi.Info(pb.EnvInfoRequest())
        assert list(info.tasks) == ["gsm8k", "math", "drop"]
        assert list((await single.Info(pb.EnvInfoRequest())).tasks) == ["gsm8k"]
        for task, task_type in (("gsm8k", "math"), ("math", "math"), ("drop", "qa")):
            reply = await multi.Reset(pb.ResetRequest(task=task, seed=3))
            # The observation names the benchmark and its task type in its header.
            header = reply.observation.text.splitlines()[0]
            assert header == f"# Optimising an agentic workflow for {task} ({task_type} tasks)"
            assert reply.observation.anchor == library.load("seed", task_type).content_hash
            assert reply.seed_eval.num_problems == 6
            step = await multi.Step(pb.StepRequest(state=reply.state, action="<action>1</action>"))
            assert step.info.valid_action


async def test_an_episode_moves_between_replicas_serving_its_benchmark(aflow_data):
    async with _replicas(aflow_data) as (multi, single):
        alone = await _play([single], "gsm8k", 21, [2, 1, 3])
        moving = await _play([single, multi], "gsm8k", 21, [2, 1, 3])
        assert moving == alone  # byte-identical blobs, observations, rewards and scores
        started_on_multi = await _play([multi, single], "gsm8k", 21, [2, 1, 3])
        assert started_on_multi == alone


async def test_unserved_and_unknown_benchmarks_are_refused_naming_the_field(aflow_data):
    async with _replicas(aflow_data) as (multi, single):
        details = await _refused(multi.Reset(pb.ResetRequest(task="humaneval", seed=1)))
        assert details.startswith(
            "reset.task: this replica serves gsm8k, math, drop, not humaneval"
        )
        assert "is no benchmark" in await _refused(multi.Reset(pb.ResetRequest(task="chess")))
        assert "reset.task: empty is no benchmark" in await _refused(
            multi.Reset(pb.ResetRequest(seed=1))
        )
        cot = library.load("cot", "math").to_json()
        details = await _refused(
            multi.Evaluate(pb.EvaluateRequest(workflow_json=cot, benchmark="mbpp", split="test"))
        )
        assert details.startswith("evaluate.benchmark: this replica serves")
        details = await _refused(
            multi.Evaluate(pb.EvaluateRequest(workflow_json=cot, benchmark="drop", split="test"))
        )
        assert "evaluate.workflow_json: the workflow is for math tasks; drop is a qa" in details
        # An episode of a benchmark the replica does not serve.
        on_math = await multi.Reset(pb.ResetRequest(task="math", seed=5))
        action = "<action>1</action>"
        details = await _refused(single.Step(pb.StepRequest(state=on_math.state, action=action)))
        assert details.startswith("step.state.benchmark: the episode is on math; this replica")
        details = await _refused(
            single.Project(pb.ProjectRequest(state=on_math.state, action=action))
        )
        assert details.startswith("project.state.benchmark: the episode is on math")


async def test_scores_do_not_depend_on_what_else_a_replica_serves(aflow_data):
    async with _replicas(aflow_data) as (multi, single):
        for name in ("cot_sc", "self_refine", "medprompt"):
            graph = library.load(name, "math").to_json()
            request = pb.EvaluateRequest(
                workflow_json=graph, benchmark="gsm8k", split="validate", repeats=2, seed=4
            )
            alone, shared = await single.Evaluate(request), await multi.Evaluate(request)
            assert [list(p.scores) for p in shared.problems] == [
                list(p.scores) for p in alone.problems
            ]
            assert shared.workflow_hash == alone.workflow_hash
            assert shared.summary.num_problems == alone.summary.num_problems > 100


@pytest.mark.parametrize("benchmark", BENCHMARK_NAMES)
async def test_the_surrogate_answers_alike_with_one_benchmark_or_all_six_indexed(
    aflow_data, benchmark
):
    everything = SurrogateExecutor(load_problems(aflow_data))
    own = SurrogateExecutor(load_problems(aflow_data, [benchmark]))
    bench = get_benchmark(benchmark)
    problems = bench.load("validate", aflow_data)[:15]
    for name in ("cot_sc", "self_refine"):
        graph = library.load(name, bench.task_type)
        alone = await Evaluator(own, bench).evaluate(graph, problems, repeats=1)
        shared = await Evaluator(everything, bench).evaluate(graph, problems, repeats=1)
        assert [s.answer for s in shared.samples] == [s.answer for s in alone.samples]
        assert [s.score for s in shared.samples] == [s.score for s in alone.samples]
