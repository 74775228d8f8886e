"""``aflowrl serve SERVICE``: run one gRPC service of a run (what the pods exec).

``--spec`` defaults to ``$AFLOWRL_SPEC_FILE`` (the run's mounted ConfigMap), else the embedded
default spec; ports default to the spec's. The spec is validated before anything heavy is
imported, so a bad spec fails at once with the field named. Learner ranks are started by torchrun
(CONTRACTS.md); rank 0 serves gRPC, the others follow it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("service", choices=sorted(SERVICES), help="which service to run")
    parser.add_argument(
        "--spec",
        help="RunSpec file (bare spec or TrainingRun); default $AFLOWRL_SPEC_FILE, else the "
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

    spec = load_spec(args.spec or envs.AFLOWRL_SPEC_FILE, flag="--spec")
    fmt = "json" if "json" in (envs.AFLOWRL_LOG_FORMAT, spec.monitoring.log_format) else "text"
    setup_logging(spec.monitoring.log_level, fmt, component=args.service)
    section, key = _DEFAULT_PORTS[args.service]
    port = args.port if args.port is not None else getattr(getattr(spec, section), key)
    metrics_port = (
        args.metrics_port if args.metrics_port is not None else spec.monitoring.metrics_port
    )
    module = importlib.import_module(SERVICES[args.service])
    try:
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
