"""Replicas larger than a node: LeaderWorkerSet children (pure builders).

A rollout replica with ``rollout.nodesPerReplica`` above 1, a served executor with
``serve.nodesPerReplica`` above 1, and a learner of several nodes are each run as
LeaderWorkerSets (``leaderworkerset.x-k8s.io/v1``, the kubernetes-sigs/lws controller): a group
of ``size`` pods, created together, with ``RecreateGroupOnPodRestart`` so that the failure of
any pod of a group deletes and recreates the whole group (an engine or a torchrun job cannot
lose one node and go on). The LWS controller injects ``LWS_LEADER_ADDRESS``, ``LWS_GROUP_SIZE``
and ``LWS_WORKER_INDEX`` first in every container's environment, so the ``AFLOWRL_GROUP_*``
variables below refer to them (``$(VAR)`` expansion).

Each multi-node rollout or executor replica is a LeaderWorkerSet of its own,
``<run>-rollout-<i>`` / ``<run>-executor-<i>`` for ``i`` in ``0 .. replicas - 1``, holding one
group (``replicas: 1``; 0 while the run is suspended, held by Kueue or finished, like the
Deployments), labelled with the run, the component and
:data:`~aflowrl_operator.names.REPLICA_LABEL`. Scaling the replica count creates or deletes
whole objects (the reconciler deletes the run's own labelled ones beyond the count:
:attr:`aflowrl_operator.children.Desired.pruned`); a replica's leader keeps its name
``<run>-rollout-<i>-0`` (and its DNS name ``<run>-rollout-<i>-0.<run>-rollout-<i>``, the
subdomain Service the LWS controller makes) across the recreation of its group. A new pod
template reaches the replicas one at a time, as a Deployment's ``maxUnavailable: 1`` would:
:func:`held_back` keeps the others' templates while one replica is being replaced. No name can
collide with another child's: other children of a run end in a word, these in a number.

- rollout: the leader (worker index 0) runs ``aflowrl serve rollout`` with gRPC health probes;
  its vLLM engine spans the group, with vLLM's ``mp`` executor (the leader is the
  torch.distributed master on :data:`GROUP_PORT`, the other pods run ``aflowrl serve
  rollout-worker``, which execs vLLM headless with ``--node-rank``) or with ``ray`` (a Ray head
  started by the leader's process on :data:`GROUP_PORT`, the other pods ``ray start --address
  --block``). The ``<run>-rollout`` Service selects the leaders of every replica only, so the
  trainer's client balances over replicas, not pods, and a group is ready when its leader is
  (the workers have no readiness of their own).
- served executor: the same with vLLM's own server image: the leader ``python3 -m
  vllm.entrypoints.openai.api_server`` with ``--nnodes``/``--node-rank 0``/``--master-addr``,
  the workers ``python3 -m vllm.entrypoints.cli.main serve --headless`` (mp), or ``ray start``
  on every pod and the server with ``--distributed-executor-backend ray``.
- learner (``<run>-learner``): one LeaderWorkerSet of one group of ``learner.nodes`` pods
  running the torchrun command of CONTRACTS.md; the leader pod ``<run>-learner-0`` (which c10d
  sorts first, so it gets rank 0) hosts the rendezvous and serves gRPC, probed; every pod joins
  the same headless Service ``<run>-learner``, which the LWS controller reuses as the group's
  subdomain.

Without the LeaderWorkerSet API the rollout and executor groups are not built and the run is
``Degraded`` with reason ``MultiNodeUnavailable``; the learner falls back to its StatefulSet
(:func:`aflowrl_operator.workloads.learner`), which runs but does not restart as a group.
Called by :mod:`aflowrl_operator.children`.
"""

from __future__ import annotations

import copy
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from aflowrl.config import RunSpec, multi_node_replicas, served_executor
from aflowrl_operator import pods
from aflowrl_operator.names import (
    COMPONENT_LABEL,
    REPLICA_LABEL,
    TEMPLATE_HASH,
    RunRef,
    annotation,
    digest,
)
from aflowrl_operator.workloads import (
    VLLM_SERVER,
    component_service,
    executor_args,
    executor_service,
    executor_template,
    learner_service,
    learner_template,
    rollout_env,
    rollout_volumes,
)

JsonDict = dict[str, Any]

