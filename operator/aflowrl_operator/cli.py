"""``aflowrl-operator`` (also ``python -m aflowrl_operator``): run the TrainingRun operator.

The chart's Deployment runs this command. It watches TrainingRuns (and their children) in every
namespace (default) or in the ``--namespace``\\ s given, and serves kopf's liveness probe on
``/healthz`` and the operator's Prometheus metrics on ``/metrics``. Alone it runs standalone;
with ``--peering NAME`` several replicas coordinate through kopf's peering objects (the chart
creates them): the replica with the highest ``--priority`` works, the others stand by. With
``--leader-election`` the replicas elect one leader with a ``coordination.k8s.io/v1`` Lease
(``--lease-name`` in ``--lease-namespace``), held under the pod's name (``AFLOWRL_POD_NAME``,
from the downward API): only the leader writes (:mod:`aflowrl_operator.leader`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import logging
import socket
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from aflowrl import __version__
from aflowrl.config import ImageDefaults

if TYPE_CHECKING:
    from aflowrl_operator.handlers import OperatorConfig

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
        "--leader-election",
        action="store_true",
        help="only the holder of a coordination.k8s.io Lease works; the others watch and take "
        "over when it stops renewing",
    )
    parser.add_argument(
        "--lease-name", default="aflow-rl-operator", help="the Lease's name (--leader-election)"
    )
    parser.add_argument(
        "--lease-namespace",
        default="default",
        help="the Lease's namespace (--leader-election; the chart: its release namespace)",
    )
    parser.add_argument(
        "--lease-duration",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="seconds a silent leader keeps the Lease (default 15; it renews every 2 s and "
        "stops working after two thirds of this without a renewal)",
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
    images = parser.add_argument_group(
        "images of runs",
        "what a TrainingRun that leaves spec.images.<kind> unset runs: "
        "<registry>/aflow-rl-<kind>:<tag>, or the image given in full",
    )
    images.add_argument(
        "--run-image-registry",
        default=ImageDefaults.registry,
        metavar="REGISTRY",
        help=f"registry and path of the run images (default {ImageDefaults.registry})",
    )
    images.add_argument(
        "--run-image-tag",
        default=ImageDefaults.tag,
        metavar="TAG",
        help=f"tag of the run images (default {ImageDefaults.tag})",
    )
    for kind, what in (
        ("env", "environment and trainer pods"),
        ("gpu", "rollout and learner pods with GPUs"),
        ("cpu", "rollout and learner pods without GPUs"),
    ):
        images.add_argument(
            f"--run-{kind}-image", metavar="IMAGE", help=f"image of {what}, in full"
        )
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


def operator_config(args: argparse.Namespace) -> OperatorConfig:
    """The operator's settings from its parsed command line (the one place they are read)."""
    from aflowrl import envs
    from aflowrl_operator import leader
    from aflowrl_operator.handlers import OperatorConfig

    images = ImageDefaults(
        registry=args.run_image_registry,
        tag=args.run_image_tag,
        env=args.run_env_image,
        gpu=args.run_gpu_image,
        cpu=args.run_cpu_image,
    )
    lease = None
    if args.leader_election:
        lease = leader.LeaseConfig(
            name=args.lease_name,
            namespace=args.lease_namespace,
            duration_s=args.lease_duration,
            renew_deadline_s=args.lease_duration * 2 / 3,
            retry_s=min(2.0, args.lease_duration / 5),
        )
    config = OperatorConfig(
        resync_interval_s=args.resync_interval,
        run_images=images,
        lease=lease,
        manage_runs_without_queue_name=args.manage_runs_without_queue_name,
    )
    if lease is not None:
        config = dataclasses.replace(config, identity=envs.AFLOWRL_POD_NAME)
    return config


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

    from aflowrl_operator.handlers import build_registry

    kopf.configure(
        verbose=args.verbose,
        log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.FULL,
    )
    if args.leader_election and args.lease_duration < 3:
        print("aflowrl-operator: error: --lease-duration must be at least 3", file=sys.stderr)
        return 2
    config = operator_config(args)
    if config.lease is not None:
        logger.info("leader election with Lease %s/%s", config.lease.namespace, config.lease.name)
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
