"""Errors of the local launcher."""

from __future__ import annotations

from aflowrl.errors import FailedPreconditionError, InvalidInputError


class ServiceStartError(FailedPreconditionError):
    """A service of the local run exited or never became healthy while starting."""


class PreflightError(InvalidInputError):
    """An input of the run is unusable; found before any work starts (``field`` names it)."""