EXCLUSIVE_TOPOLOGY = "leaderworkerset.sigs.k8s.io/exclusive-topology"
"""LeaderWorkerSet annotation: the node label of the topology domain each group takes whole
(LWS's webhook turns it into pod affinity within a group and anti-affinity across groups)."""
LWS_API = "leaderworkerset.x-k8s.io/v1"
"""API group version of LeaderWorkerSet."""
KIND = "LeaderWorkerSet"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
"""Label the LWS controller puts on every pod of a group: "0" on the leader."""
LEADERS = {WORKER_INDEX_LABEL: "0"}
"""Selector of group leaders."""
RESTART_POLICY = "RecreateGroupOnPodRestart"
"""Any pod's failure (a container restart or a deleted pod) recreates its whole group."""
GROUP_PORT = 29610
"""Port on the leader where a group's engine meets: vLLM's torch.distributed master (``mp``) or
the Ray head's GCS (``ray``); not 29600, the nccl weight transport's default port."""
UNAVAILABLE = "MultiNodeUnavailable"
"""Condition reason of a run that needs LeaderWorkerSets on a cluster without the API."""


def replica_group_name(run: RunRef, component: str, index: int) -> str:
    """The LeaderWorkerSet of replica ``index`` of a multi-node component (``rollout`` or
    ``executor``): ``<run>-<component>-<index>``."""
    return run.child(f"{component}-{index}")


def rollout_grouped(spec: RunSpec) -> bool:
    return "rollout" in multi_node_replicas(spec)


def executor_grouped(spec: RunSpec) -> bool:
    return "executor" in multi_node_replicas(spec)


def learner_grouped(spec: RunSpec) -> bool:
    return spec.learner.nodes > 1


def needs_api(spec: RunSpec) -> list[str]:
    """The components that cannot run without the LeaderWorkerSet API (the learner can)."""
    return list(multi_node_replicas(spec))


def unavailable_message(spec: RunSpec) -> str:
    what = " and ".join(
        f"{name} (nodesPerReplica={count})"
        for name, count in (
            ("rollout", spec.rollout.nodes_per_replica),
            ("executor", getattr(served_executor(spec), "nodes_per_replica", 1)),
        )
        if count > 1
    )
    return (
        f"the {what} spans several nodes per replica, which needs the LeaderWorkerSet API "
        f"({LWS_API}); install the LeaderWorkerSet controller (kubernetes-sigs/lws) or set "
        "nodesPerReplica to 1"
    )


def pod_template_of(workload: JsonDict) -> JsonDict | None:
    """The pod template of a Deployment, StatefulSet, Job or LeaderWorkerSet (its leader's: a
    group's pods request the same resources), None for objects without one."""
    spec = workload.get("spec") or {}
    if workload["kind"] == KIND:
        template: JsonDict = spec["leaderWorkerTemplate"]["leaderTemplate"]
        return template
    found: JsonDict | None = spec.get("template") if isinstance(spec, dict) else None
    return found


def group_env(port: int) -> list[JsonDict]:
    """``AFLOWRL_GROUP_*`` of every container of a group (aflowrl.envs reads them)."""
    return [
        {"name": "AFLOWRL_GROUP_LEADER", "value": "$(LWS_LEADER_ADDRESS)"},
        {"name": "AFLOWRL_GROUP_SIZE", "value": "$(LWS_GROUP_SIZE)"},
        {"name": "AFLOWRL_GROUP_RANK", "value": "$(LWS_WORKER_INDEX)"},
        {"name": "AFLOWRL_GROUP_PORT", "value": str(port)},
    ]


