"""What the operator accepts: the RunSpec model, Kubernetes-only rules, and immutable fields.

Every TrainingRun spec is validated by :class:`aflowrl.config.RunSpec` (the same model as
``aflowrl train -f``) plus the rules below that only matter on a cluster. Once a run has
children, the spec they were built from (the run's ConfigMap) is the *accepted* spec; a new spec
that changes one of :data:`IMMUTABLE_FIELDS` is rejected and the run keeps going on the accepted
one. Everything else may change and is applied: replica counts and ``suspend`` at once, other
fields by rolling the rollout, environment and executor pods, and the learner and trainer when
their pods next start (suspend and resume the run to apply them at once).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aflowrl.config import ConfigError, RunSpec
from aflowrl_operator.names import MAX_RUN_NAME

IMMUTABLE_FIELDS: tuple[tuple[str, str], ...] = (
    ("policy", "the checkpoints hold this model's weights"),
    ("learner.nodes", "the learner's sharded checkpoint has this topology"),
    ("learner.procsPerNode", "the learner's sharded checkpoint has this topology"),
    ("learner.resources.gpus", "the learner's ranks are one per GPU"),
    ("learner.algorithm.type", "a critic cannot appear or vanish mid-run"),
    ("environment.benchmarks", "rewards and scores would stop being comparable"),
    ("environment.heldOutBenchmarks", "a held-out benchmark must stay unseen by training"),
    ("environment.executor.type", "the evaluation cache and rewards depend on the executor"),
    ("environment.executor.model", "the evaluation cache and rewards depend on the executor"),
    ("environment.executor.seed", "the surrogate executor's answers depend on it"),
    ("environment.executor.calibration", "the surrogate executor's answers depend on it"),
    ("trainer.seed", "the run's episodes are derived from it"),
    ("trainer.groupSize", "advantage groups of a resumed run must keep their size"),
    ("trainer.checkpointDir", "the run resumes from this directory"),
    ("weightTransport.type", "the rollout and learner pods are wired for one transport"),
    ("storage", "a claim's size, class and access mode are fixed once it exists"),
)
"""(camelCase path, why) of every spec field that cannot change once a run has children."""


@dataclasses.dataclass(frozen=True)
class Rejection:
    """Why a spec (or a change to it) was not applied: a condition reason and readable lines."""

    reason: str
    problems: tuple[str, ...]

    @property
    def message(self) -> str:
        return "; ".join(self.problems)


def cluster_problems(spec: RunSpec) -> list[str]:
    """Rules that hold only on Kubernetes, one readable line per broken rule."""
    problems = []
    if spec.needs_data_dir() and spec.environment.data.dir is None:
        needing = ", ".join(spec.environment.needing_data_dir)
        problems.append(
            f"spec.environment.data.dir: {needing} has no packaged copy; set data.dir (and "
            "data.persistentVolumeClaim holding the split files)"
        )
    transport = spec.weight_transport
    if transport.type == "filesystem":
        if spec.storage.size is None:
            problems.append(
                "spec.storage.size: weightTransport.type='filesystem' needs a claim shared by "
                "the learner and rollout pods"
            )
        root = spec.trainer.checkpoint_dir.rstrip("/") + "/"
        if not transport.path.startswith(root):
            problems.append(
                f"spec.weightTransport.path: {transport.path!r} must be under "
                f"trainer.checkpointDir {spec.trainer.checkpoint_dir!r} (the shared volume)"
            )
    shared = spec.storage.size is not None and spec.storage.access_mode == "ReadWriteMany"
    if spec.learner.nodes > 1 and spec.storage.size is not None and not shared:
        problems.append(
            f"spec.storage.accessMode: {spec.learner.nodes} learner nodes write one sharded "
            "checkpoint; use ReadWriteMany (ReadWriteOnce binds every pod to one node)"
        )
    return problems


def validate(name: str, spec_doc: Any) -> tuple[RunSpec | None, Rejection | None]:
    """The validated spec of a TrainingRun, or why it is invalid (reason ``InvalidSpec``)."""
    problems: list[str] = []
    if len(name) > MAX_RUN_NAME:
        problems.append(
            f"metadata.name: {name!r} has {len(name)} characters; at most {MAX_RUN_NAME} "
            "(children append suffixes such as -learner-0)"
        )
    try:
        spec = RunSpec.from_document(spec_doc or {})
    except ConfigError as exc:
        return None, Rejection("InvalidSpec", (*problems, *exc.problems))
    problems += cluster_problems(spec)
    if problems:
        return None, Rejection("InvalidSpec", tuple(problems))
    return spec, None


def _lookup(doc: Any, path: str) -> Any:
    node = doc
    for key in path.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _changed_leaves(path: str, before: Any, after: Any) -> list[tuple[str, Any, Any]]:
    if isinstance(before, dict) and isinstance(after, dict):
        return [
            leaf
            for key in dict.fromkeys([*before, *after])
            for leaf in _changed_leaves(f"{path}.{key}", before.get(key), after.get(key))
        ]
    return [] if before == after else [(path, before, after)]


def immutable_changes(accepted: RunSpec, new: RunSpec) -> Rejection | None:
    """The immutable fields ``new`` changes with respect to ``accepted`` (reason
    ``ImmutableFieldChanged``), or None."""
    old_doc, new_doc = accepted.to_document(), new.to_document()
    problems = []
    for field, why in IMMUTABLE_FIELDS:
        for path, before, after in _changed_leaves(
            field, _lookup(old_doc, field), _lookup(new_doc, field)
        ):
            problems.append(
                f"spec.{path} cannot change once the run exists ({why}): it is "
                f"{_short(before)}, the new spec says {_short(after)}; revert it or create a new "
                "TrainingRun"
            )
    if problems:
        return Rejection("ImmutableFieldChanged", tuple(problems))
    return None
