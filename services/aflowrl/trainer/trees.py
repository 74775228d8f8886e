"""The search tree of an episode, recorded compactly for pictures (``trees.jsonl``).

Each iteration the trainer records the tree of its best episode (the highest best score; the
first such): the workflows it evaluated as nodes (a 12-character hash prefix and the validation
score) and its steps as edges from the workflow a step modified to the one it made, labelled
with the action. An invalid action has no child (``child`` is empty); a step into a workflow the
tree already held points at that node (``duplicate``). ``aflowrl plot RUN_DIR --tree`` draws one
(:func:`aflowrl.trainer.plots.tree_png`). Written by :mod:`aflowrl.trainer.loop` through
:meth:`aflowrl.trainer.records.RunDirectory.append_tree`.

A record::

    {"iteration": 3, "episode": "3-1-0", "benchmark": "humaneval", "root": "3f2a...",
     "nodes": {"3f2a...": 0.81, "9c0d...": 0.85},
     "edges": [{"step": 0, "parent": "3f2a...", "child": "9c0d...", "action": "add ...",
                "reward": 0.04, "valid": true, "duplicate": false}]}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aflowrl.errors import InvalidInputError
from aflowrl.trainer.rows import Episode

HASH_CHARS = 12
"""Characters of a workflow hash kept (as the ``best/`` folder names)."""

ACTION_CHARS = 160
"""Characters of an action's text kept."""


def best_episode(episodes: Sequence[Episode]) -> Episode | None:
    """The episode with the highest best score (the first of equals); None for none."""
    best: Episode | None = None
    for episode in episodes:
        if best is None or episode.best_score > best.best_score:
            best = episode
    return best


def episode_tree(episode: Episode, *, iteration: int, root: str) -> dict[str, Any]:
    """The record of one episode's tree (module docstring); ``root``: the seed's hash, used
    when the episode took no step."""
    root = (episode.rows[0].anchor if episode.rows else root)[:HASH_CHARS]
    nodes: dict[str, float] = {root: float(episode.seed_score)}
    edges = []
    for row in episode.rows:
        parent = row.anchor[:HASH_CHARS]
        nodes.setdefault(parent, float(row.parent_score))
        child = row.child_hash[:HASH_CHARS] if row.valid else ""
        if child:
            nodes.setdefault(child, float(row.child_score))
        edges.append(
            {
                "step": row.step,
                "parent": parent,
                "child": child,
                "action": (row.canonical_action or row.decision.action)[:ACTION_CHARS],
                "reward": float(row.reward),
                "valid": bool(row.valid),
                "duplicate": bool(row.duplicate),
            }
        )
    return {
        "iteration": iteration,
        "episode": episode.episode_id,
        "benchmark": episode.benchmark,
        "root": root,
        "nodes": nodes,
        "edges": edges,
    }


def check_tree(tree: Mapping[str, Any], *, source: str) -> None:
    """Raise :class:`InvalidInputError` naming ``source`` unless ``tree`` has the record's shape."""
    nodes, edges = tree.get("nodes"), tree.get("edges")
    if not isinstance(nodes, dict) or not isinstance(edges, list) or "root" not in tree:
        raise InvalidInputError(f"{source}: not a search-tree record (root, nodes, edges)")
    for number, edge in enumerate(edges):
        if not isinstance(edge, dict) or not {"parent", "child", "action"} <= edge.keys():
            raise InvalidInputError(f"{source}: edges[{number}] lacks parent, child or action")
