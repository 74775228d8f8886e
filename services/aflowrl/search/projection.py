"""Projection of the policy's text onto one admissible action, or *invalid* with a reason.

The policy replies with an optional ``<think>...</think>`` block first, then exactly one
``<action>...</action>``; text around them is ignored. What the action holds depends on the
episode's mode:

* ``choice``: the number of a listed admissible action (``3``, ``#3``, ``3.``), or its text;
  a number followed by text must agree with the listed action of that number, and text must
  name a listed action (or an action making the same workflow).
* ``text``: any action of the edit-action language (:mod:`aflowrl.search.actions`) that applies
  to the workflow; listed or not.
* ``freeform``: a whole workflow graph in JSON (optionally in a ```json fence), validated like
  any graph, or an edit action as in text mode.

:func:`project` never raises for bad policy text: responses that are too long, have no or
several action tags, an unterminated or injected ``<think>``/``<action>`` tag, an unknown
number, an action that does not parse or does not apply, or one that changes nothing, come back
as ``Projection(valid=False, reason=...)``. Environment steps treat them as a no-op (the trainer
applies the invalid-action penalty).

Used by :mod:`aflowrl.search.episode` (Step and Project) and by the proposers, which retry
unparseable replies.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from aflowrl import documents
from aflowrl.search.actions import parse_action
from aflowrl.search.edits import Candidate, apply_action
from aflowrl.search.errors import InvalidActionError
from aflowrl.workflow import Graph, WorkflowValidationError

ActionMode = Literal["choice", "text", "freeform"]

MAX_RESPONSE_CHARS: Final = 64_000
"""Longest policy response read (a long ``<think>`` included); longer ones are invalid."""

_THINK_OPEN = re.compile(r"<think>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)
_ACTION_OPEN = re.compile(r"<action>", re.IGNORECASE)
_ACTION_CLOSE = re.compile(r"</action>", re.IGNORECASE)
_ANY_TAG = re.compile(r"</?(?:think|action)>", re.IGNORECASE)
_NUMBER = re.compile(r"^#?\s*(\d+)\s*(?:[.):]\s*(.*))?$", re.DOTALL)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class Projection:
    """Where a response lands: one admissible action, or invalid with the reason."""

    valid: bool
    reason: str = ""
    """Why the response is invalid (empty when valid)."""
    action: str = ""
    """The action in canonical form (free-form graphs: ``freeform <summary>``)."""
    child: Graph | None = None
    """The workflow the action makes (None when invalid)."""
    index: int | None = None
    """0-based position of the action in the listed admissible actions, when listed."""
    graph_json: str | None = None
    """Free-form mode: the submitted graph, compact JSON (the episode state stores it)."""

    @property
    def child_hash(self) -> str:
        return self.child.content_hash if self.child is not None else ""


def _invalid(reason: str) -> Projection:
    return Projection(valid=False, reason=reason)


def extract_action(response: str) -> str:
    """The text inside the single ``<action>`` tag; raises :class:`InvalidActionError`."""
    if len(response) > MAX_RESPONSE_CHARS:
        raise InvalidActionError(
            f"the response is {len(response)} characters long; at most {MAX_RESPONSE_CHARS}"
        )
    rest = response.lstrip()
    if _THINK_OPEN.match(rest):
        close = _THINK_CLOSE.search(rest)
        if close is None:
            raise InvalidActionError("unterminated <think> block (no </think>)")
        rest = rest[close.end() :]
    opens = _ACTION_OPEN.findall(rest)
    closes = _ACTION_CLOSE.findall(rest)
    if not opens and not closes:
        raise InvalidActionError("no <action>...</action> in the response")
    if len(opens) != 1 or len(closes) != 1:
        raise InvalidActionError(
            f"{len(opens)} <action> and {len(closes)} </action> tags; write exactly one "
            "<action>...</action>"
        )
    start = _ACTION_OPEN.search(rest)
    end = _ACTION_CLOSE.search(rest)
    assert start is not None and end is not None
    if end.start() < start.end():
        raise InvalidActionError("</action> comes before <action>")
    stray = _ANY_TAG.search(rest[: start.start()] + " " + rest[end.end() :])
    if stray is not None:
        raise InvalidActionError(f"stray {stray.group(0)} tag outside the leading think block")
    body = rest[start.end() : end.start()].strip()
    injected = _ANY_TAG.search(body)
    if injected is not None:
        raise InvalidActionError(f"stray {injected.group(0)} tag inside the action")
    if not body:
        raise InvalidActionError("the action is empty")
    return body


def _normal(text: str) -> str:
    return " ".join(text.split()).lower()


def _from_text(body: str, parent: Graph, listed: Sequence[Candidate]) -> Projection:
    """Parse and apply an edit action; note where it sits among the listed ones."""
    action = parse_action(body)
    child = apply_action(parent, action)
    return _listed_or(Projection(True, action=action.text(), child=child), listed)


def _listed_or(projection: Projection, listed: Sequence[Candidate]) -> Projection:
    """The listed action making the same workflow, if there is one (its canonical text)."""
    assert projection.child is not None
    target = projection.child.content_hash
    index = next((i for i, c in enumerate(listed) if c.child.content_hash == target), None)
    if index is None:
        return projection
    return Projection(True, action=listed[index].text, child=listed[index].child, index=index)


def _choice(body: str, parent: Graph, listed: Sequence[Candidate]) -> Projection:
    if not listed:
        return _invalid("this workflow has no admissible actions")
    number = _NUMBER.match(body)
    if number is not None:
        digits = number.group(1)
        k = int(digits) if len(digits) <= 9 else 0
        if not 1 <= k <= len(listed):
            return _invalid(f"no action numbered {digits[:12]} (choose 1 to {len(listed)})")
        chosen = listed[k - 1]
        text = (number.group(2) or "").strip()
        if text and _normal(text) != _normal(chosen.text):
            try:
                same = _from_text(text, parent, listed).index == k - 1
            except InvalidActionError:
                same = False
            if not same:
                return _invalid(
                    f"ambiguous: number {k} is {chosen.text[:80]!r} but the text says {text[:80]!r}"
                )
        return Projection(True, action=chosen.text, child=chosen.child, index=k - 1)
    projection = _from_text(body, parent, listed)
    if projection.index is None:
        return _invalid(
            f"{projection.action[:80]!r} is not one of the listed actions; answer with the "
            "number of one"
        )
    chosen = listed[projection.index]
    return Projection(True, action=chosen.text, child=chosen.child, index=projection.index)


def summarize(graph: Graph) -> str:
    """A one-line description of a graph's shape (``Custom x5 -> ScEnsemble -> Format``)."""
    parts = [f"{n.op} x{n.samples}" if n.samples > 1 else n.op for n in graph.topological()]
    return " -> ".join(parts)


