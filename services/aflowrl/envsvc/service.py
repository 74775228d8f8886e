"""``EnvironmentService`` (protos/aflowrl/v1/environment.proto): the gRPC adapter.

Protos in, :class:`~aflowrl.envsvc.environment.Environment` calls, protos out. Request fields
are checked here (action mode, seed workflow JSON, values) and bad ones raise
:class:`~aflowrl.envsvc.errors.BadRequestError` naming the field, which the error interceptor
turns into INVALID_ARGUMENT. Costs: ``StepInfo.cost_usd`` is what the step spent (cache hits
are free); ``EvalSummary.cost_usd`` is what the workflow's runs cost, cache hits counted at what
they cost when made, so it is the same on every replica and retry. Used by
:mod:`aflowrl.envsvc.server`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from aflowrl._proto.v1 import common_pb2, environment_pb2, environment_pb2_grpc
from aflowrl.config.environment import PoolName
from aflowrl.envsvc.environment import Environment, state_values
from aflowrl.envsvc.errors import BadRequestError, WarmingUpError
from aflowrl.search import ActionMode, Observation, StaticValues
from aflowrl.workflow import EvaluationResult, Graph, WorkflowValidationError

SERVICE_NAME: Final = environment_pb2.DESCRIPTOR.services_by_name["EnvironmentService"].full_name

_MODES: Final[dict[int, ActionMode | None]] = {
    environment_pb2.ACTION_MODE_UNSPECIFIED: None,
    environment_pb2.ACTION_MODE_CHOICE: "choice",
    environment_pb2.ACTION_MODE_TEXT: "text",
    environment_pb2.ACTION_MODE_FREEFORM: "freeform",
}

POOLS: Final[dict[int, PoolName]] = {
    environment_pb2.PROBLEM_POOL_UNSPECIFIED: "all",
    environment_pb2.PROBLEM_POOL_TRAINING: "training",
    environment_pb2.PROBLEM_POOL_TUNING: "tuning",
    environment_pb2.PROBLEM_POOL_HELD_OUT: "held_out",
    environment_pb2.PROBLEM_POOL_TEST: "test",
}
"""ResetRequest.problem_pool -> the pool's name (``environment.evaluation.pools``)."""


def _graph(text: str, field: str) -> Graph:
    try:
        return Graph.from_json(text, source="workflow")
    except WorkflowValidationError as exc:
        raise BadRequestError(str(exc), field=field) from None


def _values(request: Any, field: str) -> StaticValues | None:
    if not request.HasField("values"):
        return None
    given = request.values
    return state_values(dict(given.values), given.default_value, field=field)


def _observation(observation: Observation) -> environment_pb2.Observation:
    return environment_pb2.Observation(
        text=observation.text,
        admissible_actions=list(observation.admissible_actions),
        anchor=observation.anchor,
        admissible_in_tree=[-1 if i is None else i for i in observation.in_tree],
    )


def _cost(value: float | None) -> tuple[float, bool]:
    return (0.0, False) if value is None else (value, True)


def _summary(
    *,
    mean: float,
    std: float,
    num_problems: int,
    cost_usd: float | None,
    executor_calls: int,
    cache_hits: int,
    latency_s: float,
) -> environment_pb2.EvalSummary:
    cost, known = _cost(cost_usd)
    return environment_pb2.EvalSummary(
        mean=mean,
        std=std,
        num_problems=num_problems,
        cost_usd=cost,
        cost_known=known,
        executor_calls=executor_calls,
        cache_hits=cache_hits,
        latency_s=latency_s,
    )


def _result_summary(result: EvaluationResult) -> environment_pb2.EvalSummary:
    return _summary(
        mean=result.score_mean,
        std=result.score_std,
        num_problems=len(result.problems),
        cost_usd=result.cost_usd,
        executor_calls=result.executor_calls,
        cache_hits=result.cache_hits,
        latency_s=result.wall_s,
    )


