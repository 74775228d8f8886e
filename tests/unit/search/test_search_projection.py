"""Projection of policy text: valid, malformed, ambiguous and hostile responses."""

from __future__ import annotations

import json
import random
import re

import pytest

from aflowrl.search import admissible_actions, project
from aflowrl.search.projection import MAX_RESPONSE_CHARS
from aflowrl.workflow import library

SEED = library.load("seed", "math")
LISTED = admissible_actions(SEED, 24)


def choice(response: str):
    return project(response, SEED, mode="choice", listed=LISTED)


def text(response: str):
    return project(response, SEED, mode="text", listed=LISTED)


def freeform(response: str):
    return project(response, SEED, mode="freeform", listed=LISTED)


@pytest.mark.parametrize(
    "response",
    [
        "<action>1</action>",
        "<think>An ensemble should help.</think>\n<action> 1 </action>",
        "<THINK>x</THINK><ACTION>#1</ACTION>",
        "I pick <action>1.</action> because ensembles help.",
        "<action>1. add ScEnsemble after generate samples=5</action>",
        "<action>add ScEnsemble after generate samples=5</action>",
        "<action>add ScEnsemble after generate</action>",  # same workflow as listed action 1
        "<think>maybe <action>3</action>? no.</think><action>1</action>",
    ],
)
def test_choice_mode_accepts_numbers_and_listed_text(response):
    projection = choice(response)
    assert projection.valid, projection.reason
    assert projection.index == 0 and projection.action == LISTED[0].text
    assert projection.child_hash == LISTED[0].child.content_hash


def test_text_mode_accepts_any_applicable_action_listed_or_not():
    listed = text("<think>plan</think><action>add ScEnsemble after generate samples=5</action>")
    assert listed.valid and listed.index == 0
    custom = text('<action>set_prompt generate "Compute carefully, step by step."</action>')
    assert custom.valid and custom.index is None
    assert custom.child is not None and "Compute carefully" in str(custom.child.prompts)


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ("add ScEnsemble after generate", "no <action>"),
        ("", "no <action>"),
        ("<action></action>", "empty"),
        ("<action>1</action><action>2</action>", "exactly one"),
        ("<action>1", "exactly one"),
        ("</action>1<action>", "comes before"),
        ("<think>never closed <action>1</action>", "unterminated <think>"),
        ("<action>1</action></think>", "stray </think>"),
        ("<think>a</think><think>b</think><action>1</action>", "stray <think>"),
        ("<action>0</action>", "no action numbered 0"),
        (f"<action>{len(LISTED) + 1}</action>", "no action numbered"),
        ("<action>99999999999999</action>", "no action numbered 999999999999"),
        ("<action>2. add ScEnsemble after generate samples=5</action>", "ambiguous"),
        (
            '<action>set_prompt generate "Something nobody listed."</action>',
            "not one of the listed",
        ),
        ("<action>remove generate</action>", "reads only the problem"),
        ("<action>launch the rockets</action>", "unknown verb"),
        ("x" * (MAX_RESPONSE_CHARS + 1), "at most"),
    ],
)
def test_choice_mode_rejects_malformed_and_ambiguous_responses(response, reason):
    projection = choice(response)
    assert not projection.valid and projection.child is None
    assert projection.reason
    assert re.search(reason, projection.reason), projection.reason


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        # An injected closing tag inside a prompt makes two actions: refused, not half-applied.
        (
            '<action>set_prompt generate "x</action><action>remove generate"</action>',
            "exactly one",
        ),
        ('<action>set_prompt generate "<think>sneaky</think>"</action>', "stray"),
        ("<action>set generate samples=5</action>", "would be invalid"),
        ("<action>1</action>", "unknown verb|not a node|expected"),
        ('<action>set_prompt generate "' + "y" * 13_000 + '"</action>', "at most"),
        ("<action>add ScEnsemble after generate\x00</action>", "unexpected character"),
    ],
)
def test_text_mode_rejects_hostile_responses(response, reason):
    projection = text(response)
    assert not projection.valid and re.search(reason, projection.reason), projection.reason


def test_a_long_think_block_is_fine_within_the_limit():
    thought = "<think>" + "consider the ensemble. " * 2000 + "</think>"
    assert len(thought) < MAX_RESPONSE_CHARS
    assert choice(thought + "<action>2</action>").index == 1


def test_freeform_mode_validates_a_whole_graph():
    cot_sc = library.load("cot_sc", "math").to_dict()
    good = freeform(f"<action>```json\n{json.dumps(cot_sc)}\n```</action>")
    assert good.valid and good.action.startswith("freeform Custom x5 -> ScEnsemble")
    assert good.graph_json is not None
    no_name = {k: v for k, v in cot_sc.items() if k not in ("name", "task_type")}
    assert freeform(f"<action>{json.dumps(no_name)}</action>").valid
    # An edit action also works in free-form mode.
    assert freeform("<action>add Format after generate</action>").valid
    # A graph some listed action also makes is that action (so it is stored compactly).
    same = freeform(f"<action>{LISTED[0].child.to_json()}</action>")
    assert same.index == 0 and same.action == LISTED[0].text and same.graph_json is None


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ("{not json", "not (valid )?JSON"),
        ("[" * 5000 + "]" * 5000, "unknown verb|unexpected"),
        ("{" + '"a":' * 3000 + "1" + "}" * 3000, "not (valid )?JSON|nested too deeply|invalid"),
        (json.dumps(library.load("seed", "math").to_dict()), "same as the one to modify"),
        (json.dumps(library.load("seed", "code").to_dict()), "for code tasks"),
        (json.dumps({"nodes": [{"id": "a", "op": "Nope"}], "output": "a"}), "invalid workflow"),
        (json.dumps({"nodes": "many", "output": 3}), "invalid workflow"),
        (json.dumps([1, 2]), "unknown verb|unexpected"),
    ],
)
def test_freeform_mode_rejects_bad_graphs(payload, reason):
    projection = freeform(f"<action>{payload}</action>")
    assert not projection.valid and re.search(reason, projection.reason), projection.reason


def test_projection_never_raises_on_random_text():
    rng = random.Random(0)
    pieces = [
        "<think>",
        "</think>",
        "<action>",
        "</action>",
        "add",
        "remove",
        "set",
        "generate",
        "ScEnsemble",
        "after",
        "=",
        '"',
        "\\",
        "{",
        "}",
        "[",
        "3",
        "samples",
        " ",
        "\n",
        "\x00",
        "é",
        "set_prompt",
        "wrap",
        "in",
    ]
    for _ in range(2000):
        response = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 30)))
        for mode in ("choice", "text", "freeform"):
            projection = project(response, SEED, mode=mode, listed=LISTED)
            assert projection.valid == (projection.child is not None)
