"""``aflowrl-operator`` (also ``python -m aflowrl_operator``): run the TrainingRun operator.

The chart's Deployment runs this command. It watches TrainingRuns (and their children) in every
namespace (default) or in the ``--namespace``\\ s given, and serves kopf's liveness probe on
``/healthz`` and the operator's Prometheus metrics on ``/metrics``. Alone it runs standalone;
with ``--peering NAME`` several replicas coordinate through kopf's peering objects (the chart
creates them): the replica with the highest ``--priority`` works, the others stand by.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import socket
import sys
from collections.abc import Sequence
from typing import Any

from aflowrl import __version__

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aflowrl-operator",
        description="Kubernetes operator reconciling aflow-rl TrainingRun resources.",
    )
    parser.add_argument("--version", action="version", version=f"aflow-rl {__version__}")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch TrainingRuns in this namespace (repeatable; globs like 'team-*' work)",
    )
    scope.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="watch every namespace (the default when no --namespace is given)",
    )
    parser.add_argument(
        "--resync-interval",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="seconds between two passes over a run when nothing changes (default 120; "
        "children are watched, so their changes are handled at once)",
    )
    parser.add_argument(
        "--peering",
        metavar="NAME",
        help="coordinate with other replicas through kopf's peering object NAME "
        "(ClusterKopfPeering cluster-wide, KopfPeering per namespace); default: standalone",
    )
    parser.add_argument(
        "--priority",
        type=int,
        default=None,
        help="peering priority (the highest works); default: derived from the host name, so "
        "replicas differ",
    )
    parser.add_argument(
        "--liveness-port", type=int, default=8080, help="port of /healthz (0 disables it)"
    )
    parser.add_argument(
        "--metrics-port", type=int, default=9090, help="port of /metrics (0 disables it)"
    )
    parser.add_argument(
        "--log-format", choices=["text", "json"], default="text", help="log line format"
    )
    parser.add_argument(
        "--manage-runs-without-queue-name",
        action="store_true",
        help="as Kueue's manageJobsWithoutQueueName: hold a run that names no LocalQueue "
        "(kueue.x-k8s.io/queue-name) until it names one, instead of running it outside Kueue",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    tasks = parser.add_mutually_exclusive_group()
    tasks.add_argument(
        "--install-crd",
        action="store_true",
        help="server-side apply the TrainingRun CRD this operator was built with, wait until it "
        "is established, and exit (the chart's pre-upgrade hook: `helm upgrade` never updates "
        "crds/)",
    )
    tasks.add_argument(
        "--check",
        metavar="NAMESPACE/DEPLOYMENT",
        help="check that the TrainingRun CRD is established and serves this operator's schema "
        "and that the operator Deployment has a ready pod, then exit (the chart's `helm test`)",
    )
    return parser


def _host_priority() -> int:
    """A peering priority from the pod's name: replicas differ, and a restart keeps its own."""
    digest = hashlib.sha256(socket.gethostname().encode()).digest()
    return int.from_bytes(digest[:4], "big") % 1_000_000


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``aflowrl-operator`` console script."""
    args = build_parser().parse_args(argv)
    if args.resync_interval <= 0:
        print("aflowrl-operator: error: --resync-interval must be positive", file=sys.stderr)
        return 2

    if args.install_crd or args.check:
        from aflowrl_operator import install

        task = install.install_crd() if args.install_crd else install.check(args.check)
        ok, message = asyncio.run(task)
        print(f"aflowrl-operator: {message}", file=sys.stdout if ok else sys.stderr)
        return 0 if ok else 1

    import kopf
    import prometheus_client

    from aflowrl_operator.handlers import OperatorConfig, build_registry

    kopf.configure(
        verbose=args.verbose,
        log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.FULL,
    )
    config = OperatorConfig(
        resync_interval_s=args.resync_interval,
        manage_runs_without_queue_name=args.manage_runs_without_queue_name,
    )
    if args.metrics_port:
        prometheus_client.start_http_server(args.metrics_port, registry=config.metrics.registry)
    liveness = f"http://0.0.0.0:{args.liveness_port}/healthz" if args.liveness_port else None
    logger.info(
        "aflow-rl operator %s watching %s",
        __version__,
        ", ".join(args.namespace) if args.namespace else "all namespaces",
    )
    peering: dict[str, Any] = {"standalone": True}
    if args.peering:
        priority = args.priority if args.priority is not None else _host_priority()
        peering = {"standalone": False, "peering_name": args.peering, "priority": priority}
        logger.info("peering %s with priority %d", args.peering, priority)
    identity: Any = config.identity  # kopf's Identity is a NewType of str it does not export
    kopf.run(
        registry=build_registry(config),
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=liveness,
        identity=identity,
        **peering,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
