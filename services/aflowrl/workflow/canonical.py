"""Canonical form and content hash of a workflow graph.

Two graphs are equal when they compute the same thing the same way: same operators, parameters,
prompt texts and wiring. Node ids, prompt-table names, the order nodes are listed in, JSON key
order and unset-versus-default parameters do not matter. The canonical form renames nodes by
their position in a depth-first post-order walk from the output, visiting inputs in operator slot
order and references in list order (both meaningful: candidates are labelled in that order). For
a DAG whose nodes all feed the output, with ordered inputs, that walk is a canonical labelling:
two graphs have the same form exactly when one is the other with ids renamed. Shared nodes are
visited once, so "one sample read twice" and "two independent samples" stay different.

The evaluation cache and the search's dedupe key on :func:`content_hash`.

:func:`upstream_hashes` gives every node the hash of its *upstream subgraph*: its operator,
parameters and instruction text, the task type, and (recursively) everything it reads. A node's
value depends on nothing else (given the problem, the sample index and the executor settings).
With it come the node's canonical position, which seeds its calls, and its *own* hash (operator,
parameters, instruction text and task type, without its inputs); these and the values its inputs
carry in a run key the node's draws (:meth:`UpstreamHash.key`), so the evaluator reuses a node's
results across workflows that feed it the same texts at the same position: an edit re-runs only
what it changes.

This module sits below :mod:`aflowrl.workflow.graph` (whose ``Graph.content_hash`` calls it) and
reads graphs through their public attributes only; it imports the graph types for annotations.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aflowrl.workflow.ops import OPS, PROBLEM

if TYPE_CHECKING:
    from aflowrl.workflow.graph import Graph, Node

HASH_VERSION = 1
"""Bumped whenever the canonical form changes (old cache entries then stop matching)."""

UPSTREAM_VERSION = 2
"""Bumped whenever :func:`upstream_hashes` changes (seeds and reused node results follow it)."""

DRAW_KEY_VERSION = 1
"""Bumped whenever :meth:`UpstreamHash.key` changes (stored draws under other keys are unused)."""


def canonical_order(graph: Graph) -> list[Node]:
    """Nodes in canonical post-order (inputs before readers; the output last)."""
    by_id = {n.id: n for n in graph.nodes}
    order: list[Node] = []
    done: set[str] = set()
    # Iterative DFS (graphs are small, but recursion depth should not depend on input).
    stack: list[tuple[str, bool]] = [(graph.output, False)]
    while stack:
        node_id, expanded = stack.pop()
        if node_id in done:
            continue
        node = by_id[node_id]
        if expanded:
            done.add(node_id)
            order.append(node)
            continue
        stack.append((node_id, True))
        refs = [ref for _, ref in node.refs() if ref != PROBLEM]
        stack.extend((ref, False) for ref in reversed(refs) if ref not in done)
    return order


def canonical_index(graph: Graph) -> dict[str, int]:
    """Node id -> canonical position."""
    return {node.id: i for i, node in enumerate(canonical_order(graph))}


def canonical_form(graph: Graph) -> dict[str, Any]:
    """A JSON-able description with no ids, names or defaults left implicit."""
    index = canonical_index(graph)

    def ref(name: str) -> str:
        return "$problem" if name == PROBLEM else f"#{index[name]}"

    nodes = []
    for node in canonical_order(graph):
        params = node.param_dict(defaults=True)
        if "instruction" in params:
            name = params["instruction"]
            params["instruction"] = None if name is None else graph.prompts[name]
        inputs = {slot: [ref(r) for r in refs] for slot, refs in node.inputs.items()}
        nodes.append({"op": node.op, "inputs": inputs, "params": params})
    return {
        "hash_version": HASH_VERSION,
        "task_type": graph.task_type,
        "nodes": nodes,
        "output": ref(graph.output),
    }


def canonical_json(graph: Graph) -> str:
    """The canonical form as compact JSON with sorted keys."""
    return json.dumps(
        canonical_form(graph), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


def content_hash(graph: Graph) -> str:
    """SHA-256 (hex) of :func:`canonical_json`."""
    return hashlib.sha256(canonical_json(graph).encode()).hexdigest()


@dataclass(frozen=True)
class UpstreamHash:
    """What a node's results depend on, as hashes (SHA-256 hex).

    ``draw`` identifies one independent draw of the node (a fan-out sample, a MedPrompt vote;
    the whole node for other operators) by everything upstream but not the number of draws
    (``samples``, ``votes``); ``node`` adds that number: it is what the node's readers depend on.
    ``own`` covers the node alone (task type, operator, parameters except the number of draws,
    instruction text), not its inputs.
    ``position`` is the node's canonical position (:func:`canonical_index`): calls are seeded by
    it, never by the node's content, so a workflow that differs from its parent only in a
    prompt draws with the parent's random numbers (common random numbers: the score change a
    prompt edit earns is the prompt's effect on the same draws, not sampling noise).

    A draw is stored under :meth:`key`: ``own``, the position and the values the node's inputs
    carry in the run. A draw's value is a function of exactly these (plus the problem, the run's
    seed and the executor settings, which the store's key adds): its prompts are built from its
    own parameters and its input values, its seeds from the position. So a reused draw is the
    one a fresh run would make, and it is reused wherever the same texts reach the same node at
    the same position, also when an edit upstream changed the graph but not those texts (a
    rewritten analysis prompt that yields the same notes, a different first stage that yields
    the same answer). Draw ``i`` of a fan-out does not depend on the number of draws, so a
    growing ensemble keeps the samples it had.
    """

    draw: str
    node: str
    position: int = 0
    own: str = ""

    def key(self, inputs: Mapping[str, Sequence[object]]) -> str:
        """The store key of the node's draws given its inputs' values in a run (slot ->
        JSON-able value per reference, in reference order)."""
        return _digest([DRAW_KEY_VERSION, self.own, self.position, inputs])


def _digest(doc: object) -> str:
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def upstream_hashes(graph: Graph) -> dict[str, UpstreamHash]:
    """Node id -> the hashes of its upstream subgraph (see :class:`UpstreamHash`).

    Merkle-style: a node's hash covers the task type, its operator, its parameters with defaults
    explicit and the instruction as text, and the ``node`` hashes of its inputs in slot and
    reference order. Structurally identical nodes (same inputs, same everything: twins, such as
    two equal generators feeding one ensemble) are numbered in canonical order and the number is
    hashed in, so twins stay independent samples rather than one sample read twice, as in the
    canonical form.
    """
    hashes: dict[str, UpstreamHash] = {}
    seen: Counter[str] = Counter()
    for position, node in enumerate(canonical_order(graph)):
        fan_out = OPS[node.op].fan_out
        params = node.param_dict(defaults=True)
        count = params.pop(fan_out) if fan_out is not None else None
        if "instruction" in params:
            name = params["instruction"]
            params["instruction"] = None if name is None else graph.prompts[name]
        inputs = {
            slot: [PROBLEM if r == PROBLEM else hashes[r].node for r in refs]
            for slot, refs in node.inputs.items()
        }
        own = {
            "version": [HASH_VERSION, UPSTREAM_VERSION],
            "task_type": graph.task_type,
            "op": node.op,
            "params": params,
        }
        base = _digest({**own, "inputs": inputs})
        twin = seen[base]
        seen[base] += 1
        draw = _digest([base, twin])
        hashes[node.id] = UpstreamHash(
            draw, draw if count is None else _digest([draw, count]), position, _digest(own)
        )
    return hashes
