"""Rebuilding the workflows an episode reached from the seed, the anchors and the actions."""

from __future__ import annotations

import logging

from aflowrl.search import admissible_actions
from aflowrl.trainer.workflows import WorkflowBook
from aflowrl.workflow import library


def test_children_are_replayed_and_checked_against_the_reported_hash(caplog):
    seed = library.load("seed", "code")
    book = WorkflowBook(seed)
    first = admissible_actions(seed, 9)[0]
    child = book.replay(seed.content_hash, first.text, first.child.content_hash)
    assert child is not None and child.content_hash == first.child.content_hash
    grandchild_action = admissible_actions(child, 9)[1]
    grandchild = book.replay(
        child.content_hash, grandchild_action.text, grandchild_action.child.content_hash
    )
    assert grandchild == grandchild_action.child
    assert book.get(grandchild.content_hash) is grandchild
    # An unknown parent, or a hash the replay does not reproduce: kept by hash only.
    assert book.replay("0" * 64, first.text, "1" * 64) is None
    with caplog.at_level(logging.WARNING):
        assert book.replay(seed.content_hash, first.text, "2" * 64) is None
        assert book.replay(seed.content_hash, "remove nothing-here", "3" * 64) is None
    assert "kept by its hash only" in caplog.text
