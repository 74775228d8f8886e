"""The workflow graph: validation errors name node and field, JSON round trips, edits."""

from __future__ import annotations

import json

import pytest

from aflowrl.workflow import Graph, Node, WorkflowValidationError, library
from aflowrl.workflow.ops import OPS, describe_operators


def _doc(**changes):
    doc = {
        "name": "cot_sc",
        "task_type": "math",
        "prompts": {"cot": "Solve step by step."},
        "nodes": [
            {
                "id": "generate",
                "op": "Custom",
                "inputs": {"input": ["problem"]},
                "params": {"instruction": "cot", "samples": 5},
            },
            {"id": "ensemble", "op": "ScEnsemble", "inputs": {"solutions": ["generate"]}},
        ],
        "output": "ensemble",
    }
    doc.update(changes)
    return doc


def _problems(doc) -> list[tuple[str, str]]:
    with pytest.raises(WorkflowValidationError) as info:
        Graph.from_dict(doc)
    return list(info.value.problems)


def test_a_valid_graph_round_trips_through_json():
    graph = Graph.from_dict(_doc())
    again = Graph.from_json(graph.to_json())
    assert again == graph
    assert again.to_dict() == graph.to_dict()
    assert graph.node("generate").samples == 5
    assert graph.node("ensemble").output_kind == "solution"
    assert graph.max_llm_calls() == 6


def test_a_single_slot_takes_a_string_and_a_list_of_one():
    doc = _doc(
        nodes=[
            {"id": "a", "op": "Custom", "inputs": {"input": "problem"}},
            {"id": "b", "op": "Review", "inputs": {"solution": ["a"]}},
            {"id": "c", "op": "Revise", "inputs": {"solution": "a", "feedback": "b"}},
        ],
        output="c",
    )
    graph = Graph.from_dict(doc)
    assert graph.node("b").inputs["solution"] == ("a",)
    assert graph.to_dict()["nodes"][1]["inputs"] == {"solution": "a"}


@pytest.mark.parametrize(
    ("node_changes", "field", "words"),
    [
        ({"op": "Teleport"}, "nodes[1] 'ensemble'.op", "unknown operator"),
        ({"params": {"votes": 3}}, "nodes[1] 'ensemble' (ScEnsemble).params.votes", "Extra"),
        ({"inputs": {"solutions": ["nowhere"]}}, "(ScEnsemble).inputs.solutions", "unknown node"),
        ({"inputs": {"solution": "generate"}}, "(ScEnsemble).inputs.solution", "no input"),
        ({"inputs": {}}, "(ScEnsemble).inputs.solutions", "missing"),
        ({"id": "Bad Id"}, "nodes[1] 'Bad Id' (ScEnsemble).id", "not a name"),
        ({"id": "problem"}, "nodes[1] 'problem' (ScEnsemble).id", "reserved"),
        ({"inputs": {"solutions": ["problem"]}}, "inputs.solutions", "cannot read the problem"),
        ({"extra": 1}, "nodes[1] 'ensemble' (ScEnsemble).extra", "unknown field"),
    ],
)
def test_node_errors_name_the_node_and_field(node_changes, field, words):
    doc = _doc()
    doc["nodes"][1].update(node_changes)
    problems = _problems(doc)
    assert any(field in f and words in m for f, m in problems), problems


def test_param_bounds_are_checked_with_the_field_named():
    doc = _doc()
    doc["nodes"][0]["params"]["samples"] = 99
    [(field, message)] = _problems(doc)
    assert field == "nodes[0] 'generate' (Custom).params.samples"
    assert "16" in message


def test_kinds_are_checked_candidates_cannot_be_reviewed():
    doc = _doc(
        nodes=[
            {"id": "gen", "op": "Custom", "inputs": {"input": "problem"}, "params": {"samples": 3}},
            {"id": "review", "op": "Review", "inputs": {"solution": "gen"}},
            {"id": "fix", "op": "Revise", "inputs": {"solution": "gen", "feedback": "review"}},
        ],
        output="fix",
    )
    problems = _problems(doc)
    assert any(
        f == "nodes[1] 'review' (Review).inputs.solution" and "candidates" in m and "samples=1" in m
        for f, m in problems
    ), problems


