"""The whole system as local processes: what ``aflowrl train`` runs without service targets.

:func:`local_services` starts, each on a free loopback port with its log in ``<run dir>/logs``:

- ``environment.replicas.min`` environment replicas (``aflowrl serve env``; the executor runs in
  process when it is the surrogate, the default);
- ``rollout.replicas`` rollout replicas (``aflowrl serve rollout``, ``rollout.engine``);
- the learner (``aflowrl serve learner``; under torchrun when it has several ranks),

all from the run's resolved spec file, waits until every one is SERVING, and yields their
targets (gRPC, and the ``/metrics`` endpoint of each, what a PodMonitor would scrape in a
cluster). The launcher's health checks are clients like the trainer: with TLS on
(``AFLOWRL_TLS_DIR``) they verify the children's certificates (and present one with
``grpc.mtls``). On leaving (success, error, Ctrl-C, SIGTERM) every child is stopped
(:mod:`aflowrl.local.processes`). Paths of the spec that point at a cluster volume
(``trainer.checkpointDir`` and the filesystem weight transport's path under it, by default
``/checkpoints``) are moved into the run directory by :func:`local_spec`.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from aflowrl.common.client import ChannelOptions
from aflowrl.config import FilesystemTransportSpec, RunSpec, TrainerSpec
from aflowrl.local.processes import ProcessGroup, free_ports

logger = logging.getLogger(__name__)

DEFAULT_CHECKPOINT_DIR = TrainerSpec().checkpoint_dir


@dataclass(frozen=True)
class LocalTargets:
    """Where the local services listen."""

    env: list[str]
    rollout: list[str]
    learner: str
    metrics: dict[str, str]
    """``host:port`` of each child's ``/metrics``, by child name (``env-0``, ``learner``...)."""


def local_spec(spec: RunSpec, run_dir: Path) -> RunSpec:
    """``spec`` with its cluster-volume paths moved into ``run_dir`` (module docstring)."""
    run_dir = run_dir.resolve()
    old_root = spec.trainer.checkpoint_dir.rstrip("/")
    if spec.trainer.checkpoint_dir != DEFAULT_CHECKPOINT_DIR:
        return spec
    doc = spec.to_document()
    doc["trainer"]["checkpointDir"] = str(run_dir)
    transport = spec.weight_transport
    if isinstance(transport, FilesystemTransportSpec) and (
        transport.path == old_root or transport.path.startswith(old_root + "/")
    ):
        doc["weightTransport"]["path"] = str(run_dir) + transport.path[len(old_root) :]
    return RunSpec.from_document(doc)


def torchrun(ranks: int, rendezvous: str, run_id: str, args: list[str]) -> list[str]:
    """``python -m torch.distributed.run`` of ``ranks`` local ranks running ``python ARGS``."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(ranks),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        rendezvous,
        "--rdzv-id",
        run_id,
        *args,
    ]


def service_commands(
    spec: RunSpec, spec_file: Path, ports: dict[str, int], metrics_ports: dict[str, int]
) -> dict[str, list[str]]:
    """The command line of every child, by name (``env-0``..., ``rollout-0``..., ``learner``).

    Each child gets its gRPC and metrics port; the plaintext health port that TLS adds for
    kubelet probes is left to the system (no kubelet probes a local run).
    """

    def serve(service: str, name: str) -> list[str]:
        return [
            "-m",
            "aflowrl",
            "serve",
            service,
            "-f",
            str(spec_file),
            "--host",
            "127.0.0.1",
            "--port",
            str(ports[name]),
            "--metrics-port",
            str(metrics_ports[name]),
            "--health-port",
            "0",
        ]

    commands: dict[str, list[str]] = {}
    ranks = spec.learner.world_size
    learner = serve("learner", "learner")
    if ranks > 1:
        endpoint = f"127.0.0.1:{ports['rendezvous']}"
        commands["learner"] = torchrun(ranks, endpoint, "aflowrl-local", learner)
    else:
        commands["learner"] = [sys.executable, *learner]
    for name in ports:
        if name.startswith(("env-", "rollout-")):
            service = "env" if name.startswith("env-") else "rollout"
            commands[name] = [sys.executable, *serve(service, name)]
    return commands


@contextlib.asynccontextmanager
async def local_services(
    spec: RunSpec,
    run_dir: Path,
    *,
    startup_timeout_s: float = 600.0,
    threads_per_service: int = 1,
) -> AsyncIterator[tuple[LocalTargets, ProcessGroup]]:
    """Start the services of ``spec`` (already :func:`local_spec`-resolved) as children."""
    spec_file = run_dir / "spec.yaml"
    if not spec_file.is_file():
        from aflowrl.trainer.records import RunDirectory

        RunDirectory(run_dir).write_spec(spec)
    services = [f"env-{i}" for i in range(spec.environment.replicas.min)]
    services += [f"rollout-{i}" for i in range(spec.rollout.replicas)]
    services += ["learner"]
    names = [*services, "rendezvous", *(f"{name}/metrics" for name in services)]
    free = dict(zip(names, free_ports(len(names)), strict=True))
    ports = {name: free[name] for name in [*services, "rendezvous"]}
    metrics_ports = {name: free[f"{name}/metrics"] for name in services}
    commands = service_commands(spec, spec_file, ports, metrics_ports)
    # A few processes share the cores of one machine: one BLAS/OpenMP thread each unless the
    # user chose otherwise.
    thread_env = {"OMP_NUM_THREADS": str(threads_per_service)}
    from aflowrl import envs

    if "OMP_NUM_THREADS" in envs.child_environment():
        thread_env = {}
    grace = spec.grpc.shutdown_grace_s + 5.0
    health_checks = ChannelOptions.from_spec(spec.grpc, timeout_s=10.0)
    with ProcessGroup(run_dir / "logs", grace_s=grace, channel_options=health_checks) as group:
        # Learner and rollout first: they load torch, the slowest start.
        for name in ["learner", *(n for n in commands if n != "learner")]:
            group.start(name, commands[name], ports[name], env=thread_env)
        await group.wait_serving(startup_timeout_s)
        targets = LocalTargets(
            env=[c.target for c in group.children if c.name.startswith("env-")],
            rollout=[c.target for c in group.children if c.name.startswith("rollout-")],
            learner=next(c.target for c in group.children if c.name == "learner"),
            metrics={name: f"127.0.0.1:{port}" for name, port in metrics_ports.items()},
        )
        yield targets, group
