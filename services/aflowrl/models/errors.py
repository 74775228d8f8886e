"""Errors of the policy-model helpers (missing model, weights that do not fit the model)."""

from __future__ import annotations

from aflowrl.errors import (
    FailedPreconditionError,
    InvalidInputError,
    NotFoundError,
    UnavailableError,
)


class ModelNotFoundError(NotFoundError):
    """A model directory (or a file in it) does not exist."""


class WeightMismatchError(InvalidInputError):
    """Weights whose names, shapes, dtypes, sizes or checksum disagree with the model."""


class StaleWeightsError(FailedPreconditionError):
    """A weight version not newer than the one serving."""


class PartialWeightsError(WeightMismatchError):
    """An update that ended before all of its bytes (or its commit, or its marker) arrived."""


class CorruptWeightsError(WeightMismatchError):
    """An update whose bytes do not match its checksum."""


class NonFiniteWeightsError(WeightMismatchError):
    """An update holding NaN or infinite values (whatever its checksum): refused before it
    serves, since every request it served would fail."""


class TransportUnavailableError(FailedPreconditionError):
    """A weight transport this machine cannot run (e.g. nccl without CUDA GPUs)."""


class BroadcastBrokenError(UnavailableError):
    """A weight broadcast broke off (a member died, a collective timed out, a garbled header).

    A receiver that had started loading is left with some new and some old weights: it must not
    serve until a complete version is loaded, unless ``intact``: it loaded nothing, or put every
    old weight back (``rollout.vllm.keepWeightsOnLoad``), and serves the old version on.
    ``None``: the receiver did not say (the rollout then judges by whether any bucket landed).
    """

    def __init__(self, message: str, *, intact: bool | None = None) -> None:
        self.intact = intact
        super().__init__(message)


class IncompleteWeightsError(UnavailableError):
    """The replica's weights are incomplete after a broken broadcast; it waits for a reload."""


class WeightLoadFailedError(UnavailableError):
    """Loading a verified update failed midway (an out-of-memory error, an engine fault).

    ``intact``: the engine put every old weight back and keeps serving the old version;
    otherwise its weights are a mix of old and new and the replica serves nothing until a
    complete version is loaded (the same version may be sent again).
    """

    def __init__(self, message: str, *, intact: bool) -> None:
        self.intact = intact
        super().__init__(message)