def test_a_verdict_is_no_answer_and_no_feedback_comes_from_a_solution():
    doc = _doc(
        nodes=[
            {"id": "gen", "op": "Custom", "inputs": {"input": "problem"}},
            {"id": "review", "op": "Review", "inputs": {"solution": "gen"}},
        ],
        output="review",
    )
    assert any(f == "output" and "verdict" in m for f, m in _problems(doc))
    doc = _doc(
        nodes=[
            {"id": "gen", "op": "Custom", "inputs": {"input": "problem"}},
            {"id": "fix", "op": "Revise", "inputs": {"solution": "gen", "feedback": "gen"}},
        ],
        output="fix",
    )
    assert any("(Revise).inputs.feedback" in f and "verdict" in m for f, m in _problems(doc))


def test_graph_level_errors():
    doc = _doc(output="missing")
    assert ("output", "references unknown node 'missing'") in _problems(doc)

    doc = _doc()
    doc["nodes"].append({"id": "generate", "op": "Custom", "inputs": {"input": "problem"}})
    assert any(f.endswith(".id") and "duplicate" in m for f, m in _problems(doc))

    doc = _doc()
    doc["nodes"].append({"id": "spare", "op": "Custom", "inputs": {"input": "problem"}})
    assert any(f == "nodes[2] 'spare' (Custom)" and "unused" in m for f, m in _problems(doc))

    doc = _doc(prompts={})
    assert any(
        f == "nodes[0] 'generate' (Custom).params.instruction" and "'cot'" in m
        for f, m in _problems(doc)
    )

    doc = _doc(task_type="chess")
    assert any(f == "task_type" for f, _ in _problems(doc))

    doc = _doc(nodes=[], unexpected=True)
    fields = [f for f, _ in _problems(doc)]
    assert "nodes" in fields and "unexpected" in fields


def test_cycles_are_rejected():
    doc = _doc(
        nodes=[
            {"id": "a", "op": "Custom", "inputs": {"input": ["problem", "b"]}},
            {"id": "b", "op": "Custom", "inputs": {"input": ["a"]}},
        ],
        output="b",
    )
    assert any(f == "nodes" and "cycle" in m for f, m in _problems(doc))


def test_operators_are_limited_to_their_task_types():
    doc = _doc(
        nodes=[{"id": "code", "op": "CustomCodeGenerate", "inputs": {"input": "problem"}}],
        output="code",
        prompts={},
    )
    assert any(
        f == "nodes[0] 'code' (CustomCodeGenerate).op" and "math" in m for f, m in _problems(doc)
    )


def test_ensembles_take_at_most_26_candidates_and_runs_are_bounded():
    doc = _doc()
    doc["nodes"][0]["params"]["samples"] = 16
    doc["nodes"][1]["inputs"]["solutions"] = ["generate", "generate"]
    assert any("32 candidates" in m for _, m in _problems(doc))

    doc = _doc(
        nodes=[
            {
                "id": "gen",
                "op": "Custom",
                "inputs": {"input": "problem"},
                "params": {"samples": 16},
            },
            {
                "id": "vote",
                "op": "MdEnsemble",
                "inputs": {"solutions": ["gen"]},
                "params": {"votes": 15},
            },
        ]
        + [
            {
                "id": f"r{i}",
                "op": "ReviseLoop",
                "inputs": {"solution": "vote" if i == 0 else f"r{i - 1}"},
                "params": {"max_rounds": 5},
            }
            for i in range(24)
        ],
        output="r23",
    )
    assert any(f == "nodes" and "executor calls" in m for f, m in _problems(doc))


def test_json_syntax_errors_give_line_and_column():
    with pytest.raises(WorkflowValidationError, match=r"line 2: not JSON: .*\(column \d+\)"):
        Graph.from_json('{"name": "x",\n "nodes": [}')
    with pytest.raises(WorkflowValidationError, match="a workflow must be a JSON object"):
        Graph.from_json("[1, 2]")


def test_many_problems_are_all_reported():
    doc = _doc()
    doc["nodes"][0]["params"]["samples"] = 0
    doc["nodes"][1]["op"] = "Nope"
    problems = _problems(doc)
    assert len(problems) == 2
    with pytest.raises(WorkflowValidationError, match="2 problems"):
        Graph.from_dict(doc)


