"""The episode state: compact JSON, and clear refusals of corrupted or foreign states."""

from __future__ import annotations

import json

import pytest

from aflowrl.search import EpisodeState, EpisodeStateError, graph_at, reset, step


@pytest.fixture
async def played(make_context):
    ctx = make_context(max_steps=4)
    outcome = await reset(ctx, seed=4)
    state = outcome.state
    for k in (1, 3, 9):
        state = (await step(ctx, state, f"<action>{k}</action>")).state
    return state


async def test_the_json_form_is_compact_and_round_trips(played):
    text = played.to_json()
    assert EpisodeState.from_json(text) == played
    assert EpisodeState.from_json(text.encode()) == played
    assert len(text) < 8000  # 4 workflows, their experience and wrong problems
    doc = json.loads(text)
    assert doc["version"] == 1 and "graph" in doc["nodes"][0] and "graph" not in doc["nodes"][1]
    for i in range(len(played.nodes)):
        assert graph_at(played, i).content_hash == played.nodes[i].hash


def _edit(state: EpisodeState, change) -> str:
    doc = json.loads(state.to_json())
    change(doc)
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d.update(version=2), "state.version"),
        (lambda d: d.pop("version"), "state.version"),
        (lambda d: d.update(step=-1), "state.step"),
        (lambda d: d.update(surprise=1), "state.surprise"),
        (lambda d: d.update(parent=99), "state.parent"),
        (lambda d: d.update(step=7), "state.step"),
        (lambda d: d["nodes"][1].update(parent=5), "state.nodes[1]"),
        (lambda d: d["nodes"][1].update(hash="0" * 64), "state.nodes[1]"),
        (lambda d: d["nodes"][1].update(action="remove nothing"), "state.nodes[1]"),
        (lambda d: d["nodes"][0].update(graph={"nodes": []}), "state.nodes[0]"),
        (lambda d: d["nodes"][1].update(score=1.5), "state.nodes[1].score"),
        (lambda d: d["attempts"][0].update(child=42), "state.attempts[0]"),
        (lambda d: d.update(search={"maxSteps": 0}), "state.search.maxSteps"),
    ],
)
async def test_a_corrupted_state_is_refused_naming_the_field(played, change, field):
    text = _edit(played, change)
    with pytest.raises(EpisodeStateError) as caught:
        state = EpisodeState.from_json(text)
        for i in range(len(state.nodes)):
            graph_at(state, i)
    assert caught.value.field == field


@pytest.mark.parametrize("blob", [b"", b"\xff\xfe", b"[1]", b"null", b"{" * 100_000])
def test_garbage_is_refused(blob):
    with pytest.raises(EpisodeStateError):
        EpisodeState.from_json(blob)
