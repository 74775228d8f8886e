"""Names, labels and owner references of a TrainingRun's children.

Every child is named ``<run>-<suffix>`` and labelled with the run and its component, so selectors,
the PodMonitor and ``kubectl get all -l aflowrl.io/run=<run>`` find them. The builders in
:mod:`aflowrl_operator.children` and the reconciler in :mod:`aflowrl_operator.reconcile` use
these; the Grafana dashboard groups series by the same labels.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from aflowrl.config import API_GROUP, API_VERSION, KIND
from aflowrl.config.run import MAX_RUN_NAME

RUN_LABEL = "aflowrl.io/run"
"""Label every child of a run carries: the run's name."""
COMPONENT_LABEL = "app.kubernetes.io/component"
"""Label naming the component (rollout, learner, environment, executor, trainer, config)."""
REPLICA_LABEL = "aflowrl.io/replica"
"""Label of a replica's own children and pods (a LeaderWorkerSet per multi-node replica): its
index, 0 to ``replicas - 1``."""
MANAGED_BY = "aflowrl-operator"
"""Value of ``app.kubernetes.io/managed-by`` on every child."""

SPEC_HASH = "aflowrl.io/spec-hash"
"""Pod-template annotation: hash of the spec the pods were started from (changes roll them)."""
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
"""Label joining a pod to a coscheduling PodGroup (scheduler-plugins)."""
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""Label of a TrainingRun naming the Kueue LocalQueue the run is admitted through."""
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
"""Label of a TrainingRun naming its Kueue WorkloadPriorityClass."""
PODSETS_HASH = "aflowrl.io/podsets-hash"
"""Kueue Workload annotation: hash of its pod sets' counts and requests (a change replaces it)."""
TEMPLATE_HASH = "aflowrl.io/template-hash"
"""Annotation of the trainer Job and of each replica LeaderWorkerSet (and its pods): hash of the
pod template(s) the object was last given."""

__all__ = ["MAX_RUN_NAME"]  # re-exported: the config owns the rule, the CRD enforces it


@dataclasses.dataclass(frozen=True)
class RunRef:
    """The identity of one TrainingRun: what every child's name, labels and owner derive from."""

    name: str
    namespace: str
    uid: str

    def child(self, suffix: str) -> str:
        """Name of the child ``<run>-<suffix>``."""
        return f"{self.name}-{suffix}"

    @property
    def config_map(self) -> str:
        return self.child("spec")

    @property
    def rollout(self) -> str:
        return self.child("rollout")

    @property
    def learner(self) -> str:
        return self.child("learner")

    @property
    def environment(self) -> str:
        return self.child("env")

    @property
    def executor(self) -> str:
        return self.child("executor")

    @property
    def trainer(self) -> str:
        return self.child("trainer")

    @property
    def checkpoints(self) -> str:
        return self.child("checkpoints")

    @property
    def pod_group(self) -> str:
        """The coscheduling PodGroup of the GPU pods (and the Kueue Workload's name)."""
        return self.child("gpu")

    @property
    def workload(self) -> str:
        """The Kueue Workload of the run."""
        return self.child("kueue")

    @property
    def env_egress(self) -> str:
        return self.child("env-egress")

    @property
    def ingress(self) -> str:
        """The run's ingress NetworkPolicy (``networkPolicy.enabled``)."""
        return self.child("ingress")

    @property
    def egress(self) -> str:
        """The run's egress NetworkPolicy (``networkPolicy.namespaceDeniesEgress``)."""
        return self.child("egress")

    def selector(self, component: str) -> dict[str, str]:
        """Labels selecting one component's pods (immutable selectors: keep them this small)."""
        return {RUN_LABEL: self.name, COMPONENT_LABEL: component}

    def labels(self, component: str) -> dict[str, str]:
        """Labels of a child (and of its pods)."""
        return {
            "app.kubernetes.io/name": "aflow-rl",
            "app.kubernetes.io/instance": self.name,
            "app.kubernetes.io/part-of": "aflow-rl",
            "app.kubernetes.io/managed-by": MANAGED_BY,
            **self.selector(component),
        }

    def owner_reference(self) -> dict[str, Any]:
        """The controller owner reference: children are garbage-collected with the run."""
        return {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def metadata(
        self, name: str, component: str, *, extra_labels: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """``metadata`` of a namespaced child owned by the run."""
        return {
            "name": name,
            "namespace": self.namespace,
            "labels": {**self.labels(component), **(extra_labels or {})},
            "ownerReferences": [self.owner_reference()],
        }

    def grpc_target(self, service: str, port: int) -> str:
        """A gRPC target resolving every pod behind a headless Service (client-side balancing)."""
        return f"dns:///{service}.{self.namespace}.svc:{port}"

    def learner_host(self, ordinal: int = 0) -> str:
        """Stable DNS name of one learner pod (through the headless Service)."""
        return f"{self.learner}-{ordinal}.{self.learner}.{self.namespace}.svc"


def annotation(obj: Mapping[str, Any] | None, key: str) -> str | None:
    """The annotation ``key`` of a Kubernetes object (None for no object or no annotation)."""
    value = (((obj or {}).get("metadata") or {}).get("annotations") or {}).get(key)
    return str(value) if value is not None else None


def digest(doc: Any) -> str:
    """A short stable hash of a JSON document (spec and template hashes)."""
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]
