"""The observation: the text the policy reads before it proposes one edit.

It holds, in this order: the task (benchmark, task type, step, the tree's size, best and seed
scores), the workflow to modify (rendered readably with every prompt in full; as JSON in
free-form mode) with its score, the experience of its children (every action tried on it,
whether it improved the score, duplicates and rejected actions with the reason), a few
problems it got wrong (question, expected, produced), the operator descriptions (unless
``search.describeOperators`` is off), the action
language (text and free-form modes), the admissible actions (every one in full; one that leads
to a workflow the tree already holds is marked with that workflow and its score, since taking
it gains nothing), and how to reply.

The text is at most ``max_chars`` long (``environment.search.maxObservationChars``). Nothing is
cut silently and nothing the policy acts on is shortened while it fits: the header, the
workflow, the admissible actions and the reply always stay whole; then the experience (newest
first), the wrong problems and the operator list take what is left, whole items only, and a
line says how many items of a section were left out. Only when even the fixed parts do not fit
are the workflow's prompts shortened (each cut says how many characters it removed), and as a
last resort the text is cut in the middle with a note. Long problem statements and answers in
the wrong-problem examples are clipped (saying by how much): they illustrate, the policy does
not act on them. Used by :mod:`aflowrl.search.episode`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from aflowrl.benchmarks.base import Problem
from aflowrl.search.actions import GRAMMAR
from aflowrl.search.projection import ActionMode
from aflowrl.search.state import Attempt, EpisodeState, TreeNode, WrongRun
from aflowrl.workflow import Graph, describe_operators, render_text

_QUESTION_CHARS: Final = 700
_EXPECTED_CHARS: Final = 300
_PRODUCED_CHARS: Final = 300
_REASON_CHARS: Final = 300
_CUT_NOTE: Final = "\n[... observation cut to {limit} characters: {cut} characters left out ...]\n"


def clip(text: str, limit: int) -> str:
    """``text`` on one line, cut at ``limit`` characters with the cut stated."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    keep = max(0, limit - 24)
    return f"{flat[:keep]}... [+{len(flat) - keep} chars]"


@dataclass(frozen=True)
class ObservationInput:
    """Everything the observation shows (gathered by the episode module)."""

    benchmark: str
    state: EpisodeState
    graph: Graph
    """The workflow the next step modifies."""
    mode: ActionMode
    listed: Sequence[str]
    """Admissible actions in canonical form."""
    problems: Mapping[str, Problem]
    """Problems by id (for the wrong examples)."""
    in_tree: Sequence[int | None] = ()
    """For each listed action, the tree node of the workflow it makes when the tree already
    holds it (None: a new workflow). Empty: nothing is marked."""


def _percent(score: float) -> str:
    return f"{100 * score:.1f}%"


def _experience_line(attempt: Attempt, nodes: Sequence[TreeNode], parent: TreeNode) -> str:
    action = " ".join(attempt.action.split())
    if not attempt.valid:
        return f"- [rejected] {action}: {clip(attempt.reason, _REASON_CHARS)}"
    assert attempt.child is not None
    child = nodes[attempt.child]
    delta = 100 * (child.score - parent.score)
    if attempt.duplicate:
        return (
            f"- [duplicate of workflow #{attempt.child}, nothing gained] {action} -> "
            f"{_percent(child.score)} ({delta:+.1f})"
        )
    if child.raced:
        return (
            f"- [worse, raced out] {action} -> {_percent(child.score)} on the first "
            f"{child.raced_after} problems ({delta:+.1f})"
        )
    verdict = "improved" if delta > 0 else ("no change" if delta == 0 else "worse")
    return f"- [{verdict}] {action} -> {_percent(child.score)} ({delta:+.1f})"


def _wrong_item(index: int, wrong: WrongRun, problem: Problem | None) -> str:
    question = clip(problem.question, _QUESTION_CHARS) if problem else "(problem not loaded)"
    expected = clip(problem.gold, _EXPECTED_CHARS) if problem else "?"
    produced = clip(wrong.produced, _PRODUCED_CHARS) if wrong.produced else "(no answer)"
    return (
        f"Problem {index} ({wrong.problem_id}, scored {wrong.score:.2f}):\n"
        f"  question: {question}\n  expected: {expected}\n  produced: {produced}"
    )


_NOTE_ROOM: Final = 90
"""Characters kept free for each section's "left out" line (so no section vanishes silently)."""


def _fit(title: str, items: Sequence[str], budget: int, what: str) -> str:
    """``title`` and the first items that fit in ``budget`` (whole), then how many were left
    out; when not even the title and one item fit, one line saying the section was left out."""
    if not items:
        return ""
    lines = [title]
    used = len(title) + 1
    for i, item in enumerate(items):
        note = f"[{len(items) - i} of {len(items)} {what} left out to fit the observation]"
        last = i == len(items) - 1
        if used + len(item) + 1 + (0 if last else len(note) + 1) > budget:
            if i == 0:
                name = title.lstrip("# ").split(" (")[0]
                return f"[{name}: {len(items)} {what} left out to fit the observation]\n"
            lines.append(note)
            return "\n".join(lines) + "\n"
        lines.append(item)
        used += len(item) + 1
    return "\n".join(lines) + "\n"


