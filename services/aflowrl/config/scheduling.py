"""Where a run's pods go: placement shared by the GPU pods, per-component pod overrides, gang
scheduling, and the settings of multi-GPU networking (NCCL).

The Kubernetes types (affinity, tolerations, topology spread constraints) are modelled field by
field after ``core/v1``, with the rules the API server applies to them when the operator creates
the pods (a toleration's seconds only with effect NoExecute, the number of values each selector
operator takes, a key's prefix at most 253 characters, a pod's annotations at most 256 KiB
together), so a mistake is refused when the TrainingRun is applied, not later when the
operator's Deployment is rejected. The operator (``aflowrl_operator.pods``) merges them:
``scheduling`` applies to every GPU pod (its priority class to every pod), then a component's
``pod`` overrides add to it (labels, annotations, tolerations) or replace it (node selector
entries, affinity, priority class, runtime class).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, model_validator

from aflowrl.config._base import (
    CelRule,
    DnsSubdomain,
    FieldRuleError,
    LabelKey,
    LabelValue,
    ShortText,
    SpecModel,
)

RESERVED_LABELS: tuple[str, ...] = ("aflowrl.io/run", "app.kubernetes.io/component")
"""Pod labels the operator's selectors match on: a pod override may not set them."""
MAX_ANNOTATION_BYTES = 256 * 1024 - 4096
"""Bytes a component's pod annotations (keys and values) may take together: the API server's
256 KiB per object, less room for the operator's own annotations."""
INTEGER_PATTERN = r"^[-+]?[0-9]{1,18}$"
"""A value the API server parses as an int64 (node selector operators Gt and Lt)."""


def annotation_bytes(annotations: dict[str, str]) -> int:
    """Bytes of annotations as the API server counts them (keys and values, UTF-8)."""
    return sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())


Labels = Annotated[dict[LabelKey, LabelValue], Field(max_length=64)]
Annotations = Annotated[
    dict[LabelKey, Annotated[str, Field(max_length=65536)]], Field(max_length=64)
]
Values = Annotated[list[Annotated[str, Field(max_length=253)]], Field(max_length=64)]


class Toleration(SpecModel):
    """A Kubernetes toleration (for GPU node taints)."""

    key: LabelKey | None = None
    """Taint key to tolerate; empty with operator Exists tolerates every taint."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """How the key and value are matched."""
    value: LabelValue | None = None
    """Taint value (operator Equal)."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to tolerate; empty tolerates every effect."""
    toleration_seconds: int | None = Field(default=None, ge=0, le=2**31 - 1)
    """Seconds a NoExecute taint is tolerated before eviction (seconds)."""

    cel_rules = (
        CelRule(
            "{operator} != 'Exists' || !{?value}",
            "a toleration with operator Exists takes no value",
            "value",
        ),
        CelRule(
            "{?key} || {operator} == 'Exists'",
            "a toleration without a key must use operator Exists",
            "operator",
        ),
        CelRule(
            "!{?tolerationSeconds} || ({?effect} && {!effect} == 'NoExecute')",
            "tolerationSeconds needs effect NoExecute",
            "effect",
        ),
    )

    @model_validator(mode="after")
    def _operator_fits(self) -> Toleration:
        broken = []
        if self.operator == "Exists" and self.value is not None:
            broken.append(("value", "a toleration with operator Exists takes no value"))
        if self.key is None and self.operator != "Exists":
            broken.append(("operator", "a toleration without a key must use operator Exists"))
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            broken.append(
                (
                    "effect",
                    f"tolerationSeconds needs effect NoExecute (it is {self.effect or 'unset'}): "
                    "the API server refuses the pod otherwise",
                )
            )
        FieldRuleError.raise_any(broken)
        return self


class LabelSelectorRequirement(SpecModel):
    """One ``matchExpressions`` term of a label selector."""

    key: LabelKey
    """Label key the term is about."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    """How the key's value is matched against ``values``."""
    values: Values = Field(default_factory=list)
    """Values for In and NotIn (empty for Exists and DoesNotExist)."""

    cel_rules = (
        CelRule(
            "({operator} in ['In', 'NotIn']) == (size({values}) > 0)",
            "operators In and NotIn take values; Exists and DoesNotExist take none",
            "values",
        ),
    )

    @model_validator(mode="after")
    def _values_fit(self) -> LabelSelectorRequirement:
        wanted = self.operator in ("In", "NotIn")
        if wanted != bool(self.values):
            raise FieldRuleError(
                "values",
                f"operator {self.operator} takes {'values' if wanted else 'no values'} "
                f"({len(self.values)} given)",
            )
        return self