def leader_probes(port: int) -> JsonDict:
    """Probes of a worker pod: it can open a connection to its leader's ``port`` (where the
    group meets). Startup allows 30 minutes (the leader loads the model first); after that a
    worker that loses its leader for 2 minutes is restarted, which recreates the group."""
    check = {
        "exec": {
            "command": [
                "python3",
                "-c",
                "import os, socket; socket.create_connection("
                f"(os.environ['AFLOWRL_GROUP_LEADER'], {port}), timeout=5).close()",
            ]
        },
        "timeoutSeconds": 10,
    }
    return {
        "startupProbe": {**check, "periodSeconds": 10, "failureThreshold": 180},
        "readinessProbe": {**check, "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {**check, "periodSeconds": 20, "failureThreshold": 6},
    }


def _role(template: JsonDict, role: str) -> JsonDict:
    template["metadata"]["labels"]["aflowrl.io/group-role"] = role
    return template


def replica_sets(
    run: RunRef, component: str, replicas: int, *, size: int, leader: JsonDict, worker: JsonDict
) -> list[JsonDict]:
    """One run-owned LeaderWorkerSet per replica of ``component`` (``<run>-<component>-<i>``),
    each a group of ``size`` pods from the same leader and worker templates."""
    return [
        leader_worker_set(
            run,
            replica_group_name(run, component, index),
            component,
            size=size,
            leader=leader,
            worker=worker,
            replica=index,
        )
        for index in range(replicas)
    ]


def leader_worker_set(
    run: RunRef,
    name: str,
    component: str,
    *,
    size: int,
    leader: JsonDict,
    worker: JsonDict,
    replica: int | None = None,
) -> JsonDict:
    """A run-owned LeaderWorkerSet of groups of ``size`` pods (``replicas`` is set apart, like
    a Deployment's); ``replica``: the index of the component's replica it is, a label of the
    object and of its pods. Groups start their workers once the leader pod exists
    (``LeaderCreated``: the leader waits for its workers, so waiting for it to be ready would
    deadlock) and are replaced without surging (no spare GPUs are assumed)."""
    leader, worker = copy.deepcopy(leader), copy.deepcopy(worker)
    extra = {REPLICA_LABEL: str(replica)} if replica is not None else {}
    for template in (leader, worker):
        template["metadata"]["labels"].update(extra)
    return {
        "apiVersion": LWS_API,
        "kind": KIND,
        "metadata": run.metadata(name, component, extra_labels=extra),
        "spec": {
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
            },
            "leaderWorkerTemplate": {
                "size": size,
                "restartPolicy": RESTART_POLICY,
                "leaderTemplate": _role(leader, "leader"),
                "workerTemplate": _role(worker, "worker"),
            },
        },
    }


def rollout(
    run: RunRef, spec: RunSpec, *, spec_hash_: str, node_labels: dict[str, str] | None = None
) -> list[JsonDict]:
    """One LeaderWorkerSet per rollout replica + the ``<run>-rollout`` headless Service of
    every replica's leader."""
    ro = spec.rollout
    metrics = spec.monitoring.metrics_port
    volumes, mounts = rollout_volumes(run, spec)
    env = rollout_env(spec) + group_env(GROUP_PORT)

    def template(leader: bool) -> JsonDict:
        if leader:
            command = ["aflowrl", "serve", "rollout", "-f", pods.SPEC_FILE]
            command += ["--host", "0.0.0.0"]
            ports = [("grpc", ro.port), ("metrics", metrics), ("group", GROUP_PORT)]
            probes = pods.grpc_probes(spec, ro.port, ready_service=pods.ROLLOUT_SERVICE)
        else:
            command = ["aflowrl", "serve", "rollout-worker", "-f", pods.SPEC_FILE]
            ports, probes = [], leader_probes(GROUP_PORT)
        main = pods.container(
            spec,
            "rollout",
            spec.images.torch_image(ro.resources.gpus),
            command=command,
            res=ro.resources,
            env=env,
            mounts=mounts,
            ports=ports,
            probes=probes,
        )
        return pods.pod_template(
            run,
            spec,
            "rollout",
            spec_hash=spec_hash_,
            containers=[main],
            volumes=volumes,
            gpu=ro.resources.gpus > 0,
            metrics_port=metrics if leader else None,
            overrides=ro.pod,
            admitted_node_labels=node_labels,
        )

    sets = replica_sets(
        run,
        "rollout",
        ro.replicas,
        size=ro.nodes_per_replica,
        leader=template(True),
        worker=template(False),
    )
    ports: list[tuple[str, int, str | None]] = [
        ("grpc", ro.port, "grpc"),
        ("metrics", metrics, "http"),
    ]
    service = component_service(run, run.rollout, "rollout", ports, headless=True, only=LEADERS)
    return [*sets, service]


