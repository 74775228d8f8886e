"""Domain errors shared by every package, typed by whether a retry can help.

Kopf's ``TemporaryError`` / ``PermanentError`` split, applied to the whole system: callers decide
to retry by type, never by parsing messages. The gRPC error interceptor
(:mod:`aflowrl.common.interceptors`) maps each type to one status code, so a client sees
INVALID_ARGUMENT with the offending field named, RESOURCE_EXHAUSTED on overload, and so on.
Packages subclass these in their own short ``errors.py``.
"""

from __future__ import annotations


class AflowRLError(Exception):
    """Base of every error aflow-rl raises on purpose."""

    retryable: bool = False


class PermanentError(AflowRLError):
    """The operation can never succeed as asked; retrying is pointless."""


class InvalidInputError(PermanentError):
    """Bad input (config, request, dataset line, action text). ``field`` names what is wrong."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        self.reason = message
        super().__init__(f"{field}: {message}" if field else message)


class NotFoundError(PermanentError):
    """A named thing (benchmark, problem, checkpoint, model) does not exist."""


class FailedPreconditionError(PermanentError):
    """The system is not in a state where the operation is allowed (e.g. a stale version)."""


class CorruptStateError(PermanentError):
    """A component's own state is unusable and must not spread (a learner whose weights hold
    NaN or infinity): the run cannot go on as it is. DATA_LOSS on the wire."""


class RetryableError(AflowRLError):
    """A transient failure; the same operation may succeed later. ``delay_s`` is a hint."""

    retryable = True

    def __init__(self, message: str, *, delay_s: float | None = None) -> None:
        self.delay_s = delay_s
        super().__init__(message)


class OverloadedError(RetryableError):
    """Too much work in flight; back off and retry."""


class UnavailableError(RetryableError):
    """A dependency (executor endpoint, peer service) cannot be reached right now."""


class DeadlineExceededError(RetryableError):
    """The operation ran out of time."""
