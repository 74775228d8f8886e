"""Setup pieces of the environment service: spec checks, the executor factory and probe, the
failure metrics, the caller's values and the cache hit ratio."""

from __future__ import annotations

import importlib.util
import math

import pytest
from aiohttp import web
from pydantic import ValidationError

from aflowrl.config import RunSpec
from aflowrl.config.environment import OpenAIExecutorSpec
from aflowrl.envsvc import executors, server
from aflowrl.envsvc.environment import MAX_VALUE_ANCHORS, state_values
from aflowrl.envsvc.errors import BadRequestError, ExecutorUnreachableError
from aflowrl.envsvc.metrics import EnvironmentMetrics
from aflowrl.errors import InvalidInputError
from aflowrl.executor.base import Message
from aflowrl.executor.errors import ExecutorRateLimitedError, ExecutorUnavailableError

HASH = "ab" * 32


def _spec(**environment: object) -> RunSpec:
    return RunSpec.model_validate({"environment": environment})


def test_check_spec_names_the_data_directory_problem(monkeypatch, tmp_path):
    monkeypatch.delenv("AFLOWRL_DATA_DIR", raising=False)
    openai = {"type": "openai", "baseUrl": "http://127.0.0.1:9/v1"}
    with pytest.raises(InvalidInputError, match="gsm8k needs a data directory") as caught:
        server.check_spec(_spec(benchmarks=["gsm8k"], executor=openai))
    assert caught.value.field == "environment.data.dir"
    missing = tmp_path / "nowhere"
    with pytest.raises(InvalidInputError, match="does not exist") as caught:
        server.check_spec(_spec(benchmarks=["gsm8k"], data={"dir": str(missing)}, executor=openai))
    assert caught.value.field == "environment.data.dir"
    monkeypatch.setenv("AFLOWRL_DATA_DIR", str(tmp_path))
    server.check_spec(_spec(benchmarks=["gsm8k"], executor=openai))  # the variable will do
    server.check_spec(_spec(benchmarks=["humaneval"], executor=openai))  # packaged data


def test_check_spec_names_every_served_benchmark_without_data(monkeypatch):
    monkeypatch.delenv("AFLOWRL_DATA_DIR", raising=False)
    openai = {"type": "openai", "baseUrl": "http://127.0.0.1:9/v1"}
    spec = _spec(benchmarks=["humaneval", "math"], heldOutBenchmarks=["drop"], executor=openai)
    with pytest.raises(InvalidInputError, match="math, drop needs a data directory") as caught:
        server.check_spec(spec)
    assert caught.value.field == "environment.data.dir"


def test_an_openai_executor_needs_an_endpoint(monkeypatch):
    monkeypatch.delenv("AFLOWRL_EXECUTOR_BASE_URL", raising=False)
    served = {"type": "openai", "serve": {"model": "/models/qwen"}}
    with pytest.raises(InvalidInputError, match="no endpoint") as caught:
        server.check_spec(_spec(benchmarks=["humaneval"], executor=served))
    assert caught.value.field == "environment.executor.baseUrl"
    monkeypatch.setenv("AFLOWRL_EXECUTOR_BASE_URL", "http://executor:8000/v1")
    server.check_spec(_spec(benchmarks=["humaneval"], executor=served))
    built = executors.build_executor(_spec(executor=served).environment, [], None)
    assert built.executor_id.startswith("openai:gpt-4o-mini@http://executor:8000/v1")


def test_the_surrogate_is_used_when_installed():
    spec = _spec(benchmarks=["humaneval"])
    assert spec.environment.executor.type == "surrogate"  # the default
    if importlib.util.find_spec(executors.SURROGATE_MODULE) is None:
        with pytest.raises(InvalidInputError, match="not in this installation") as caught:
            server.check_spec(spec)
        assert caught.value.field == "environment.executor.type"
    else:
        server.check_spec(spec)
        built = executors.build_executor(spec.environment, [], None)
        assert built.executor_id.startswith("surrogate:")


async def _answering(status: int) -> web.AppRunner:
    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"data": []}, status=status)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