def _cut_middle(text: str, tail: str, max_chars: int) -> str:
    """``text`` (which ends with ``tail``) cut to ``max_chars``, keeping ``tail`` if it fits."""
    note = _CUT_NOTE.format(limit=max_chars, cut=len(text))
    for _ in range(2):  # the note's own length depends on the count it states
        room = max_chars - len(note)
        keep_tail = tail if len(tail) <= room else ""
        head = text[: max(0, room - len(keep_tail))]
        if not keep_tail:
            half = room // 2
            head, keep_tail = text[:half], text[len(text) - (room - half) :]
        note = _CUT_NOTE.format(limit=max_chars, cut=len(text) - len(head) - len(keep_tail))
    return head + note + keep_tail


def _workflow(obs: ObservationInput, prompt_chars: int | None) -> str:
    node = obs.state.nodes[obs.state.parent]
    scored = (
        f"the first {node.raced_after} of {obs.state.problem_count} problems (raced out; it is "
        "scored in full before your edit is measured against it)"
        if node.raced
        else f"{obs.state.problem_count} problems"
    )
    head = (
        f"## Workflow to modify: #{obs.state.parent}, validation score {_percent(node.score)}"
        f" (+- {100 * node.std:.1f}, {scored} x {obs.state.repeats})\n"
    )
    if obs.mode == "freeform":
        doc = obs.graph.to_dict()
        if prompt_chars is not None:
            doc["prompts"] = {k: clip(v, prompt_chars) for k, v in doc["prompts"].items()}
        return head + json.dumps(doc, ensure_ascii=False) + "\n"
    return head + render_text(obs.graph, prompt_chars=prompt_chars) + "\n"


def _actions(obs: ObservationInput) -> str:
    if not obs.listed or obs.mode == "freeform":
        return ""
    nodes = obs.state.nodes
    marks = list(obs.in_tree) or [None] * len(obs.listed)
    lines = []
    for text, index in zip(obs.listed, marks, strict=True):
        line = f"- {' '.join(text.split())}"
        if index is not None:
            line += (
                f"   [already in the tree as workflow #{index} ({_percent(nodes[index].score)}):"
                " choosing it gains nothing]"
            )
        lines.append(line)
    title = (
        "## Admissible actions (reply with one of them)"
        if obs.mode == "choice"
        else "## Some admissible actions"
    )
    return title + "\n" + "\n".join(lines) + "\n"


def _reply(mode: ActionMode) -> str:
    what = {
        "choice": "one admissible action, written exactly as listed, e.g. <action>add ScEnsemble "
        "after generate samples=5</action>",
        "text": "one action of the language, e.g. <action>add ScEnsemble after generate "
        "samples=5</action>",
        "freeform": "the whole modified workflow as JSON in the format shown above (or one "
        "action of the language)",
    }[mode]
    return (
        "## Reply\nChange one detail of the workflow so it scores higher. Think inside "
        f"<think>...</think> if you like, then give {what}, inside <action>...</action>."
    )


def render_observation(obs: ObservationInput, max_chars: int) -> str:
    """The observation text, at most ``max_chars`` long (see the module docstring)."""
    state = obs.state
    config = state.search
    header = (
        f"# Optimising an agentic workflow for {obs.benchmark} ({state.task_type} tasks)\n"
        f"Step {state.step + 1} of {config.max_steps}. The workflow is run by an executor LLM "
        f"on the validation problems; the tree holds {len(state.nodes)} workflows; best score "
        f"so far {_percent(state.best_score)} (workflow #{state.best}), seed workflow "
        f"{_percent(state.nodes[0].score)}.\n"
    )
    reply = _reply(obs.mode)
    language = "" if obs.mode == "choice" else f"## Action language (one action)\n{GRAMMAR}\n"
    actions = _actions(obs)
    tail = language + actions + reply
    fixed_budget = max_chars - len(header) - len(tail) - 3 * _NOTE_ROOM
    workflow = _workflow(obs, None)
    for prompt_chars in (600, 300, 120, 40):
        if len(workflow) <= fixed_budget:
            break
        workflow = _workflow(obs, prompt_chars)
    budget = fixed_budget - len(workflow) + 3 * _NOTE_ROOM

    parent = state.nodes[state.parent]
    tried = state.tried_from(state.parent)
    experience = [_experience_line(a, state.nodes, parent) for a in reversed(tried)]
    wrong = [
        _wrong_item(i, w, obs.problems.get(w.problem_id))
        for i, w in enumerate(parent.wrong[: config.failed_examples], start=1)
    ]
    operators = (
        describe_operators(state.task_type).splitlines() if config.describe_operators else []
    )
    sections: dict[str, str] = {}
    for key, title, items, what in (
        (
            "experience",
            f"## Tried on this workflow ({len(tried)} steps, newest first)",
            experience,
            "steps",
        ),
        ("wrong", "## Problems it got wrong", wrong, "problems"),
        ("operators", "## Operators", operators, "operators"),
    ):
        section = _fit(title, items, max(0, budget), what)
        budget -= len(section)
        sections[key] = section
    body = sections["experience"] + sections["wrong"] + sections["operators"]
    text = header + workflow + body + tail
    return text if len(text) <= max_chars else _cut_middle(text, tail, max_chars)
