"""Wiring a trainer to running services: clients, run directory, progress, status, metrics.

:func:`connect` builds the service clients from gRPC targets (an environment target may name
several replicas: a headless Service or ``ipv4:a:p,b:p``), :func:`wait_for_services` waits
until every replica is SERVING (pods start in any order), and :func:`train` runs the loop and
closes everything. Called by ``aflowrl train`` in both modes: against a cluster's services
(:mod:`aflowrl.cli.train`) and against local children (:mod:`aflowrl.local.run`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

from aflowrl.common.client import ChannelOptions, make_channel, target_host, wait_until_serving
from aflowrl.common.metrics import MetricsHttpServer
from aflowrl.common.run_status import RunStatusReporter
from aflowrl.config import RunSpec
from aflowrl.errors import DeadlineExceededError, PermanentError
from aflowrl.trainer.acting import Actor
from aflowrl.trainer.clients import EnvironmentClient, LearnerClient, RolloutClient, replica_targets
from aflowrl.trainer.loop import RunResult, Services, Trainer
from aflowrl.trainer.metrics import TrainerMetrics
from aflowrl.trainer.progress import Progress
from aflowrl.trainer.records import RunDirectory, utc_now
from aflowrl.trainer.weight_sync import make_weight_sync

logger = logging.getLogger(__name__)


def _target(addresses: str | Sequence[str]) -> str | list[str]:
    return addresses if isinstance(addresses, str) else list(addresses)


def _addresses(target: str | Sequence[str]) -> list[str]:
    return replica_targets(target) if isinstance(target, str) else list(target)


def channel_options(spec: RunSpec, timeout_s: float) -> ChannelOptions:
    """Channel options of the run (message size, TLS, auth token from the mounted Secrets)."""
    return ChannelOptions.from_spec(spec.grpc, timeout_s=timeout_s)


def _host(target: str | Sequence[str]) -> str | None:
    return target_host(target) if isinstance(target, str) else None


def connect(
    spec: RunSpec,
    *,
    env: str | Sequence[str],
    rollout: str | Sequence[str],
    learner: str,
) -> Services:
    """Clients of the three services (no call is made)."""
    rollouts = _addresses(rollout)
    return Services(
        env=EnvironmentClient(
            _target(env),
            # The channel's deadline caps every call's own: it must let the longest (Reset,
            # Step, Evaluate: trainer.stepTimeoutS) run; the short calls set their own.
            options=channel_options(spec, spec.trainer.step_timeout_s),
            step_timeout_s=spec.trainer.step_timeout_s,
            # Half a replica's call limit: the rest is left to its other clients (health checks,
            # an `aflowrl optimize` beside the run).
            max_in_flight=max(1, spec.grpc.max_concurrent_rpcs // 2),
        ),
        rollout=RolloutClient(_target(rollout), options=channel_options(spec, 1800.0)),
        learner=LearnerClient(learner, options=channel_options(spec, 3600.0)),
        weights=make_weight_sync(
            spec,
            learner,
            rollouts,
            options=channel_options(spec, 3600.0),
            rollout_server_name=_host(rollout),
        ),
    )


async def wait_for_services(
    spec: RunSpec,
    *,
    env: str | Sequence[str],
    rollout: str | Sequence[str],
    learner: str,
    timeout_s: float = 900.0,
    learner_needed: bool = True,
) -> None:
    """Wait until every replica of every service is SERVING; the error names the flag."""
    checks = [("--env", a, _host(env)) for a in _addresses(env)]
    checks += [("--rollout", a, _host(rollout)) for a in _addresses(rollout)]
    if learner_needed:
        checks.append(("--learner", learner, None))
    options = channel_options(spec, 10.0)

    async def one(flag: str, address: str, server_name: str | None) -> None:
        channel = make_channel(address, options, server_name=server_name)
        try:
            await wait_until_serving(channel, timeout_s=timeout_s, tls=options.tls)
        except DeadlineExceededError as exc:
            raise DeadlineExceededError(f"{flag} {address}: {exc}") from None
        except PermanentError as exc:
            raise PermanentError(f"{flag} {address}: {exc}") from None
        finally:
            await channel.close()

    await asyncio.gather(*(one(*check) for check in checks))


async def train(
    spec: RunSpec,
    services: Services,
    run_dir: Path,
    *,
    progress: Progress | None = None,
    metrics_port: int | None = None,
    actor: Actor | None = None,
    train_policy: bool = True,
    metrics: TrainerMetrics | None = None,
) -> RunResult:
    """Run the trainer until done; services are closed on every path.

    ``metrics``: the trainer's Prometheus metrics (default: new ones, served on
    ``metrics_port`` while the run lasts); pass your own to serve them longer yourself.
    """
    metrics = metrics if metrics is not None else TrainerMetrics()
    reporter = RunStatusReporter.from_environment()
    trainer = Trainer(
        spec,
        services,
        RunDirectory(run_dir),
        progress=progress,
        reporter=reporter,
        metrics=metrics,
        actor=actor,
        train=train_policy,
    )
    server = MetricsHttpServer(metrics.registry, metrics_port) if metrics_port is not None else None
    try:
        if server is not None:
            await server.__aenter__()
        if reporter is not None:
            await reporter.areport(start_time=utc_now())
        return await trainer.run()
    finally:
        if server is not None:
            await server.__aexit__(None, None, None)
        await services.close()
