"""The state blob: an episode state as opaque, versioned, size-limited, integrity-checked bytes.

The environment service keeps no episode state; the caller carries this blob from one call to
the next. Layout (big-endian)::

    magic "AFE" (3) | format version (1) | payload length (4) | HMAC-SHA256 (32) | payload

The payload is the episode state's compact JSON (:meth:`aflowrl.search.EpisodeState.to_json`),
zlib-compressed; the MAC covers the header and the payload. Encoding is deterministic (same
state, same bytes), so replicas and retries agree byte for byte.

The MAC key is derived from the run's gRPC bearer token when one is configured
(``spec.grpc.authTokenSecret``): then only holders of the token can make a blob a replica
accepts. Without a token the key is public and the MAC is a checksum (corruption, truncation and
blobs of other formats are still refused, but a determined client could forge a state).

:meth:`StateCodec.decode` refuses, with an error naming the field and the problem: an empty or
oversized blob, one without the header, another format version, a truncated or over-long one, a
MAC mismatch (corrupt, or signed with another key), a payload that decompresses past the limit,
and a state that does not parse or is inconsistent. Whether the state belongs to *this*
environment (benchmark, executor, problems) is checked by the search itself
(:func:`aflowrl.search.step`). Used by :mod:`aflowrl.envsvc.environment`.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import zlib
from typing import Final

from aflowrl.envsvc.errors import StateBlobError
from aflowrl.search import EpisodeState, EpisodeStateError

MAGIC: Final = b"AFE"
FORMAT_VERSION: Final = 1
"""Version of the blob layout; blobs of other versions are refused."""
_HEADER = struct.Struct(">3sBI")
MAC_BYTES: Final = 32
OVERHEAD: Final = _HEADER.size + MAC_BYTES
"""Bytes of a blob before its payload."""

MAX_BLOB_BYTES: Final = 4 << 20
"""Largest blob accepted or produced (compressed); a 1000-step episode stays far below."""
MAX_STATE_BYTES: Final = 64 << 20
"""Largest decompressed state JSON (a bound on what a hostile payload can make us allocate)."""

_KEY_LABEL: Final = b"aflowrl-environment-state/v1"
_COMPRESSION_LEVEL: Final = 6


def derive_key(secret: str | None) -> bytes:
    """The MAC key: HMAC-SHA256(label, secret) with a secret, else SHA-256(label) (public)."""
    if secret:
        return hmac.new(_KEY_LABEL, secret.encode(), hashlib.sha256).digest()
    return hashlib.sha256(_KEY_LABEL).digest()


def refused(exc: EpisodeStateError, field: str) -> StateBlobError:
    """The search's complaint about a state, with the field under the request's (``step.state``).

    ``state.nodes[2]`` becomes ``step.state.nodes[2]``."""
    inner = (exc.field or "state").removeprefix("state")
    return StateBlobError(exc.reason, field=f"{field}{inner}")


class StateCodec:
    """Encodes and checks state blobs (module docstring)."""

    def __init__(self, secret: str | None = None, *, max_bytes: int = MAX_BLOB_BYTES) -> None:
        if max_bytes <= OVERHEAD:
            raise ValueError(f"max_bytes={max_bytes} leaves no room for a payload")
        self._key = derive_key(secret)
        self.max_bytes = max_bytes
        self.signed = bool(secret)
        """Whether the key is secret (blobs unforgeable without the token)."""

    def _mac(self, header: bytes, payload: bytes) -> bytes:
        return hmac.new(self._key, header + payload, hashlib.sha256).digest()

    def encode(self, state: EpisodeState) -> bytes:
        """The blob of ``state``; raises :class:`StateBlobError` if it outgrows the limit."""
        payload = zlib.compress(state.to_bytes(), _COMPRESSION_LEVEL)
        size = OVERHEAD + len(payload)
        if size > self.max_bytes:
            raise StateBlobError(
                f"the episode's state takes {size} bytes, over the {self.max_bytes}-byte limit "
                "(fewer steps per episode keep it smaller)",
                field="state",
            )
        header = _HEADER.pack(MAGIC, FORMAT_VERSION, len(payload))
        return header + self._mac(header, payload) + payload

    def decode(self, blob: bytes, *, field: str) -> EpisodeState:
        """The state in ``blob``; ``field`` names the request field in errors (``step.state``)."""
        payload = self._checked_payload(blob, field)
        decompressor = zlib.decompressobj()
        try:
            text = decompressor.decompress(payload, MAX_STATE_BYTES)
        except zlib.error as exc:
            raise StateBlobError(f"payload does not decompress: {exc}", field=field) from None
        if decompressor.unconsumed_tail or not decompressor.eof:
            raise StateBlobError(
                f"payload decompresses past {MAX_STATE_BYTES} bytes or is incomplete", field=field
            )
        try:
            return EpisodeState.from_json(text)
        except EpisodeStateError as exc:
            raise refused(exc, field) from None

    def _checked_payload(self, blob: bytes, field: str) -> bytes:
        size = len(blob)
        if size == 0:
            raise StateBlobError(
                "empty; pass the state returned by the previous Reset or Step", field=field
            )
        if size > self.max_bytes:
            raise StateBlobError(f"{size} bytes; at most {self.max_bytes}", field=field)
        if size < _HEADER.size or blob[:3] != MAGIC:
            raise StateBlobError(
                f"not an environment state blob ({size} bytes without the {MAGIC.decode()} header)",
                field=field,
            )
        _, version, length = _HEADER.unpack_from(blob)
        if version != FORMAT_VERSION:
            raise StateBlobError(
                f"blob format version {version}; this server reads version {FORMAT_VERSION}",
                field=field,
            )
        present = size - OVERHEAD
        if present < length:
            raise StateBlobError(
                f"truncated: {max(0, present)} of {length} payload bytes present", field=field
            )
        if present > length:
            raise StateBlobError(
                f"{present - length} bytes after the end of the payload", field=field
            )
        header = blob[: _HEADER.size]
        mac = blob[_HEADER.size : OVERHEAD]
        payload = blob[OVERHEAD:]
        if not hmac.compare_digest(mac, self._mac(header, payload)):
            raise StateBlobError(
                "integrity check failed: the blob is corrupt or was made by another environment "
                "(signed with another key)",
                field=field,
            )
        return payload