class LabelSelector(SpecModel):
    """A Kubernetes label selector (terms are ANDed)."""

    match_labels: Labels = Field(default_factory=dict)
    """Labels a pod must carry, with these values."""
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list, max_length=32)
    """Set-based requirements."""


class NodeSelectorRequirement(SpecModel):
    """One term of a node selector."""

    key: LabelKey
    """Node label key (or field name, in ``matchFields``)."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    """How the key's value is matched against ``values``."""
    values: Values = Field(default_factory=list)
    """Values (one integer for Gt and Lt; none for Exists and DoesNotExist)."""

    cel_rules = (
        CelRule(
            "{operator} in ['In', 'NotIn'] ? size({values}) > 0 "
            ": {operator} in ['Exists', 'DoesNotExist'] ? size({values}) == 0 "
            f": size({{values}}) == 1 && {{values}}[0].matches('{INTEGER_PATTERN}')",
            "In and NotIn take values, Exists and DoesNotExist none, Gt and Lt one integer",
            "values",
        ),
    )

    @model_validator(mode="after")
    def _values_fit(self) -> NodeSelectorRequirement:
        operator, values = self.operator, self.values
        if operator in ("In", "NotIn"):
            fits, wanted = bool(values), "values"
        elif operator in ("Exists", "DoesNotExist"):
            fits, wanted = not values, "no values"
        else:
            fits = len(values) == 1 and re.match(INTEGER_PATTERN, values[0]) is not None
            wanted = "exactly one integer"
        if not fits:
            raise FieldRuleError(
                "values", f"operator {operator} takes {wanted} (got {list(values)[:4]})"
            )
        return self


class NodeSelectorTerm(SpecModel):
    """Node requirements that are ANDed."""

    match_expressions: list[NodeSelectorRequirement] = Field(default_factory=list, max_length=32)
    """Requirements on node labels."""
    match_fields: list[NodeSelectorRequirement] = Field(default_factory=list, max_length=32)
    """Requirements on node fields: ``metadata.name`` In or NotIn one name (all the API server
    supports)."""

    cel_rules = (
        CelRule(
            "{matchFields}.all(r, r.key == 'metadata.name' && r.operator in ['In', 'NotIn'] "
            "&& has(r.values) && size(r.values) == 1)",
            "matchFields supports only metadata.name, with In or NotIn and one value",
            "matchFields",
        ),
    )

    @model_validator(mode="after")
    def _fields_supported(self) -> NodeSelectorTerm:
        for r in self.match_fields:
            if r.key != "metadata.name" or r.operator not in ("In", "NotIn") or len(r.values) != 1:
                raise FieldRuleError(
                    "matchFields",
                    "matchFields supports only metadata.name, with In or NotIn and one value "
                    f"(got {r.key} {r.operator} {list(r.values)[:4]})",
                )
        return self


class NodeSelector(SpecModel):
    """Node selector terms that are ORed."""

    node_selector_terms: list[NodeSelectorTerm] = Field(min_length=1, max_length=32)
    """At least one term must match."""


class PreferredSchedulingTerm(SpecModel):
    """A weighted node preference."""

    weight: int = Field(ge=1, le=100)
    """Weight of the preference (1-100)."""
    preference: NodeSelectorTerm
    """The nodes preferred."""


