"""Errors of the trainer, typed by whether a retry (or a restart of the trainer) can help."""

from __future__ import annotations

from aflowrl.errors import FailedPreconditionError, InvalidInputError, UnavailableError


class NoReplicaError(UnavailableError):
    """Every environment (or rollout) replica refused or could not be reached."""


class LearnerDivergedError(FailedPreconditionError):
    """The learner's policy version is not the one the trainer expects (it restarted, or another
    trainer drives it): resume from the last checkpoint rather than train on."""


class ResumeError(InvalidInputError):
    """A run directory cannot be resumed as asked (another spec, a missing checkpoint)."""