def executor(
    run: RunRef, spec: RunSpec, *, spec_hash_: str, node_labels: dict[str, str] | None = None
) -> list[JsonDict]:
    """One LeaderWorkerSet per served executor replica + their ClusterIP Service of leaders."""
    serve = served_executor(spec)
    assert serve is not None
    nodes = serve.nodes_per_replica
    args = executor_args(spec)
    env = group_env(GROUP_PORT)
    if serve.distributed_backend == "ray":
        # Every pod runs a Ray node in its main container (Ray's workers need the GPUs the
        # container holds); the leader's server places the engine's workers on the group. The
        # head is started before the server and the server is exec'd, so either's failure is
        # the container's exit status (no shell left waiting).
        server = shlex.join([*VLLM_SERVER, *args, "--distributed-executor-backend", "ray"])
        leader_cmd = [
            "sh",
            "-c",
            f"ray start --head --port {GROUP_PORT} --disable-usage-stats && exec {server}",
        ]
        worker_cmd = ["ray", "start", "--address", f"$(LWS_LEADER_ADDRESS):{GROUP_PORT}", "--block"]
        env.append({"name": "RAY_ADDRESS", "value": f"$(LWS_LEADER_ADDRESS):{GROUP_PORT}"})
    else:
        multinode = [
            "--distributed-executor-backend",
            "mp",
            "--nnodes",
            str(nodes),
            "--master-addr",
            "$(LWS_LEADER_ADDRESS)",
            "--master-port",
            str(GROUP_PORT),
        ]
        leader_cmd = [*VLLM_SERVER, *args, *multinode, "--node-rank", "0"]
        worker_cmd = [
            "python3",
            "-m",
            "vllm.entrypoints.cli.main",
            "serve",
            *args[1:2],  # the model, positional in the CLI
            *args[2:],
            *multinode,
            "--node-rank",
            "$(LWS_WORKER_INDEX)",
            "--headless",
        ]

    def template(leader: bool) -> JsonDict:
        out = executor_template(
            run,
            spec,
            spec_hash_=spec_hash_,
            node_labels=node_labels,
            command=leader_cmd if leader else worker_cmd,
            probed=leader,
            extra_env=env,
        )
        if not leader:
            out["spec"]["containers"][0].update(leader_probes(GROUP_PORT))
        return out

    sets = replica_sets(
        run, "executor", serve.replicas, size=nodes, leader=template(True), worker=template(False)
    )
    return [*sets, executor_service(run, leaders_only=LEADERS)]


def learner(
    run: RunRef, spec: RunSpec, *, spec_hash_: str, node_labels: dict[str, str] | None = None
) -> list[JsonDict]:
    """The learner as one LeaderWorkerSet group of ``learner.nodes`` pods + its headless
    Service. The leader pod is ``<run>-learner-0`` (rank 0: rendezvous host and gRPC server,
    probed by gRPC health); every other pod is probed on its connection to the leader's
    rendezvous store. A rank that dies ends torchrun on its pod, and that container's restart
    recreates the group: every rank restarts and resumes from the last checkpoint."""
    env = group_env(spec.learner.rendezvous_port)
    leader, ports = learner_template(
        run, spec, spec_hash_=spec_hash_, node_labels=node_labels, probed=True, extra_env=env
    )
    worker, _ = learner_template(
        run, spec, spec_hash_=spec_hash_, node_labels=node_labels, probed=False, extra_env=env
    )
    worker["spec"]["containers"][0].update(leader_probes(spec.learner.rendezvous_port))
    lws = leader_worker_set(
        run, run.learner, "learner", size=spec.learner.nodes, leader=leader, worker=worker
    )
    return [lws, learner_service(run, ports)]


def stamp(group: JsonDict) -> None:
    """Mark a replica LeaderWorkerSet and its pod templates with the hash of its
    ``leaderWorkerTemplate`` (:data:`TEMPLATE_HASH`, placement included), so its pods say
    which template they run (in place)."""
    lwt = group["spec"]["leaderWorkerTemplate"]
    value = digest(lwt)
    for meta in (
        group["metadata"],
        lwt["leaderTemplate"]["metadata"],
        lwt["workerTemplate"]["metadata"],
    ):
        meta.setdefault("annotations", {})[TEMPLATE_HASH] = value


def _template_hash(obj: Mapping[str, Any] | None) -> str | None:
    return annotation(obj, TEMPLATE_HASH)


SERVING, NOT_READY, DOWN = "serving", "not-ready", "down"
"""States of a replica's group (:func:`replica_state`)."""


