"""A toy EnvironmentService for testing the trainer's loop against the real rollout and learner.

It is a test double: the subject is the trainer (batching, advantages, Train, weight push,
checkpoints, failover), not the environment, which the end-to-end tests run for real. Each
episode is ``max_steps`` choices among four admissible actions (real edit-action texts, so the
tiny model's tokenizer knows them); action 1 earns +0.1, the others -0.05, and a number out of
range is an invalid action (reward 0). The state blob is JSON carried by the caller, as the real
service's is; Step is deterministic, so a retry on another replica gives the same answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Awaitable, Callable

import grpc

from aflowrl._proto.v1 import environment_pb2, environment_pb2_grpc
from aflowrl.common.server import GrpcServer, ServerOptions, ServiceRegistration
from aflowrl.errors import InvalidInputError
from aflowrl.workflow import Graph

SERVICE = environment_pb2.DESCRIPTOR.services_by_name["EnvironmentService"].full_name

ACTIONS = (
    "add ScEnsemble after generate n=5",
    "remove review",
    "set_samples generate n=3",
    "add Review after generate",
)
REWARDS = (0.1, -0.05, -0.05, -0.05)


def _hash(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


class ToyEnv(environment_pb2_grpc.EnvironmentServiceServicer):
    def __init__(self, name: str, *, stop_after_calls: int | None = None) -> None:
        self.name = name
        self.steps = 0
        self.calls = 0
        """Reset, Project and Step calls answered."""
        self.evaluations = 0
        self.stop_after_calls = stop_after_calls
        """Answer this many Reset, Project and Step calls, then stop the server on the next one
        (a replica going away at a point fixed by the request count, not by the clock). Resets
        and Projects are routed by episode key, so every replica of the ring gets some of a
        run's; Steps go to the owner of the child's hash, which a trained policy may never make
        this replica."""
        self.stopping: asyncio.Task[None] | None = None
        self.stop_server: Callable[[], Awaitable[None]] | None = None

    def _observation(self, state: dict) -> environment_pb2.Observation:
        text = (
            f"## Task\nBenchmark: HumanEval. Step {state['step'] + 1} of {state['max']}.\n"
            f"## Current workflow (score {state['score']:.3f})\nnode generate: Custom\n"
            "## Admissible actions\n" + "\n".join(f"- {a}" for a in ACTIONS)
        )
        return environment_pb2.Observation(
            text=text, admissible_actions=list(ACTIONS), anchor=state["anchor"]
        )

    @staticmethod
    def _decode(blob: bytes) -> dict:
        try:
            return json.loads(blob)
        except ValueError:
            raise InvalidInputError("not a toy state", field="state") from None

    @staticmethod
    def _choice(action: str) -> int | None:
        """The listed action the reply names: by its text, or by its number."""
        match = re.search(r"<action>(.*?)</action>", action, re.DOTALL)
        text = match.group(1).strip() if match else action.strip()
        if text in ACTIONS:
            return ACTIONS.index(text)
        number = re.fullmatch(r"(\d+)", text)
        k = int(number.group(1)) - 1 if number else -1
        return k if 0 <= k < len(ACTIONS) else None

    async def Reset(self, request, context):
        await self._count(context)
        seed_hash = Graph.from_json(request.seed_workflow_json).content_hash
        state = {
            "seed": request.seed,
            "step": 0,
            "max": request.max_steps or 2,
            "score": 0.5,
            "anchor": seed_hash,
            "best": 0.5,
        }
        return environment_pb2.ResetResponse(
            state=json.dumps(state).encode(),
            observation=self._observation(state),
            seed_score=0.5,
        )

    async def Project(self, request, context):
        await self._count(context)
        state = self._decode(request.state)
        k = self._choice(request.action)
        if k is None:
            return environment_pb2.ProjectResponse(valid_action=False, invalid_reason="no such")
        return environment_pb2.ProjectResponse(
            valid_action=True, child_hash=_hash(state["anchor"], str(k))
        )

    async def _count(self, context) -> None:
        """Count a call, or stop the replica and refuse the call once the count is reached."""
        if self.stop_after_calls is not None and self.calls >= self.stop_after_calls:
            if self.stopping is None and self.stop_server is not None:
                self.stopping = asyncio.create_task(self.stop_server())
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"replica {self.name} is stopping")
        self.calls += 1

    async def Step(self, request, context):
        await self._count(context)
        self.steps += 1
        state = self._decode(request.state)
        k = self._choice(request.action)
        parent = state["score"]
        reward = REWARDS[k] if k is not None else 0.0
        child = _hash(state["anchor"], str(k)) if k is not None else ""
        state = {
            **state,
            "step": state["step"] + 1,
            "score": parent + reward,
            "anchor": child or state["anchor"],
            "best": max(state["best"], parent + reward),
        }
        done = state["step"] >= state["max"]
        return environment_pb2.StepResponse(
            state=b"" if done else json.dumps(state).encode(),
            observation=environment_pb2.Observation() if done else self._observation(state),
            reward=reward,
            done=done,
            info=environment_pb2.StepInfo(
                valid_action=k is not None,
                parent_score=parent,
                child_score=parent + reward,
                best_score=state["best"],
                child_hash=child,
                executor_calls=3,
                cost_known=True,
            ),
        )

    async def Evaluate(self, request, context):
        self.evaluations += 1
        graph = Graph.from_json(request.workflow_json)
        mean = int(graph.content_hash[:4], 16) / 0xFFFF
        return environment_pb2.EvaluateResponse(
            summary=environment_pb2.EvalSummary(
                mean=mean, std=0.01, num_problems=7, cost_known=True, executor_calls=7
            ),
            workflow_hash=graph.content_hash,
        )

    async def Info(self, request, context):
        return environment_pb2.EnvInfoResponse(tasks=["humaneval"], executor_id="toy")


async def serve_toy(name: str, *, stop_after_calls: int | None = None) -> tuple[GrpcServer, ToyEnv]:
    """A started toy replica on a free loopback port (stop it with ``await server.stop()``);
    with ``stop_after_calls`` it stops itself on the call after that many."""
    servicer = ToyEnv(name, stop_after_calls=stop_after_calls)
    registration = ServiceRegistration(
        servicer, environment_pb2_grpc.add_EnvironmentServiceServicer_to_server, SERVICE
    )
    server = GrpcServer(
        ServerOptions(component="environment", host="127.0.0.1", port=0, grace_s=0.5),
        [registration],
    )
    servicer.stop_server = server.stop
    await server.start()
    return server, servicer
