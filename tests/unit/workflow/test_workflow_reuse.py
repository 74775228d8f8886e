"""Node-level reuse: an evaluation that reuses earlier draws equals a cold one, answer by answer.

The equivalence tests run the calibrated surrogate executor (deterministic given prompt and
seed) on real problems: every library workflow, then a chain of random admissible edits (the
search's own action enumeration), each evaluated by one warm evaluator whose node cache fills up
as it goes, and each again by a cold evaluator with an empty cache. Every sample's answer, score,
extracted answer, detail, error and call count must agree, and the warm side must really have
reused draws (else the comparison proves nothing). The scripted-executor tests pin down the
individual rules: seeds follow upstream hashes, twins stay independent, a growing fan-out keeps
its samples, a node downstream of an edit whose input texts came out the same is reused (but not
at another position, whose seeds differ), a stored failure names the reusing node, shared draws
are made once.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from aflowrl.benchmarks import get_benchmark
from aflowrl.benchmarks.base import Problem
from aflowrl.search.edits import admissible_actions
from aflowrl.workflow import EvaluationCache, EvaluationSettings, Evaluator, Graph, Node, library
from aflowrl.workflow.canonical import upstream_hashes

BENCHMARKS = {"math": "gsm8k", "qa": "hotpotqa", "code": "humaneval"}


def _signature(result) -> list[tuple]:
    return [
        (s.problem_id, s.sample, s.answer, s.score, s.extracted, s.detail, s.error, s.llm_calls)
        for s in result.samples
    ]


def _edit_chain(start: Graph, steps: int, rng: random.Random) -> list[Graph]:
    """Random admissible edits, each applied to a random earlier workflow (a search tree)."""
    tree = [start]
    for _ in range(steps):
        parent = tree[-1] if rng.random() < 0.6 else rng.choice(tree)
        candidates = admissible_actions(parent, 48)
        tree.append(rng.choice(list(candidates)).child)
    return tree


@pytest.fixture(scope="module")
def surrogate_problems(aflow_data) -> dict[str, list[Problem]]:
    return {
        task: get_benchmark(name).load("validate", aflow_data) for task, name in BENCHMARKS.items()
    }


@pytest.mark.parametrize(
    ("task_type", "problem_count", "repeats", "edits"),
    [
        ("math", 6, 2, 14),
        ("qa", 4, 2, 10),
        # Code runs every sample's tests in the sandbox: the slow suite's.
        pytest.param("code", 3, 1, 6, marks=pytest.mark.slow),
    ],
)
async def test_reusing_node_draws_equals_a_cold_evaluation_answer_by_answer(
    surrogate_problems, task_type, problem_count, repeats, edits
):
    from aflowrl.executor.surrogate import SurrogateExecutor

    split = surrogate_problems[task_type]
    benchmark = get_benchmark(BENCHMARKS[task_type])
    problems = random.Random(task_type).sample(split, problem_count)
    executor = SurrogateExecutor(split)
    graphs = [library.load(name, task_type) for name in library.NAMES]
    graphs += _edit_chain(graphs[0], edits, random.Random(f"edits-{task_type}"))[1:]

    warm = Evaluator(executor, benchmark, settings=EvaluationSettings(repeats=repeats))
    warm_calls = cold_calls = reused = 0
    for graph in graphs:
        reusing = await warm.evaluate(graph, problems)
        cold = await Evaluator(
            executor, benchmark, settings=EvaluationSettings(repeats=repeats, reuse_nodes=False)
        ).evaluate(graph, problems)
        assert _signature(reusing) == _signature(cold), graph.to_json()
        assert reusing.score_mean == cold.score_mean
        warm_calls += reusing.executor_calls
        cold_calls += cold.executor_calls
        reused += reusing.reused_calls
        assert reusing.executor_calls + reusing.reused_calls + _whole_run_hits(reusing) == (
            cold.executor_calls
        )
    assert reused > 0 and warm_calls + reused <= cold_calls
    assert warm_calls < 0.8 * cold_calls, (warm_calls, cold_calls)


def _whole_run_hits(result) -> int:
    return sum(s.llm_calls for s in result.samples if s.cached)


# ------------------------------------------------------------------ the rules, one by one
MATH = Problem("gsm8k", "p1", "What is 2 + 3?", "5")


def _answer(prompt: str, seed: int | None) -> str:
    if "<solution_letter>" in prompt:
        return "<solution_letter>A</solution_letter>"
    if "<review_result>" in prompt:
        return "<review_result>false</review_result><feedback>recheck</feedback>"
    if "inside <solution></solution>" in prompt:
        return "<solution>The answer is 5</solution>"
    return f"<answer>{(seed or 0) % 7}</answer>"


def _graph(samples: int, *, prompt: str = "Think step by step.", votes: int = 3) -> Graph:
    return Graph.from_dict(
        {
            "name": "g",
            "task_type": "math",
            "prompts": {"cot": prompt},
            "nodes": [
                {
                    "id": "generate",
                    "op": "Custom",
                    "inputs": {"input": ["problem"]},
                    "params": {"instruction": "cot", "samples": samples},
                },
                {
                    "id": "ensemble",
                    "op": "MdEnsemble",
                    "inputs": {"solutions": ["generate"]},
                    "params": {"votes": votes},
                },
            ],
            "output": "ensemble",
        }
    )


async def test_a_growing_fan_out_keeps_its_samples_and_votes(scripted_executor):
    executor = scripted_executor(_answer)
    evaluator = Evaluator(executor, get_benchmark("gsm8k"))
    first = await evaluator.evaluate(_graph(3), [MATH])
    assert first.executor_calls == 3 + 3
    grown = await evaluator.evaluate(_graph(5, votes=5), [MATH])
    # Samples 0-2 are reused; the pool changed, so every vote is new.
    assert (grown.executor_calls, grown.reused_calls) == (2 + 5, 3)
    more_votes = await evaluator.evaluate(_graph(5, votes=7), [MATH])
    assert (more_votes.executor_calls, more_votes.reused_calls) == (2, 5 + 5)
    cold = await Evaluator(scripted_executor(_answer), get_benchmark("gsm8k")).evaluate(
        _graph(5, votes=7), [MATH]
    )
    assert _signature(more_votes) == _signature(cold)


async def test_seeds_follow_the_upstream_subgraph_not_ids_or_neighbours(scripted_executor):
    graph = _graph(2)
    hashes = upstream_hashes(graph)
    renamed = graph.renamed({"generate": "draft", "ensemble": "pick"})
    assert upstream_hashes(renamed) == {
        {"generate": "draft", "ensemble": "pick"}[k]: v for k, v in hashes.items()
    }
    # A node added downstream leaves the generator's hashes alone...
    extended = graph.insert_after(
        "ensemble", Node.create("final", "Format", {"solution": "ensemble"})
    )
    assert upstream_hashes(extended)["generate"] == hashes["generate"]
    # ...and the sample count changes the node's hash but not its draws'.
    assert upstream_hashes(_graph(5))["generate"].draw == hashes["generate"].draw
    assert upstream_hashes(_graph(5))["generate"].node != hashes["generate"].node
    assert upstream_hashes(_graph(2, prompt="Be brief."))["generate"].draw != (
        hashes["generate"].draw
    )
    # Calls made by the extended graph's generator are the ones the original made.
    seen = []
    for g in (graph, extended):
        executor = scripted_executor(_answer)
        await Evaluator(executor, get_benchmark("gsm8k")).evaluate(g, [MATH])
        seen.append(sorted(c for c in executor.calls if "step by step" in c[0]))
    assert seen[0] == seen[1] and len(seen[0]) == 2


async def test_twin_generators_stay_independent_samples(scripted_executor):
    twins = Graph.from_dict(
        {
            "name": "twins",
            "task_type": "math",
            "prompts": {"cot": "Think step by step."},
            "nodes": [
                {"id": "a", "op": "Custom", "inputs": {"input": ["problem"]},
                 "params": {"instruction": "cot"}},
                {"id": "b", "op": "Custom", "inputs": {"input": ["problem"]},
                 "params": {"instruction": "cot"}},
                {"id": "pick", "op": "ScEnsemble", "inputs": {"solutions": ["a", "b"]}},
            ],
            "output": "pick",
        }
    )  # fmt: skip
    hashes = upstream_hashes(twins)
    assert hashes["a"].draw != hashes["b"].draw
    executor = scripted_executor(_answer)
    result = await Evaluator(executor, get_benchmark("gsm8k")).evaluate(twins, [MATH])
    seeds = [seed for prompt, seed in executor.calls if "step by step" in prompt]
    assert len(seeds) == 2 and len(set(seeds)) == 2
    assert result.executor_calls == 3 and result.reused_calls == 0


def _planned(plan_prompt: str) -> Graph:
    return Graph.from_dict(
        {
            "name": "planned",
            "task_type": "math",
            "prompts": {"plan": plan_prompt, "cot": "Think step by step."},
            "nodes": [
                {"id": "plan", "op": "Custom", "inputs": {"input": ["problem"]},
                 "params": {"instruction": "plan"}},
                {"id": "generate", "op": "Custom", "inputs": {"input": ["problem", "plan"]},
                 "params": {"instruction": "cot", "samples": 2}},
                {"id": "pick", "op": "MdEnsemble", "inputs": {"solutions": ["generate"]},
                 "params": {"votes": 3}},
            ],
            "output": "pick",
        }
    )  # fmt: skip


def _same_notes(prompt: str, seed: int | None) -> str:
    """Every planning prompt ("... Do not solve it yet.") gives one note; the rest as _answer."""
    if "Do not solve it yet." in prompt and "Result of an earlier step" not in prompt:
        return "Given: 2 and 3. Asked: their sum." if "Quietly" not in prompt else "Nothing."
    return _answer(prompt, seed)


async def test_nodes_whose_input_texts_come_out_the_same_are_reused_after_an_upstream_edit(
    scripted_executor,
):
    evaluator = Evaluator(scripted_executor(_same_notes), get_benchmark("gsm8k"))
    first = await evaluator.evaluate(_planned("List the givens. Do not solve it yet."), [MATH])
    assert first.executor_calls == 1 + 2 + 3
    # Another planning prompt: the graph (and every upstream hash after the plan) changed, but
    # the note reaching the generator is the same text, so its samples and the votes are reused.
    rewritten = _planned("Name the concepts needed. Do not solve it yet.")
    assert upstream_hashes(rewritten)["generate"] != upstream_hashes(_planned("x"))["generate"]
    edited = await evaluator.evaluate(rewritten, [MATH])
    assert (edited.executor_calls, edited.reused_calls) == (1, 2 + 3)
    cold = await Evaluator(scripted_executor(_same_notes), get_benchmark("gsm8k")).evaluate(
        rewritten, [MATH]
    )
    assert _signature(edited) == _signature(cold) and cold.executor_calls == 1 + 2 + 3
    # A plan whose note differs pays for the generator's samples; they answer as before (this
    # executor's answers follow the seed only), so the votes over them are reused again.
    quiet = _planned("Quietly list the givens. Do not solve it yet.")
    other = await evaluator.evaluate(quiet, [MATH])
    assert (other.executor_calls, other.reused_calls) == (1 + 2, 3)
    cold = await Evaluator(scripted_executor(_same_notes), get_benchmark("gsm8k")).evaluate(
        quiet, [MATH]
    )
    assert _signature(other) == _signature(cold)


async def test_the_same_inputs_at_another_position_are_drawn_afresh(scripted_executor):
    alone = Graph.from_dict(
        {
            "name": "alone",
            "task_type": "math",
            "prompts": {"cot": "Think step by step."},
            "nodes": [{"id": "gen", "op": "Custom", "inputs": {"input": ["problem"]},
                       "params": {"instruction": "cot"}}],
            "output": "gen",
        }
    )  # fmt: skip
    # The same generator on the same problem, after another branch in canonical order: its
    # calls are seeded by its new position, so the first graph's draw is not its draw.
    behind = Graph.from_dict(
        {
            "name": "behind",
            "task_type": "math",
            "prompts": {"cot": "Think step by step.", "brief": "Be brief."},
            "nodes": [
                {"id": "other", "op": "Custom", "inputs": {"input": ["problem"]},
                 "params": {"instruction": "brief"}},
                {"id": "gen", "op": "Custom", "inputs": {"input": ["problem"]},
                 "params": {"instruction": "cot"}},
                {"id": "pick", "op": "ScEnsemble", "inputs": {"solutions": ["other", "gen"]}},
            ],
            "output": "pick",
        }
    )  # fmt: skip
    assert upstream_hashes(behind)["gen"].position != upstream_hashes(alone)["gen"].position
    evaluator = Evaluator(scripted_executor(_answer), get_benchmark("gsm8k"))
    await evaluator.evaluate(alone, [MATH])
    warm = await evaluator.evaluate(behind, [MATH])
    cold = await Evaluator(scripted_executor(_answer), get_benchmark("gsm8k")).evaluate(
        behind, [MATH]
    )
    assert (warm.executor_calls, warm.reused_calls) == (3, 0)
    assert _signature(warm) == _signature(cold)


async def test_a_reused_failure_names_the_node_that_reuses_it(scripted_executor):
    def mumble(prompt: str, seed: int | None) -> str:
        return "no tags at all" if "<review_result>" in prompt else _answer(prompt, seed)

    def chain(ids: list[str], ops: list[str]) -> Graph:
        nodes = [{"id": ids[0], "op": "Custom", "inputs": {"input": ["problem"]}}]
        nodes += [
            {"id": i, "op": op, "inputs": {"solution": before}}
            for before, i, op in zip(ids, ids[1:], ops, strict=False)
        ]
        return Graph.from_dict(
            {"name": "f", "task_type": "math", "nodes": nodes, "output": ids[-1]}
        )

    evaluator = Evaluator(scripted_executor(mumble), get_benchmark("gsm8k"))
    first = await evaluator.evaluate(chain(["gen", "refine"], ["ReviseLoop"]), [MATH])
    assert first.samples[0].error and "'refine' (ReviseLoop)" in first.samples[0].error
    other = chain(["think", "loop", "final"], ["ReviseLoop", "Format"])
    reused = await evaluator.evaluate(other, [MATH])
    cold = await Evaluator(scripted_executor(mumble), get_benchmark("gsm8k")).evaluate(
        other, [MATH]
    )
    assert (reused.reused_calls, reused.executor_calls) == (2, 0)
    assert _signature(reused) == _signature(cold)
    assert "'loop' (ReviseLoop)" in (reused.samples[0].error or "")


async def test_concurrent_evaluations_make_a_shared_draw_once(scripted_executor):
    executor = scripted_executor(_answer, delay_s=0.01)
    evaluator = Evaluator(executor, get_benchmark("gsm8k"))
    results = await asyncio.gather(
        evaluator.evaluate(_graph(3, votes=3), [MATH]),
        evaluator.evaluate(_graph(3, votes=5), [MATH]),
    )
    generate_calls = [c for c in executor.calls if "step by step" in c[0]]
    assert len(generate_calls) == 3
    # The same pool in both: votes 0-2 are shared too, only votes 3 and 4 are the second's own.
    assert sum(r.executor_calls for r in results) == len(executor.calls) == 3 + 3 + 2


async def test_draws_persist_in_the_sqlite_cache(scripted_executor, tmp_path):
    path = tmp_path / "cache.sqlite"
    with EvaluationCache(path) as cache:
        await Evaluator(scripted_executor(_answer), get_benchmark("gsm8k"), cache=cache).evaluate(
            _graph(3), [MATH]
        )
        assert cache.draw_count == 3 + 3
    with EvaluationCache(path) as cache:
        executor = scripted_executor(_answer)
        grown = await Evaluator(executor, get_benchmark("gsm8k"), cache=cache).evaluate(
            _graph(4), [MATH]
        )
    assert grown.reused_calls == 3 and grown.executor_calls == 1 + 3