class EnvironmentServicer(environment_pb2_grpc.EnvironmentServiceServicer):
    """Serves one :class:`Environment` (module docstring)."""

    def __init__(
        self,
        environment: Environment | None = None,
        *,
        uptime: Callable[[], float] | None = None,
    ) -> None:
        self._environment = environment
        started = time.monotonic()
        self.uptime = uptime or (lambda: time.monotonic() - started)
        """Seconds since the server started serving (the server sets it)."""

    def attach(self, environment: Environment) -> None:
        """Serve ``environment`` (set once warm-up has built it)."""
        self._environment = environment

    @property
    def environment(self) -> Environment:
        if self._environment is None:
            raise WarmingUpError("the environment is still warming up; retry shortly")
        return self._environment

    async def Reset(
        self, request: environment_pb2.ResetRequest, context: Any
    ) -> environment_pb2.ResetResponse:
        if request.action_mode not in _MODES:
            raise BadRequestError(
                f"{request.action_mode} is not an ActionMode", field="reset.action_mode"
            )
        if request.problem_pool not in POOLS:
            raise BadRequestError(
                f"{request.problem_pool} is not a ProblemPool", field="reset.problem_pool"
            )
        seed_workflow = (
            _graph(request.seed_workflow_json, "reset.seed_workflow_json")
            if request.seed_workflow_json
            else None
        )
        if request.max_steps < 0:
            raise BadRequestError(
                f"{request.max_steps} is negative (0: the server's default)",
                field="reset.max_steps",
            )
        result = await self.environment.reset(
            task=request.task,
            seed=request.seed,
            episode_id=request.episode_id,
            seed_workflow=seed_workflow,
            max_steps=request.max_steps or None,
            action_mode=_MODES[request.action_mode],
            values=_values(request, "reset.values"),
            pool=POOLS[request.problem_pool],
        )
        outcome = result.outcome
        seed_node = outcome.state.nodes[0]
        return environment_pb2.ResetResponse(
            state=result.blob,
            observation=_observation(outcome.observation),
            seed_score=seed_node.score,
            seed_eval=_summary(
                mean=seed_node.score,
                std=seed_node.std,
                num_problems=outcome.seed_evaluation.num_problems,
                cost_usd=seed_node.cost_usd,
                executor_calls=outcome.seed_evaluation.executor_calls,
                cache_hits=outcome.seed_evaluation.cache_hits,
                latency_s=outcome.seed_evaluation.wall_s,
            ),
        )

    async def Step(
        self, request: environment_pb2.StepRequest, context: Any
    ) -> environment_pb2.StepResponse:
        result = await self.environment.step(
            request.state, request.action, _values(request, "step.values")
        )
        outcome = result.outcome
        info = outcome.info
        cost, known = _cost(info.cost_usd)
        return environment_pb2.StepResponse(
            state=result.blob,
            observation=None if outcome.done else _observation(outcome.observation),
            reward=outcome.reward,
            done=outcome.done,
            info=environment_pb2.StepInfo(
                valid_action=info.valid_action,
                invalid_reason=info.invalid_reason,
                canonical_action=info.canonical_action,
                parent_score=info.parent_score,
                child_score=info.child_score,
                best_score=info.best_score,
                child_hash=info.child_hash if info.valid_action else "",
                duplicate=info.duplicate,
                executor_calls=info.executor_calls,
                cache_hits=info.cache_hits,
                cost_usd=cost,
                cost_known=known,
                step_index=info.step_index,
                prompt_tokens=info.prompt_tokens,
                completion_tokens=info.completion_tokens,
                child_workflow_json=result.child.to_json(indent=None) if result.child else "",
                done_reason=info.done_reason,
                best_gain=info.best_gain,
                resampled=info.resampled_reward is not None,
                resampled_reward=info.resampled_reward or 0.0,
            ),
        )

    async def Project(
        self, request: environment_pb2.ProjectRequest, context: Any
    ) -> environment_pb2.ProjectResponse:
        projection = self.environment.project(request.state, request.action)
        return environment_pb2.ProjectResponse(
            valid_action=projection.valid,
            invalid_reason=projection.reason,
            canonical_action=projection.action if projection.valid else "",
            child_hash=projection.child_hash,
        )

    async def Evaluate(
        self, request: environment_pb2.EvaluateRequest, context: Any
    ) -> environment_pb2.EvaluateResponse:
        if not request.workflow_json:
            raise BadRequestError("empty; send a workflow as JSON", field="evaluate.workflow_json")
        self.environment.check_task(request.benchmark, "evaluate.benchmark")
        graph = _graph(request.workflow_json, "evaluate.workflow_json")
        if request.repeats < 0:
            raise BadRequestError(
                f"{request.repeats} is negative (0: the server's default)",
                field="evaluate.repeats",
            )
        result = await self.environment.evaluate(
            graph,
            benchmark=request.benchmark,
            split=request.split,
            problem_ids=list(request.problem_ids),
            repeats=request.repeats or None,
            seed=request.seed,
        )
        return environment_pb2.EvaluateResponse(
            summary=_result_summary(result),
            problems=[
                environment_pb2.ProblemScore(
                    problem_id=p.problem.problem_id, scores=[s.score for s in p.samples]
                )
                for p in result.problems
            ],
            workflow_hash=result.workflow_hash,
        )

    async def Info(
        self, request: environment_pb2.EnvInfoRequest, context: Any
    ) -> environment_pb2.EnvInfoResponse:
        info = self.environment.info()
        return environment_pb2.EnvInfoResponse(
            service=common_pb2.ServiceInfo(
                component=info.component,
                version=info.version,
                hostname=info.hostname,
                uptime_s=self.uptime(),
            ),
            tasks=list(info.tasks),
            executor_id=info.executor_id,
            cache_entries=info.cache_entries,
            cache_hits=info.cache_hits,
            cache_misses=info.cache_misses,
        )
