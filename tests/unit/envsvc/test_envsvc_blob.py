"""The state blob: deterministic round trips, and a named refusal for every kind of bad blob."""

from __future__ import annotations

import hashlib
import hmac
import struct
import zlib

import pytest

from aflowrl.config import SearchSpec
from aflowrl.envsvc import blob
from aflowrl.envsvc.blob import MAGIC, OVERHEAD, StateCodec, derive_key
from aflowrl.envsvc.errors import StateBlobError
from aflowrl.search import EpisodeState
from aflowrl.search.state import TreeNode
from aflowrl.workflow import library


def _state(**changes: object) -> EpisodeState:
    graph = library.load("seed", "math")
    root = TreeNode(
        parent=None,
        graph=graph.to_dict(),
        hash=graph.content_hash,
        score=0.5,
        std=0.0,
        calls=4,
        step=0,
    )
    state = EpisodeState(
        version=1,
        episode_id="e-1",
        benchmark="gsm8k",
        task_type="math",
        split="validate",
        executor="openai:m@http://x/v1|t=None|seed=0",
        problems="0123456789abcdef",
        problem_count=4,
        repeats=1,
        seed=3,
        search=SearchSpec(),
        step=0,
        parent=0,
        nodes=(root,),
        top_mean=0.5,
    )
    return state.model_copy(update=changes)


def _signed(payload: bytes, *, version: int = 1, secret: str | None = None) -> bytes:
    """A blob with a valid MAC around any payload (what only a key holder can make)."""
    header = struct.pack(">3sBI", MAGIC, version, len(payload))
    return (
        header + hmac.new(derive_key(secret), header + payload, hashlib.sha256).digest() + payload
    )


def test_round_trip_is_exact_and_deterministic():
    codec = StateCodec()
    state = _state()
    first, second = codec.encode(state), StateCodec().encode(state)
    assert first == second
    assert first[:3] == b"AFE" and first[3] == 1
    assert codec.decode(first, field="step.state") == state
    assert len(first) < len(state.to_bytes())  # compressed


def test_a_secret_key_signs_and_refuses_other_keys():
    state = _state()
    signed = StateCodec("token-a")
    assert signed.signed and not StateCodec().signed
    blob_a = signed.encode(state)
    assert signed.decode(blob_a, field="step.state") == state
    for other in (StateCodec("token-b"), StateCodec()):
        with pytest.raises(StateBlobError, match="integrity check failed") as caught:
            other.decode(blob_a, field="step.state")
        assert caught.value.field == "step.state"


def _flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x5A]) + data[index + 1 :]


GOOD = StateCodec().encode(_state())


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (b"", "empty"),
        (b"\x00" * 10, "not an environment state blob"),
        (b"GARBAGE" * 20, "not an environment state blob"),
        (b"AF", "not an environment state blob"),
        (GOOD[:3] + b"\x02" + GOOD[4:], "blob format version 2"),
        (GOOD[:-7], "truncated"),
        (GOOD[:20], "truncated"),
        (GOOD + b"zz", "2 bytes after the end of the payload"),
        (_flip(GOOD, len(GOOD) - 3), "integrity check failed"),
        (_flip(GOOD, OVERHEAD - 1), "integrity check failed"),
        (_signed(b"not zlib at all"), "does not decompress"),
        (_signed(zlib.compress(b"{not json")), "not JSON"),
        (_signed(zlib.compress(b"[1, 2]")), "must be a JSON object"),
        (_signed(zlib.compress(b'{"version": 1}')[:-4]), "incomplete"),
    ],
)
def test_every_bad_blob_is_refused_naming_the_field(bad, message):
    with pytest.raises(StateBlobError, match=message) as caught:
        StateCodec().decode(bad, field="step.state")
    assert caught.value.field == "step.state"


def test_an_oversized_blob_is_refused_before_it_is_read():
    codec = StateCodec(max_bytes=1000)
    with pytest.raises(StateBlobError, match="1001 bytes; at most 1000"):
        codec.decode(b"AFE" + b"\x00" * 998, field="project.state")


def test_a_payload_that_inflates_past_the_limit_is_refused(monkeypatch):
    monkeypatch.setattr(blob, "MAX_STATE_BYTES", 10_000)
    bomb = _signed(zlib.compress(b" " * 50_000))
    with pytest.raises(StateBlobError, match="decompresses past 10000 bytes"):
        StateCodec().decode(bomb, field="step.state")


def test_a_signed_state_that_does_not_validate_names_the_inner_field():
    doc = _state().to_json().replace('"parent":0', '"parent":5', 1)
    with pytest.raises(StateBlobError) as caught:
        StateCodec().decode(_signed(zlib.compress(doc.encode())), field="step.state")
    assert caught.value.field == "step.state.parent"
    newer = _state().to_json().replace('"version":1', '"version":2', 1)
    with pytest.raises(StateBlobError, match="this environment reads 1") as caught:
        StateCodec().decode(_signed(zlib.compress(newer.encode())), field="step.state")
    assert caught.value.field == "step.state.version"


def test_a_state_too_large_to_carry_is_refused_when_encoding():
    codec = StateCodec(max_bytes=OVERHEAD + 50)
    with pytest.raises(StateBlobError, match=r"over the \d+-byte limit") as caught:
        codec.encode(_state())
    assert caught.value.field == "state"
    with pytest.raises(ValueError, match="no room"):
        StateCodec(max_bytes=OVERHEAD)