class NodeAffinity(SpecModel):
    """Node affinity of a pod."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    """Nodes a pod may only be scheduled on."""
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] = Field(
        default_factory=list, max_length=32
    )
    """Nodes preferred, by weight."""


class PodAffinityTerm(SpecModel):
    """Pods this pod should (or should not) run near, within a topology domain."""

    label_selector: LabelSelector | None = None
    """The pods the term is about."""
    namespace_selector: LabelSelector | None = None
    """Namespaces searched for those pods (empty with no ``namespaces``: the pod's own)."""
    namespaces: Values = Field(default_factory=list)
    """Namespaces searched for those pods."""
    topology_key: LabelKey
    """Node label defining the domain (e.g. ``kubernetes.io/hostname``, a rack or NVLink
    domain label)."""
    match_label_keys: list[LabelKey] = Field(default_factory=list, max_length=16)
    """Keys of the incoming pod's labels whose values are added to the selector."""
    mismatch_label_keys: list[LabelKey] = Field(default_factory=list, max_length=16)
    """Keys of the incoming pod's labels whose values are excluded by the selector."""

    cel_rules = (
        CelRule(
            "!{matchLabelKeys}.exists(k, k in {mismatchLabelKeys})",
            "a key cannot be in both matchLabelKeys and mismatchLabelKeys",
            "mismatchLabelKeys",
        ),
    )

    @model_validator(mode="after")
    def _keys_disjoint(self) -> PodAffinityTerm:
        both = sorted(set(self.match_label_keys) & set(self.mismatch_label_keys))
        if both:
            raise FieldRuleError(
                "mismatchLabelKeys",
                f"{', '.join(both)} in both matchLabelKeys and mismatchLabelKeys",
            )
        return self


class WeightedPodAffinityTerm(SpecModel):
    """A weighted pod (anti-)affinity preference."""

    weight: int = Field(ge=1, le=100)
    """Weight of the preference (1-100)."""
    pod_affinity_term: PodAffinityTerm
    """The term."""


class PodAffinity(SpecModel):
    """Pod affinity or anti-affinity."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] = Field(
        default_factory=list, max_length=32
    )
    """Terms that must hold."""
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] = Field(
        default_factory=list, max_length=32
    )
    """Terms preferred, by weight."""


class Affinity(SpecModel):
    """Kubernetes affinity of a pod (``core/v1 Affinity``)."""

    node_affinity: NodeAffinity | None = None
    """Which nodes."""
    pod_affinity: PodAffinity | None = None
    """Near which pods."""
    pod_anti_affinity: PodAffinity | None = None
    """Away from which pods."""


class TopologySpreadConstraint(SpecModel):
    """How a component's pods spread over a topology (``core/v1 TopologySpreadConstraint``)."""

    max_skew: int = Field(ge=1, le=1000)
    """Most pods one domain may have over the least loaded one."""
    topology_key: LabelKey
    """Node label defining the domains (zone, host, rack)."""
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"]
    """Refuse to schedule, or schedule anyway, when the skew cannot be met."""
    label_selector: LabelSelector | None = None
    """Pods counted; empty: the operator uses the component's own pods."""
    min_domains: int | None = Field(default=None, ge=1, le=1000)
    """Fewest eligible domains (DoNotSchedule only)."""
    node_affinity_policy: Literal["Honor", "Ignore"] | None = None
    """Whether node affinity limits the domains counted."""
    node_taints_policy: Literal["Honor", "Ignore"] | None = None
    """Whether node taints limit the domains counted."""
    match_label_keys: list[LabelKey] = Field(default_factory=list, max_length=16)
    """Keys of the incoming pod's labels added to the selector."""

    cel_rules = (
        CelRule(
            "!{?minDomains} || {whenUnsatisfiable} == 'DoNotSchedule'",
            "minDomains needs whenUnsatisfiable DoNotSchedule",
            "minDomains",
        ),
    )

    @model_validator(mode="after")
    def _min_domains(self) -> TopologySpreadConstraint:
        if self.min_domains is not None and self.when_unsatisfiable != "DoNotSchedule":
            raise FieldRuleError("minDomains", "minDomains needs whenUnsatisfiable DoNotSchedule")
        return self


class PodOverrides(SpecModel):
    """Pod-level settings of one component (rollout, learner, environment or trainer).

    They are applied on top of ``spec.scheduling``: labels, annotations and tolerations are
    added; node selector entries, affinity, priority class and runtime class replace.
    """

    labels: Labels = Field(default_factory=dict)
    """Extra pod labels (e.g. for network policies or cost reports); the operator's own
    ``aflowrl.io/run`` and ``app.kubernetes.io/component`` cannot be set."""
    annotations: Annotations = Field(default_factory=dict)
    """Extra pod annotations (e.g. ``cluster-autoscaler.kubernetes.io/safe-to-evict``)."""
    node_selector: Labels = Field(default_factory=dict)
    """Node labels the pods must match (added to ``scheduling.nodeSelector``)."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    """Tolerations added to ``scheduling.tolerations``."""
    affinity: Affinity | None = None
    """Node and pod (anti-)affinity, e.g. the learner's pods on one NVLink or rack domain."""
    topology_spread_constraints: list[TopologySpreadConstraint] = Field(
        default_factory=list, max_length=16
    )
    """How the component's pods spread over zones or hosts; a constraint without a
    labelSelector counts the component's own pods."""
    runtime_class_name: DnsSubdomain | None = None
    """RuntimeClass of the pods (e.g. ``gvisor`` for the environment, which runs generated code:
    its sandbox needs a runtime that lets it create namespaces under RuntimeDefault seccomp)."""
    priority_class_name: DnsSubdomain | None = None
    """PriorityClass of the pods (replaces ``scheduling.priorityClassName``)."""

    cel_rules = (
        CelRule(
            "!{?labels} || !self.labels.exists(k, k in " + repr(list(RESERVED_LABELS)) + ")",
            "the labels aflowrl.io/run and app.kubernetes.io/component are the operator's",
            "labels",
        ),
        CelRule(
            "!{?annotations} || self.annotations.map(k, size(bytes(k)) "
            f"+ size(bytes(self.annotations[k]))).sum() <= {MAX_ANNOTATION_BYTES}",
            f"the annotations take more than {MAX_ANNOTATION_BYTES} bytes together",
            "annotations",
        ),
    )

    @model_validator(mode="after")
    def _own_labels(self) -> PodOverrides:
        broken = []
        taken = sorted(set(self.labels) & set(RESERVED_LABELS))
        if taken:
            broken.append(
                (
                    "labels",
                    f"the labels {', '.join(taken)} are the operator's (its selectors match them)",
                )
            )
        size = annotation_bytes(self.annotations)
        if size > MAX_ANNOTATION_BYTES:
            broken.append(
                (
                    "annotations",
                    f"the annotations take {size} bytes together; a pod's may take 256 KiB, "
                    f"{MAX_ANNOTATION_BYTES} of them left for these",
                )
            )
        FieldRuleError.raise_any(broken)
        return self


class GangSpec(SpecModel):
    """All-or-nothing scheduling of the GPU pods with the scheduler-plugins coscheduling plugin.

    The operator creates a ``PodGroup`` (``scheduling.x-k8s.io/v1alpha1``) whose ``minMember``
    is every rollout, learner and served-executor pod, labels those pods with it and hands them
    to ``schedulerName``: none binds until all can, so a half-placed run never holds GPUs idle.
    (With Kueue, quota is already admitted all-or-nothing: see the README.)
    """

    scheduler_name: DnsSubdomain = "scheduler-plugins-scheduler"
    """Scheduler that runs the coscheduling plugin (the scheduler-plugins chart's default)."""
    schedule_timeout_seconds: int = Field(default=600, ge=1, le=86400)
    """How long the plugin waits for the whole group before it gives the nodes back (seconds)."""


class SchedulingSpec(SpecModel):
    """Placement of the GPU pods (rollout, learner, served executor) and gang scheduling."""

    node_selector: Labels = Field(default_factory=dict)
    """Node labels the GPU pods must match."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    """Tolerations of the GPU pods."""
    priority_class_name: DnsSubdomain | None = None
    """PriorityClass of every pod of the run."""
    gang: GangSpec | None = None
    """Gang-schedule the GPU pods (coscheduling PodGroup); empty: pods schedule one by one."""
    exclusive_topology: LabelKey | None = None
    """Node label of a topology domain (a rack, an NVLink domain...) that each multi-node group
    takes whole: every pod of a group in one domain, one group per domain (LeaderWorkerSet's
    ``leaderworkerset.sigs.k8s.io/exclusive-topology``); empty: groups may share domains."""


NcclEnvKey = Annotated[
    str, Field(pattern=r"^(NCCL|TORCH_NCCL|UCX|GLOO)_[A-Z0-9_]+$", max_length=128)
]


class NcclSpec(SpecModel):
    """Environment of the collective-communication libraries in learner and rollout pods."""

    debug: Literal["VERSION", "WARN", "INFO", "TRACE"] = "WARN"
    """``NCCL_DEBUG``: WARN reports failures only; INFO logs the topology NCCL picked."""
    socket_ifname: (
        Annotated[str, Field(pattern=r"^[\^=]?[A-Za-z0-9_.,:-]+$", max_length=256)] | None
    ) = None
    """``NCCL_SOCKET_IFNAME``: interfaces for bootstrap and socket traffic (e.g. ``eth0`` or
    ``^lo,docker``); empty lets NCCL choose."""
    ib_hca: Annotated[str, Field(pattern=r"^[\^=]?[A-Za-z0-9_.,:-]+$", max_length=256)] | None = (
        None
    )
    """``NCCL_IB_HCA``: InfiniBand/RoCE adapters to use (e.g. ``mlx5``); empty lets NCCL
    choose."""
    env: dict[NcclEnvKey, ShortText] = Field(default_factory=dict, max_length=32)
    """More variables (``NCCL_*``, ``TORCH_NCCL_*``, ``UCX_*``, ``GLOO_*``), e.g.
    ``NCCL_IB_GID_INDEX: "3"`` for RoCE."""
