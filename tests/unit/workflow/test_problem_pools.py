"""Problem pools: disjoint, stable, sized by their shares, in split order."""

from __future__ import annotations

import pytest

from aflowrl.benchmarks.base import Problem
from aflowrl.errors import InvalidInputError
from aflowrl.workflow import pool_problems
from aflowrl.workflow.evaluator import pool_size


def _problems(count: int) -> list[Problem]:
    return [Problem("gsm8k", f"p{i}", f"q{i}", str(i)) for i in range(count)]


def _pools(problems, held_out=0.3, tuning=0.2, benchmark="gsm8k"):
    return {
        pool: pool_problems(problems, pool, benchmark=benchmark, held_out=held_out, tuning=tuning)
        for pool in ("training", "tuning", "held_out")
    }


def test_pools_are_disjoint_cover_the_split_and_keep_its_order():
    problems = _problems(119)
    pools = _pools(problems)
    ids = {name: [p.problem_id for p in members] for name, members in pools.items()}
    assert [len(v) for v in ids.values()] == [119 - 36 - 24, 24, 36]
    assert sorted(i for v in ids.values() for i in v) == sorted(p.problem_id for p in problems)
    order = {p.problem_id: i for i, p in enumerate(problems)}
    for members in ids.values():
        assert [order[i] for i in members] == sorted(order[i] for i in members)
    assert pool_problems(problems, "all", benchmark="gsm8k", held_out=0.3, tuning=0.2) == problems


def test_a_problem_keeps_its_pool_whatever_else_is_loaded():
    """Pools follow each problem's (benchmark, id), so a replica with more problems (or the
    same ones in another order) agrees on every problem both have."""
    problems = _problems(60)
    pools = _pools(problems)
    shuffled = _pools(list(reversed(problems)))
    for name in pools:
        assert {p.problem_id for p in pools[name]} == {p.problem_id for p in shuffled[name]}
    other = _pools(problems, benchmark="math")
    assert {p.problem_id for p in other["held_out"]} != {p.problem_id for p in pools["held_out"]}


def test_sizes_round_and_a_pool_asked_for_is_never_empty():
    assert pool_size(0.2, 33) == 7 and pool_size(0.01, 33) == 1 and pool_size(0.0, 33) == 0
    with pytest.raises(InvalidInputError, match="no tuning pool"):
        pool_problems(_problems(33), "tuning", benchmark="x", held_out=0.2, tuning=0.0)
    with pytest.raises(InvalidInputError, match="none of"):
        pool_problems(_problems(2), "training", benchmark="x", held_out=0.5, tuning=0.4)
    with pytest.raises(InvalidInputError, match="is not one of"):
        pool_problems(_problems(4), "test", benchmark="x", held_out=0.2, tuning=0.0)


def test_consecutive_task_seeds_take_disjoint_chunks_of_the_test_split():
    from aflowrl.workflow.evaluator import disjoint_chunk

    problems = _problems(486)  # MATH's test split
    chunks = [disjoint_chunk(problems, 20, 2**31 + k, benchmark="math") for k in range(24)]
    ids = [{p.problem_id for p in c} for c in chunks]
    assert all(len(c) == 20 for c in ids)
    assert len(set().union(*ids)) == 24 * 20  # no problem in two tasks
    order = {p.problem_id: i for i, p in enumerate(problems)}
    assert all(
        [order[p.problem_id] for p in c] == sorted(order[p.problem_id] for p in c) for c in chunks
    )
    again = disjoint_chunk(list(reversed(problems)), 20, 2**31 + 3, benchmark="math")
    assert {p.problem_id for p in again} == ids[3]  # stable whatever the load order
    assert disjoint_chunk(problems, None, 5, benchmark="math") == problems


def test_an_episodes_problems_are_ranked_once_and_the_same_as_ranked_afresh(monkeypatch):
    """Every Step derives its episode's problems again: the ranking of a split by stable hash
    is computed once per (split, benchmark) and gives exactly what hashing afresh gives."""
    from aflowrl import seeding
    from aflowrl.workflow import evaluator

    problems = _problems(1055)  # GSM8K's test split
    problems.insert(500, Problem("gsm8k", "p7", "again", "7"))  # a repeated id keeps its place
    fresh_chunk = sorted(problems, key=lambda p: seeding.stable_hash("chunk", "g2", p.problem_id))
    fresh_pool = sorted(problems, key=lambda p: seeding.stable_hash("pool", "g2", p.problem_id))
    calls = []

    def counted(*parts):
        calls.append(parts)
        return seeding.stable_hash(*parts)

    monkeypatch.setattr(evaluator, "stable_hash", counted)
    for seed in (0, 1, 0, 52):
        chunk = evaluator.disjoint_chunk(problems, 20, seed, benchmark="g2")
        start = (seed % (len(problems) // 20)) * 20
        ids = {p.problem_id for p in fresh_chunk[start : start + 20]}
        assert chunk == [p for p in problems if p.problem_id in ids]
    for _ in range(3):
        held = pool_problems(problems, "held_out", benchmark="g2", held_out=0.3, tuning=0.2)
        chosen = {id(p) for p in fresh_pool[: pool_size(0.3, len(problems))]}
        assert held == [p for p in problems if id(p) in chosen]
    assert len(calls) == 2 * len(problems)  # one ranking per salt, whatever the calls
