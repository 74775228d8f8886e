"""The ``policy`` proposer on the tiny randomly initialised Qwen2 checkpoint (needs torch)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from aflowrl.search import (  # noqa: E402
    encoding,
    project_action,
    reset,
)
from aflowrl.search.optimize import run_search  # noqa: E402
from aflowrl.search.policy import PolicyProposer  # noqa: E402
from aflowrl.search.rundir import RunDirectory  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    """The built-in tiny Qwen2 policy (built once into the test cache directory)."""
    from aflowrl.models import builtin

    return builtin.ensure("tiny")


async def test_choice_mode_samples_from_a_softmax_over_the_candidates(checkpoint, make_context):
    proposer = PolicyProposer.load(checkpoint, seed=1)
    ctx = make_context(max_steps=3, max_observation_chars=1500)
    start = await reset(ctx, seed=0)
    log_pi = proposer.score_candidates(start.observation)
    assert len(log_pi) == len(start.observation.admissible_actions)
    assert math.fsum(math.exp(v) for v in log_pi) == pytest.approx(1.0)
    assert len(set(round(v, 6) for v in log_pi)) > 1  # candidates are told apart
    check = lambda r: project_action(ctx, start.state, r)  # noqa: E731
    first = await proposer.propose(start.observation, round=0, check=check)
    assert check(first.response).valid
    again = await PolicyProposer.load(checkpoint, seed=1).propose(
        start.observation, round=0, check=check
    )
    assert again.response == first.response
    assert encoding.action_reply("remove x") == "<action>remove x</action>"


async def test_text_mode_samples_and_retries(checkpoint, make_context):
    proposer = PolicyProposer.load(checkpoint, seed=0, max_new_tokens=12, max_retries=1)
    ctx = make_context(max_steps=3, action_mode="text", max_observation_chars=1500)
    start = await reset(ctx, seed=0)
    proposal = await proposer.propose(
        start.observation, round=0, check=lambda r: project_action(ctx, start.state, r)
    )
    assert isinstance(proposal.response, str) and 1 <= proposal.attempts <= 2


async def test_an_optimize_run_with_the_policy(checkpoint, make_context, tmp_path):
    ctx = make_context(max_observation_chars=1500)
    state = await run_search(
        ctx, PolicyProposer.load(checkpoint), RunDirectory(tmp_path), rounds=2, seed=0
    )
    assert state.step == 2 and all(a.valid for a in state.attempts)


def test_a_directory_without_a_model_is_refused(tmp_path):
    from aflowrl.errors import NotFoundError

    with pytest.raises(NotFoundError, match="--policy"):
        PolicyProposer.load(tmp_path)


async def test_the_tiny_name_loads_the_built_in_model(make_context):
    proposer = PolicyProposer.load("tiny", seed=2)
    ctx = make_context(max_steps=2, max_observation_chars=1500)
    start = await reset(ctx, seed=0)
    proposal = await proposer.propose(
        start.observation, round=0, check=lambda r: project_action(ctx, start.state, r)
    )
    assert project_action(ctx, start.state, proposal.response).valid