@pytest.mark.parametrize("task_type", ["math", "code", "qa"])
@pytest.mark.parametrize("name", library.NAMES)
def test_every_library_workflow_loads(name, task_type):
    graph = library.load(name, task_type)
    assert graph.name == name and graph.task_type == task_type
    assert graph.description


def test_library_shapes_match_the_paper_baselines():
    assert [n.op for n in library.load("seed", "math").nodes] == ["Custom"]
    sc = library.load("cot_sc", "code")
    assert sc.node("generate").samples == 5 and sc.node(sc.output).op == "ScEnsemble"
    med = library.load("medprompt", "qa")
    assert med.node("generate").samples == 3
    assert med.node(med.output).params.model_dump() == {"votes": 5}
    refine = library.load("self_refine", "math")
    assert refine.node(refine.output).op == "ReviseLoop"
    assert refine.node(refine.output).params.model_dump() == {"max_rounds": 3}


def test_library_resolve_reads_files_and_checks_the_task(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(_doc()))
    assert library.resolve(str(path), "math").name == "cot_sc"
    with pytest.raises(Exception, match="needs qa"):
        library.resolve(str(path), "qa")
    with pytest.raises(Exception, match="neither a library workflow"):
        library.resolve("nonexistent", "qa")


def test_insert_after_rewires_readers_and_output():
    graph = library.load("cot", "math")
    with pytest.raises(WorkflowValidationError, match="candidates"):
        graph.with_params("generate", samples=5)  # alone, the answer would be 5 candidates
    ensemble = Node.create("ensemble", "ScEnsemble", {"solutions": ["generate"]})
    graph = graph.draft().set_params("generate", samples=5).insert_after("generate", ensemble)
    graph = graph.build()
    assert graph.output == "ensemble"
    assert graph.content_hash == library.load("cot_sc", "math").content_hash
    refine = Node.create("refine", "ReviseLoop", {"solution": "ensemble"}, max_rounds=2)
    graph = graph.insert_after("ensemble", refine)
    assert graph.output == "refine"
    assert [n.id for n in graph.topological()] == ["generate", "ensemble", "refine"]
    fmt = Node.create("final", "Format", {"solution": "ensemble"})
    graph = graph.insert_after("ensemble", fmt)
    assert graph.node("refine").inputs["solution"] == ("final",)


def test_insert_after_requires_reading_the_target():
    graph = library.load("cot", "math")
    with pytest.raises(WorkflowValidationError, match="must read 'generate'"):
        graph.insert_after("generate", Node.create("x", "Custom", {"input": "problem"}))


def test_remove_reconnects_or_explains():
    graph = library.load("self_refine", "qa").remove("refine")
    assert graph.output == "generate" and len(graph.nodes) == 1
    with pytest.raises(WorkflowValidationError, match="reads only the problem"):
        library.load("cot", "qa").remove("generate")
    # Removing the ensemble would make the answer a set of candidates: the validator says so.
    with pytest.raises(WorkflowValidationError, match="candidates"):
        library.load("cot_sc", "math").remove("ensemble")


def test_param_and_prompt_edits():
    graph = library.load("cot_sc", "math")
    assert graph.with_params("generate", samples=3).node("generate").samples == 3
    assert graph.with_params("generate", samples=None).node("generate").samples == 1
    with pytest.raises(WorkflowValidationError, match=r"params\.samples"):
        graph.with_params("generate", samples=100)
    edited = graph.with_instruction("generate", "Think hard.")
    assert edited.prompts == {"cot": "Think hard."}
    io = library.load("io", "math").with_instruction("generate", "Be brief.")
    assert io.prompts == {"generate": "Be brief."}
    assert io.node("generate").instruction == "generate"
    with pytest.raises(WorkflowValidationError, match="takes no instruction"):
        graph.with_instruction("ensemble", "x")
    with pytest.raises(WorkflowValidationError, match="no node 'nope'"):
        graph.node("nope")


def test_unique_ids_stay_readable():
    graph = library.load("cot_sc", "math")
    assert graph.unique_id("review") == "review"
    assert graph.unique_id("generate") == "generate_2"
    assert graph.unique_id("Problem") == "problem_2"
    assert graph.unique_id("9lives") == "n_9lives"


def test_operator_descriptions_cover_every_operator():
    text = describe_operators()
    for name in OPS:
        assert f"- {name}:" in text
    assert "CustomCodeGenerate" not in describe_operators("math")
