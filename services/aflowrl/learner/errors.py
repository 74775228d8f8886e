"""Errors of the learner service."""

from __future__ import annotations

from aflowrl.errors import (
    CorruptStateError,
    FailedPreconditionError,
    InvalidInputError,
    NotFoundError,
)


class BadBatchError(InvalidInputError):
    """A Train or ComputeLogProbs request whose rows are inconsistent (``field`` names the row)."""


class NoReferenceError(FailedPreconditionError):
    """A reference log-prob was asked for, but the learner keeps no reference model."""


class CheckpointNotFoundError(NotFoundError):
    """No complete checkpoint at the given path."""


class CorruptCheckpointError(FailedPreconditionError):
    """A checkpoint directory that is complete but cannot be loaded (a truncated shard, missing
    or unreadable metadata): loading it can never succeed. ``field`` names the request field."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


class LearnerBrokenError(FailedPreconditionError):
    """A collective step failed on some rank; the ranks may disagree, so the learner stops."""


class UnusablePathError(InvalidInputError):
    """A checkpoint or export path the learner cannot write (a file in the way, no permission,
    a read-only or pseudo file system); ``field`` names the request field."""


class WeightGroupError(FailedPreconditionError):
    """A broadcast on a weight group that is not the open one (nccl transport)."""


class PolicyDivergedError(CorruptStateError):
    """The learner's own weights hold NaN or infinity (the policy diverged): it refuses to
    broadcast, push or export them, so no replica is poisoned; the trainer stops the run
    (DATA_LOSS; the run's TrainerFailed condition and Warning event carry the message)."""
