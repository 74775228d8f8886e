"""Stable seeds and draws from named parts: the project's one hash for reproducible randomness.

A seed (or a draw) is a pure function of the parts that name it, e.g. ``derive_seed(run_seed,
"select", step)``: the same parts give the same number in any process, whatever else ran before
(``repr`` of the parts, hashed with BLAKE2b; Python's ``hash`` is salted per process). The
workflow runtime derives its call seeds here, the search and the trainer their RNG seeds, and the
surrogate executor its unseeded request seeds and every draw it makes (``stable_hash``).

Pure standard library, importable from every layer (it sits below ``workflow`` and
``executor``, so neither has to import the other for it).
"""

from __future__ import annotations

import hashlib
from typing import Final

SEED_MODULUS: Final = 2**31 - 1
"""Seeds stay below 2^31 so every OpenAI-compatible server accepts them."""


def stable_hash(*parts: object) -> int:
    """A 64-bit integer fixed by ``parts`` (BLAKE2b of their ``repr``)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def derive_seed(*parts: object) -> int:
    """A stable seed from any parts, in [0, 2^31 - 1)."""
    return stable_hash(*parts) % SEED_MODULUS
