"""Errors of the environment service: bad requests, unusable state blobs, a setup that cannot run.

Raised by :mod:`aflowrl.envsvc`; the gRPC error interceptor maps them to status codes. Every
request error names the field it is about (``step.state``, ``reset.task``...).
"""

from __future__ import annotations

from aflowrl.errors import (
    FailedPreconditionError,
    InvalidInputError,
    NotFoundError,
    UnavailableError,
)


class BadRequestError(InvalidInputError):
    """A request field the environment cannot use (INVALID_ARGUMENT, the field named)."""


class StateBlobError(BadRequestError):
    """A state blob that is empty, oversized, truncated, corrupt, foreign or of another version."""


class SplitUnavailableError(NotFoundError):
    """The benchmark has no such split in this replica's data (HotpotQA has no test split)."""


class ExecutorUnreachableError(FailedPreconditionError):
    """The executor endpoint did not answer during warm-up (the replica never turns SERVING)."""


class SandboxStartError(FailedPreconditionError):
    """The code sandbox cannot start here (bubblewrap broken, no usable isolation): the replica
    refuses to start, naming the reason, rather than score code it cannot run safely."""


class WarmingUpError(UnavailableError):
    """A call arrived before warm-up finished (health is still NOT_SERVING): retry."""
