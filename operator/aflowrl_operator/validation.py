"""What the operator accepts: the same checks as the CRD, applied once more.

Every TrainingRun is validated as :meth:`aflowrl.config.RunSpec.from_document` reads a
TrainingRun document: the RunSpec model (the same as ``aflowrl train -f``), the run's name and
the rules that only matter on a cluster. The CRD refuses the same documents at admission (its
schema and CEL rules are generated from the same models), so a rejection here means the CRD was
not upgraded with the operator, or was bypassed.

Once a run has children, the spec they were built from (the run's ConfigMap) is the *accepted*
spec; a new spec that changes one of :data:`aflowrl.config.run.IMMUTABLE_FIELDS` is rejected
(:func:`aflowrl.config.run.immutable_changes`, the twin of the CRD's transition rules) and the
run keeps going on the accepted one. Everything else may change and is applied: replica counts
and ``suspend`` at once, other fields by rolling the rollout, environment and executor pods,
and the learner and trainer when their pods next start (suspend and resume the run).

Images a spec leaves unset are the operator's defaults for runs (:func:`with_default_images`,
the chart's ``runDefaults``), filled in before anything is built.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aflowrl.config import API_GROUP, API_VERSION, KIND, ConfigError, ImageDefaults, RunSpec
from aflowrl.config.run import immutable_changes as _immutable_changes


@dataclasses.dataclass(frozen=True)
class Rejection:
    """Why a spec (or a change to it) was not applied: a condition reason and readable lines."""

    reason: str
    problems: tuple[str, ...]

    @property
    def message(self) -> str:
        return "; ".join(self.problems)


def validate(name: str, spec_doc: Any) -> tuple[RunSpec | None, Rejection | None]:
    """The validated spec of a TrainingRun, or why it is invalid (reason ``InvalidSpec``)."""
    document = {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": {"name": name},
        "spec": spec_doc,
    }
    try:
        return RunSpec.from_document(document), None
    except ConfigError as exc:
        return None, Rejection("InvalidSpec", tuple(exc.problems))


def immutable_changes(accepted: RunSpec, new: RunSpec) -> Rejection | None:
    """The immutable fields ``new`` changes with respect to ``accepted`` (reason
    ``ImmutableFieldChanged``), or None."""
    found = _immutable_changes(accepted, new)
    if not found:
        return None
    return Rejection("ImmutableFieldChanged", tuple(f"{path} {msg}" for path, msg in found))


def with_default_images(spec: RunSpec, defaults: ImageDefaults) -> RunSpec:
    """``spec`` with every image it leaves unset taken from the operator's ``defaults`` (the
    chart's ``runDefaults``). The children and the run's ConfigMap are built from the result,
    so the ConfigMap shows the images the pods run."""
    return spec.model_copy(update={"images": spec.images.with_defaults(defaults)})
