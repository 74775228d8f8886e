"""Errors of the rollout service."""

from __future__ import annotations

from aflowrl.errors import FailedPreconditionError, InvalidInputError, UnavailableError


class BadSamplingRequestError(InvalidInputError):
    """A Generate or ScoreCandidates request the engine cannot serve as asked."""


class EngineUnavailableError(UnavailableError):
    """The engine is not started, or is shutting down."""


class WeightGroupStateError(FailedPreconditionError):
    """A weight call for a group this replica has not joined (nccl transport): nothing is
    touched, the replica keeps serving. ``field`` names the request field."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)
