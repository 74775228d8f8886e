"""A whole training run on this machine: local services plus the trainer.

Used by ``aflowrl train`` without service targets, by the end-to-end tests and by the benches.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from aflowrl.config import RunSpec
from aflowrl.local.launcher import LocalTargets, local_services
from aflowrl.local.processes import ProcessGroup
from aflowrl.trainer import app
from aflowrl.trainer.acting import Actor
from aflowrl.trainer.loop import RunResult
from aflowrl.trainer.progress import Progress

logger = logging.getLogger(__name__)


async def run_local(
    spec: RunSpec,
    run_dir: Path,
    *,
    progress: Progress | None = None,
    startup_timeout_s: float = 600.0,
    on_started: Callable[[LocalTargets, ProcessGroup], None] | None = None,
    actor: Actor | None = None,
    train_policy: bool = True,
    metrics_port: int | None = None,
) -> RunResult:
    """Start the services of ``spec`` (resolved with ``local_spec``), train, stop them.

    ``metrics_port``: serve the trainer's ``/metrics`` there (0: a free port); None: not served.
    """
    async with local_services(spec, run_dir, startup_timeout_s=startup_timeout_s) as started:
        targets, group = started
        if on_started is not None:
            on_started(targets, group)
        services = app.connect(
            spec, env=targets.env, rollout=targets.rollout, learner=targets.learner
        )
        result = await app.train(
            spec,
            services,
            run_dir,
            progress=progress,
            actor=actor,
            train_policy=train_policy,
            metrics_port=metrics_port,
        )
    return result
