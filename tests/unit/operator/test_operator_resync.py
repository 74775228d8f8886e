"""The operator's periodic resync: no kopf timer (so no finalizer), kopf's peering rule kept."""

from __future__ import annotations

import datetime

import pytest

from aflowrl_operator import resync

NOW = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
ME = resync.Peering(name="aflow", identity="me", priority=50, clusterwide=True)


def _peer(priority: int, seen_s_ago: float, lifetime: int = 60) -> dict:
    seen = NOW - datetime.timedelta(seconds=seen_s_ago)
    return {"priority": priority, "lifetime": lifetime, "lastseen": seen.isoformat()}


@pytest.mark.parametrize(
    ("peers", "leads"),
    [
        ({}, True),
        ({"me": _peer(50, 0)}, True),
        ({"me": _peer(50, 0), "low": _peer(10, 0)}, True),
        ({"me": _peer(50, 0), "high": _peer(100, 5)}, False),
        ({"me": _peer(50, 0), "high": _peer(100, 61)}, True),  # its lifetime is over
        ({"me": _peer(50, 0), "twin": _peer(50, 5)}, False),  # kopf pauses both
        ({"me": _peer(50, 0), "broken": {"priority": 100}}, True),
    ],
)
def test_a_replica_leads_unless_a_live_peer_outranks_or_ties_it(peers, leads):
    assert resync.leading({"status": peers}, ME, NOW) is leads


def test_without_its_peering_object_a_replica_stands_by():
    assert resync.leading(None, ME, NOW) is False


class _NoApi:
    """Standalone resyncs read nothing from the API server."""

    async def get(self, *args: object) -> None:
        raise AssertionError("a standalone resync asked the API server")


async def test_a_resync_passes_over_every_run_once_and_survives_a_failing_one():
    refs = [{"metadata": {"name": n, "namespace": "team-a", "uid": f"uid-{n}"}} for n in "abc"]
    index: dict = {}
    for ref in refs:  # kopf's index: each run under its uid and its (namespace, name)
        index[ref["metadata"]["uid"]] = [ref]
        index[("team-a", ref["metadata"]["name"])] = [ref]
    seen: list[str] = []

    async def run_pass(ref: dict) -> None:
        seen.append(ref["metadata"]["name"])
        if ref["metadata"]["name"] == "a":
            raise RuntimeError("a bug in one pass")

    passes = await resync.resync_once(_NoApi(), index, run_pass, peering=None)
    assert sorted(seen) == ["a", "b", "c"] and passes == 3


class _PeeringApi:
    def __init__(self, peering: dict | None) -> None:
        self.peering = peering
        self.asked: list[tuple] = []

    async def get(self, kind: str, namespace: str | None, name: str) -> dict | None:
        self.asked.append((kind, namespace, name))
        return self.peering


async def test_a_standing_by_replica_makes_no_pass():
    ref = {"metadata": {"name": "a", "namespace": "team-a", "uid": "uid-a"}}
    seen: list[dict] = []

    async def run_pass(ref: dict) -> None:
        seen.append(ref)

    now = datetime.datetime.now(tz=datetime.UTC).isoformat()
    leader = {"status": {"other": {"priority": 100, "lifetime": 60, "lastseen": now}}}
    api = _PeeringApi(leader)
    other = {"metadata": {"name": "b", "namespace": "team-b", "uid": "uid-b"}}
    index = {"uid-a": [ref], "uid-b": [other]}
    assert await resync.resync_once(api, index, run_pass, peering=ME) == 0
    assert seen == [] and api.asked == [("ClusterKopfPeering", None, "aflow")]  # read once
    namespaced = resync.Peering(name="aflow", identity="me", priority=50, clusterwide=False)
    api = _PeeringApi({"status": {}})
    assert await resync.resync_once(api, {"uid-a": [ref]}, run_pass, peering=namespaced) == 1
    assert api.asked == [("KopfPeering", "team-a", "aflow")] and seen == [ref]
