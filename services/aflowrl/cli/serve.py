"""``aflowrl serve SERVICE``: run one gRPC service of a run (what the pods exec).

``aflowrl serve rollout-worker`` runs a non-leader pod of a multi-node rollout replica (a
LeaderWorkerSet group, :mod:`aflowrl.group`): it serves nothing itself but this node's ranks of
the leader's vLLM engine (``mp``), or a Ray node joining the leader's head (``ray``). On the
leader of a ``ray`` group, ``aflowrl serve rollout`` starts the group's Ray head first.

``-f/--file`` (formerly ``--spec``, still accepted) defaults to ``$AFLOWRL_SPEC_FILE`` (the run's
mounted ConfigMap), else the embedded default spec; ports default to the spec's. The spec is
validated before anything heavy is imported, so a bad spec fails at once with the field named.
Learner ranks are started by torchrun (CONTRACTS.md); rank 0 serves gRPC, the others follow it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aflowrl.config import RunSpec

NAME = "serve"
HELP = (
    "Run a service of a training run: env (the workflow-search environment), rollout "
    "(generation) or learner (training)."
)

SERVICES: dict[str, str] = {
    "env": "aflowrl.envsvc.server",
    "rollout": "aflowrl.rollout.server",
    "learner": "aflowrl.learner.server",
}
"""Service name -> module with ``async serve(spec, *, host, port, metrics_port, health_port)``."""

_DEFAULT_PORTS = {
    "env": ("environment", "port"),
    "rollout": ("rollout", "port"),
    "learner": ("learner", "port"),
}


WORKER = "rollout-worker"
"""The non-leader pods of a multi-node rollout replica."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("service", choices=sorted([*SERVICES, WORKER]), help="which service to run")
    from aflowrl.cli._help import add_file_argument

    add_file_argument(
        parser,
        "RunSpec file (bare spec or TrainingRun); default $AFLOWRL_SPEC_FILE, else the "
        "embedded default",
    )
    parser.add_argument("--host", default="0.0.0.0", help="interface to bind (default 0.0.0.0)")
    parser.add_argument("--port", type=int, help="gRPC port (default: the spec's)")
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="HTTP /metrics port (default: monitoring.metricsPort; 0 picks a free one)",
    )
    parser.add_argument(
        "--health-port",
        type=int,
        help="with TLS on: plaintext port serving only gRPC health, for kubelet probes "
        "(default: grpc.healthPort; 0 picks a free one)",
    )


def run(args: argparse.Namespace) -> int:
    import asyncio

    from aflowrl import envs
    from aflowrl.cli._io import load_spec
    from aflowrl.common.logging import setup_logging
    from aflowrl.errors import FailedPreconditionError

    spec = load_spec(args.spec or envs.AFLOWRL_SPEC_FILE)
    fmt = "json" if "json" in (envs.AFLOWRL_LOG_FORMAT, spec.monitoring.log_format) else "text"
    setup_logging(spec.monitoring.log_level, fmt, component=args.service)
    from aflowrl.common import rdma

    try:
        rdma.check(envs.AFLOWRL_RDMA_DEVICES)
    except FailedPreconditionError as exc:
        print(f"aflowrl serve {args.service}: error: {exc}", file=sys.stderr)
        return 2
    if args.service == WORKER:
        return _run_worker(spec)
    section, key = _DEFAULT_PORTS[args.service]
    port = args.port if args.port is not None else getattr(getattr(spec, section), key)
    metrics_port = (
        args.metrics_port if args.metrics_port is not None else spec.monitoring.metrics_port
    )
    module = importlib.import_module(SERVICES[args.service])
    try:
        with _group_head(spec, args.service):
            asyncio.run(
                module.serve(
                    spec,
                    host=args.host,
                    port=port,
                    metrics_port=metrics_port,
                    health_port=args.health_port,
                )
            )
    except FailedPreconditionError as exc:  # e.g. a weight transport this machine cannot run
        print(f"aflowrl serve {args.service}: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _group_head(spec: RunSpec, service: str) -> contextlib.AbstractContextManager[object]:
    """On the leader of a multi-node ``ray`` rollout replica, the group's Ray head."""
    from aflowrl import group

    topology = group.GroupTopology.from_env() if service == "rollout" else None
    if (
        topology is not None
        and topology.is_leader
        and spec.rollout.nodes_per_replica > 1
        and spec.rollout.vllm.distributed_backend == "ray"
    ):
        return group.ray_head(topology.port)
    return contextlib.nullcontext()


def _run_worker(spec: RunSpec) -> int:
    """A worker pod of a multi-node rollout replica (module docstring)."""
    import os

    from aflowrl import group
    from aflowrl.errors import FailedPreconditionError

    try:
        topology = group.check_worker(spec, group.GroupTopology.from_env())
        command = group.worker_command(spec, topology)
        if command is not None:
            os.execv(command[0], command)  # the Ray node is this pod's process
        from aflowrl.models import loading

        model_dir = loading.resolve_model_path(spec.policy.model)
        group.run_worker(spec, str(model_dir), topology)
    except FailedPreconditionError as exc:
        print(f"aflowrl serve {WORKER}: error: {exc}", file=sys.stderr)
        return 2
    return 0
