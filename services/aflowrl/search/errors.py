"""Errors of the workflow search: unusable actions, foreign episode states, proposer failures.

Raised by :mod:`aflowrl.search`. An action the policy writes that cannot be used is *not* an
error of the environment: :func:`aflowrl.search.projection.project` turns an
:class:`InvalidActionError` into an invalid projection (a no-op plus a flag), so only the
action-language functions themselves raise it. A state blob that does not parse or does not
belong to this environment raises :class:`EpisodeStateError` (INVALID_ARGUMENT on the wire).
"""

from __future__ import annotations

from aflowrl.errors import FailedPreconditionError, InvalidInputError, UnavailableError


class InvalidActionError(InvalidInputError):
    """Action text that does not parse, or an edit that does not apply to the workflow."""


class EpisodeStateError(InvalidInputError):
    """An episode state that is malformed, from another version, or for another environment."""


class EpisodeOverError(FailedPreconditionError):
    """A step was asked of an episode that is already done."""


class ProposerUnavailableError(UnavailableError):
    """The proposer's model endpoint could not be reached (after its own retries)."""