def _own_pods(
    group: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """The pods of a replica's group that are not being deleted."""
    labels = group["metadata"].get("labels") or {}
    return [
        pod
        for pod in pods
        if not (pod.get("metadata") or {}).get("deletionTimestamp")
        and all(
            ((pod.get("metadata") or {}).get("labels") or {}).get(key) == labels.get(key)
            for key in (COMPONENT_LABEL, REPLICA_LABEL)
        )
    ]


def _running(pod: Mapping[str, Any]) -> bool:
    """Whether a pod runs (phase Running, no container waiting in CrashLoopBackOff)."""
    state = pod.get("status") or {}
    looping = any(
        ((c.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff"
        for c in state.get("containerStatuses") or []
    )
    return state.get("phase") == "Running" and not looping


def replica_state(group: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> str:
    """What a replica's LeaderWorkerSet ``group`` runs, from the run's ``pods``:

    - :data:`SERVING`: every pod of its group ready, on the object's template;
    - :data:`DOWN`: nothing of it runs: the object at 0 replicas, no leader pod, or a leader
      that is not running (Pending, CrashLoopBackOff, failed);
    - :data:`NOT_READY`: its leader runs but the group is not serving (a readiness probe
      failing, a worker missing, pods on another template, an unstamped object).
    """
    if not (group.get("spec") or {}).get("replicas"):
        return DOWN
    own = _own_pods(group, pods)
    leaders = [
        p
        for p in own
        if ((p.get("metadata") or {}).get("labels") or {}).get(WORKER_INDEX_LABEL) == "0"
    ]
    if not any(_running(p) for p in leaders):
        return DOWN
    want = _template_hash(group)
    ready = sum(
        1
        for pod in own
        if want is not None
        and _template_hash(pod) == want
        and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (pod.get("status") or {}).get("conditions") or []
        )
    )
    size = int(((group.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("size") or 1)
    return SERVING if ready >= size else NOT_READY


def held_back(
    sets: Sequence[tuple[JsonDict, int]],
    live: Mapping[str, Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
) -> set[str]:
    """The replica LeaderWorkerSets of one component that keep their live template this pass.

    ``sets``: each replica's manifest (stamped, :func:`stamp`) and desired count, in index
    order; ``live``: the existing ones by name; ``pods``: the run's pods. A new template
    reaches one replica at a time, as a Deployment's ``maxUnavailable: 1`` would:

    - a replica that is :data:`DOWN` (:func:`replica_state`) takes it at once: nothing of it
      runs to be lost (so do new replicas and every replica of a stopped run);
    - otherwise one replica per pass, and only while no replica already on the new template is
      still coming up (the replacement in flight; a new template that never gets ready stops
      the roll there, the others keeping the old one);
    - that one is a :data:`NOT_READY` replica if there is one (it is unavailable already), a
      :data:`SERVING` one only when every other replica serves, so a serving replica is never
      taken down while another is unavailable. Several replicas not ready at once (every
      leader failing its probe under load, say) are replaced one after the other, not together.
    """
    states = {name: replica_state(group, pods) for name, group in live.items()}
    changing: list[str] = []
    in_flight = False
    for manifest, replicas in sets:
        name = manifest["metadata"]["name"]
        current = live.get(name)
        if current is None or replicas == 0:
            continue
        if _template_hash(current) == _template_hash(manifest):
            in_flight |= states[name] != SERVING
        elif states[name] != DOWN:
            changing.append(name)
    held = set(changing)
    if in_flight or not changing:
        return held
    not_ready = [name for name in changing if states[name] == NOT_READY]
    if not_ready:
        held.discard(not_ready[0])
    elif all(state == SERVING for state in states.values()):
        held.discard(changing[0])
    return held


def keep_template(manifest: JsonDict, live: Mapping[str, Any]) -> JsonDict:
    """``manifest`` with the live object's ``leaderWorkerTemplate`` and its hash (a replica
    held back by :func:`held_back`): everything else, its count included, still applies."""
    kept = copy.deepcopy(manifest)
    kept["spec"]["leaderWorkerTemplate"] = copy.deepcopy(live["spec"]["leaderWorkerTemplate"])
    kept["metadata"]["annotations"][TEMPLATE_HASH] = _template_hash(live)
    return kept