def _freeform(body: str, parent: Graph, listed: Sequence[Candidate]) -> Projection:
    fenced = _FENCE.match(body)
    text = fenced.group(1) if fenced else body
    if not text.startswith("{"):
        return _from_text(text, parent, listed)
    try:
        doc = documents.load_json(text, source="action", max_chars=MAX_RESPONSE_CHARS)
    except documents.DocumentError as exc:
        return _invalid(f"the workflow is not accepted JSON: {exc.reason}")
    if isinstance(doc, dict):
        doc.setdefault("name", parent.name)
        doc.setdefault("task_type", parent.task_type)
    try:
        child = Graph.from_dict(doc, source="action")
    except WorkflowValidationError as exc:
        problems = "; ".join(f"{f}: {m}" for f, m in exc.problems[:3])
        more = f" (+{len(exc.problems) - 3} more)" if len(exc.problems) > 3 else ""
        return _invalid(f"invalid workflow: {problems}{more}")
    if child.task_type != parent.task_type:
        return _invalid(f"the workflow is for {child.task_type} tasks; this is {parent.task_type}")
    if child.content_hash == parent.content_hash:
        return _invalid("the workflow is the same as the one to modify")
    graph_json = child.to_json(indent=None)
    projection = Projection(True, action=f"freeform {summarize(child)}", child=child)
    listed_projection = _listed_or(projection, listed)
    if listed_projection.index is not None:
        return listed_projection  # the same workflow as a listed action: stored as that action
    return Projection(True, action=projection.action, child=child, graph_json=graph_json)


def project(
    response: str, parent: Graph, *, mode: ActionMode, listed: Sequence[Candidate]
) -> Projection:
    """Project ``response`` onto an action on ``parent``; never raises for bad text."""
    try:
        body = extract_action(response)
        if mode == "choice":
            return _choice(body, parent, listed)
        if mode == "text":
            return _from_text(body, parent, listed)
        return _freeform(body, parent, listed)
    except InvalidActionError as exc:
        return _invalid(str(exc))
