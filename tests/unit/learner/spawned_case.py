"""Running one learner case in a fresh spawned process, for the learner tests in this folder.

A learner joins a one-rank process group, which belongs to its process and must not outlive
the case; each case therefore runs in a process of its own and hands back a dict of what it
saw (or its traceback, which fails the test).
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable
from typing import Any

import pytest


def in_fresh_process(case: Callable[..., dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    """``case(**kwargs)`` in a fresh spawned process (``case`` a module-level function, so
    the child can import it); its result, or the test fails with the child's traceback."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_run, args=(queue, case, kwargs))
    process.start()
    try:
        ok, result = queue.get(timeout=240)
    finally:
        process.join(timeout=60)
        if process.is_alive():
            process.kill()
    if not ok:
        pytest.fail(f"the learner case failed:\n{result}")
    return result


def _run(queue: Any, case: Callable[..., dict[str, Any]], kwargs: dict[str, Any]) -> None:
    try:
        queue.put((True, case(**kwargs)))
    except BaseException:  # the parent reports it
        queue.put((False, traceback.format_exc()))
