"""Which environment replica serves a key: a consistent-hash ring.

Each environment replica caches evaluations, so calls that evaluate the same workflow should
meet on the same replica. Keys are placed on a consistent-hash ring (Karger et al., 1997,
"Consistent hashing and random trees") with :data:`VIRTUAL_NODES` points per replica; a key's
owners are the replicas in ring order from its position, so a lost replica's keys spread over
all the others. :class:`aflowrl.trainer.clients.EnvironmentClient` routes its calls with it
(DESIGN.md section 2, "Evaluation").
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence

VIRTUAL_NODES = 64
"""Points per replica on the ring: keys spread evenly, and a lost replica's keys spread over
all the others rather than landing on one neighbour."""


def key_hash(key: str) -> int:
    """A 64-bit position on the ring (first 8 bytes of SHA-256: stable across processes)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


class HashRing:
    """A consistent-hash ring over replica addresses."""

    def __init__(self, members: Sequence[str], *, vnodes: int = VIRTUAL_NODES) -> None:
        self.members = tuple(sorted(set(members)))
        points = sorted(
            (key_hash(f"{member}#{v}"), member) for member in self.members for v in range(vnodes)
        )
        self._hashes = [h for h, _ in points]
        self._owners = [m for _, m in points]

    def owners(self, key: str) -> list[str]:
        """Every member once, in ring order from ``key``'s position (the first owns the key)."""
        if not self.members:
            return []
        start = bisect.bisect(self._hashes, key_hash(key))
        seen: list[str] = []
        for i in range(len(self._owners)):
            member = self._owners[(start + i) % len(self._owners)]
            if member not in seen:
                seen.append(member)
                if len(seen) == len(self.members):
                    break
        return seen