@pytest.mark.parametrize(("status", "error"), [(200, None), (404, None), (401, "refused the API")])
async def test_the_probe_accepts_any_answer_but_a_refused_key(status, error):
    runner = await _answering(status)
    port = runner.addresses[0][1]
    spec = OpenAIExecutorSpec(baseUrl=f"http://127.0.0.1:{port}/v1")
    try:
        if error is None:
            await executors.probe_openai(spec, wait_s=2.0)
        else:
            with pytest.raises(ExecutorUnreachableError, match=error):
                await executors.probe_openai(spec, wait_s=2.0)
    finally:
        await runner.cleanup()


async def test_the_probe_gives_up_on_an_endpoint_that_never_answers():
    spec = OpenAIExecutorSpec(baseUrl="http://127.0.0.1:9/v1")  # discard port: refused
    with pytest.raises(ExecutorUnreachableError, match=r"did not answer within 0\.6 s"):
        await executors.probe_openai(spec, wait_s=0.6)


class _Failing:
    executor_id = "failing"

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def chat(self, messages, **_options):
        raise self.error

    async def aclose(self) -> None:
        return None


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (ExecutorUnavailableError("down"), "unavailable"),
        (ExecutorRateLimitedError("slow down"), "rate_limited"),
    ],
)
async def test_failed_executor_calls_are_counted_by_kind(error, outcome):
    metrics = EnvironmentMetrics()
    metered = executors.MeteredExecutor(_Failing(error), metrics)
    assert metered.executor_id == "failing"
    with pytest.raises(type(error)):
        await metered.chat([Message("user", "hi")])
    value = metrics.registry.get_sample_value(
        "aflowrl_environment_executor_requests_total", {"outcome": outcome}
    )
    assert value == 1.0


def test_values_from_the_caller_are_checked():
    assert state_values(None, 0.0, field="step.values") is None
    values = state_values({HASH: 0.25}, -1.0, field="step.values")
    assert values is not None and values.values == {HASH: 0.25} and values.default == -1.0
    cases = [
        ({"seed": 1.0}, 0.0, "step.values.values", "not a workflow hash"),
        ({HASH.upper(): 1.0}, 0.0, "step.values.values", "not a workflow hash"),
        ({HASH: math.nan}, 0.0, "step.values.values", "not finite"),
        ({HASH: 1.0}, math.inf, "step.values.default_value", "not finite"),
    ]
    for given, default, field, message in cases:
        with pytest.raises(BadRequestError, match=message) as caught:
            state_values(given, default, field="step.values")
        assert caught.value.field == field
    many = {f"{i:064x}": 0.0 for i in range(MAX_VALUE_ANCHORS + 1)}
    with pytest.raises(BadRequestError, match="anchors; at most"):
        state_values(many, 0.0, field="reset.values")


def test_the_hit_ratio_covers_every_evaluator_sharing_the_counters():
    metrics = EnvironmentMetrics()
    assert metrics.cache_totals() == (0, 0)
    metrics.cache_hits.inc(3)
    metrics.cache_misses.inc()
    metrics.cache_hit_ratio.set(0.0)  # what one evaluator of several would set: ignored
    assert metrics.cache_totals() == (3, 1)
    assert metrics.registry.get_sample_value("aflowrl_environment_cache_hit_ratio") == 0.75


def test_fused_selection_without_a_value_source_is_refused_at_startup():
    with pytest.raises(ValidationError, match="valueSource"):  # the spec parser refuses it
        _spec(benchmarks=["humaneval"], search={"selection": "fused", "valueSource": "none"})
    spec = _spec(
        benchmarks=["humaneval"], search={"selection": "fused", "valueSource": "anchor-mc"}
    )
    search = spec.environment.search.model_copy(update={"value_source": "none"})
    built = spec.model_copy(
        update={"environment": spec.environment.model_copy(update={"search": search})}
    )  # built in code, past the parser's checks: the server refuses it too
    with pytest.raises(InvalidInputError, match="fused selection needs a value source") as caught:
        server.check_spec(built)
    assert caught.value.field == "environment.search.valueSource"
