"""The edit-action language: parsing, canonical text, applying edits, admissible actions."""

from __future__ import annotations

import pytest

from aflowrl.search import InvalidActionError, admissible_actions, apply_action, parse_action
from aflowrl.search.actions import AddNode, RemoveNode, SetParam, SetPrompt, WrapLoop
from aflowrl.workflow import Graph, library

SEED = library.load("seed", "math")
COT_SC = library.load("cot_sc", "math")

CANONICAL = [
    "add ScEnsemble after generate samples=5",
    "add MdEnsemble after generate samples=3 votes=5",
    'add Format after generate prompt="Only the number."',
    'add Custom before generate prompt="Plan first."',
    "add Programmer alongside generate",
    "remove ensemble",
    "set generate samples=7",
    'set_prompt generate "Solve it step by step.\\nThen check."',
    "replace generate with AnswerGenerate",
    "wrap generate in review_revise max_rounds=2",
    "wrap generate in test_fix",
]


@pytest.mark.parametrize("text", CANONICAL)
def test_canonical_text_round_trips(text):
    assert parse_action(text).text() == text


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("ADD scensemble AFTER generate SAMPLES = 5", "add ScEnsemble after generate samples=5"),
        ("delete ensemble.", "remove ensemble"),
        (
            "add ReviseLoop after generate max_rounds=2",
            "wrap generate in review_revise max_rounds=2",
        ),
        ("add Test after generate", "wrap generate in test_fix"),
        ('set generate prompt = "Be brief."', 'set_prompt generate "Be brief."'),
        ('rewrite_prompt generate "x  y"', 'set_prompt generate "x  y"'),
        ('set_prompt generate = "with equals"', 'set_prompt generate "with equals"'),
        ('set_prompt generate "multi\nline"', 'set_prompt generate "multi\\nline"'),
    ],
)
def test_aliases_and_spelling_read_as_the_canonical_form(text, canonical):
    assert parse_action(text).text() == canonical


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("explode generate", "unknown verb"),
        ("add Magic after generate", "unknown operator"),
        ("add ScEnsemble behind generate", "unknown position"),
        ("add ScEnsemble after", "ends where a node id"),
        ("remove Generate!", "unexpected character"),
        ("set generate samples=five", "whole number"),
        ("set generate samples=99999999", "whole number"),
        ("set generate samples=3 votes=2", "one change per action"),
        ("set generate colour=3", "unknown parameter"),
        ('set_prompt generate "unterminated', "unterminated string"),
        ('set_prompt generate ""', "prompt is empty"),
        ('set_prompt generate "bell\\u0007"', "control character"),
        ("remove generate now", "unexpected 'now'"),
        ("wrap generate in loop", "unknown loop"),
        ("add ScEnsemble after generate samples=3 samples=4", "given twice"),
        ("x" * 20_000, "at most"),
    ],
)
def test_malformed_actions_say_what_is_wrong(text, reason):
    with pytest.raises(InvalidActionError, match=reason):
        parse_action(text)


def _ops(graph: Graph) -> list[str]:
    return [n.op for n in graph.topological()]


def test_an_ensemble_after_a_generator_sets_its_fan_out():
    child = apply_action(SEED, parse_action("add ScEnsemble after generate"))
    assert _ops(child) == ["Custom", "ScEnsemble"]
    assert child.node("generate").samples == 5 and child.output == "ensemble"
    md = apply_action(SEED, parse_action("add MdEnsemble after generate votes=7"))
    assert md.node("generate").samples == 3 and md.node("ensemble").param_dict()["votes"] == 7


def test_removing_the_ensemble_of_a_fan_out_undoes_it():
    child = apply_action(COT_SC, RemoveNode("ensemble"))
    assert _ops(child) == ["Custom"] and child.node("generate").samples == 1
    assert child.content_hash == library.load("cot", "math").content_hash


def test_steps_before_and_alongside_are_wired_as_described():
    plan = apply_action(SEED, parse_action('add Custom before generate prompt="Plan it."'))
    assert plan.node("generate").inputs["input"] == ("problem", "plan")
    assert plan.prompts[plan.node("plan").instruction or ""] == "Plan it."
    # Removing a context step drops the reference, whatever it read.
    assert apply_action(plan, RemoveNode("plan")).content_hash == SEED.content_hash
    both = apply_action(COT_SC, parse_action("add Programmer alongside generate"))
    assert both.node("ensemble").inputs["solutions"] == ("generate", "program")
    assert both.node("program").inputs["input"] == ("problem",)
    assert apply_action(both, RemoveNode("program")).content_hash == COT_SC.content_hash


def test_refine_loop_and_format_steps_follow_their_target():
    refine = apply_action(SEED, parse_action('add Custom after generate prompt="Check it."'))
    assert refine.node("refine").inputs["input"] == ("problem", "generate")
    assert refine.output == "refine"
    loop = apply_action(SEED, WrapLoop("generate", "review_revise", 2))
    assert loop.node(loop.output).op == "ReviseLoop"
    code = library.load("seed", "code")
    tested = apply_action(code, WrapLoop("generate", "test_fix"))
    assert tested.node(tested.output).op == "Test"
    fmt = apply_action(SEED, AddNode("Format", "after", "generate"))
    assert fmt.node(fmt.output).op == "Format"


def test_replace_keeps_inputs_and_what_the_new_operator_takes():
    qa = library.load("seed", "qa")
    answer = apply_action(qa, parse_action("replace generate with AnswerGenerate"))
    assert answer.node("generate").op == "AnswerGenerate" and not answer.prompts
    sc = apply_action(COT_SC, parse_action("replace ensemble with MdEnsemble"))
    assert sc.node("ensemble").op == "MdEnsemble" and sc.node("generate").samples == 5


@pytest.mark.parametrize(
    ("graph", "action", "reason"),
    [
        (SEED, RemoveNode("missing"), "no node 'missing'"),
        (SEED, RemoveNode("generate"), "reads only the problem"),
        (SEED, SetParam("generate", "samples", 5), "would be invalid"),
        (SEED, SetParam("generate", "votes", 5), "has no parameter votes"),
        (COT_SC, SetParam("generate", "samples", 99), "would be invalid"),
        (SEED, SetPrompt("generate", library.load("seed", "math").prompts["solve"]), "nothing"),
        (COT_SC, SetPrompt("ensemble", "x"), "takes no instruction"),
        (COT_SC, AddNode("ScEnsemble", "after", "ensemble"), "single solution"),
        (SEED, AddNode("Review", "after", "generate"), "review_revise"),
        (SEED, AddNode("Custom", "alongside", "generate"), "feeds none"),
        (SEED, AddNode("CustomCodeGenerate", "after", "generate"), "not available for math"),
        (SEED, WrapLoop("generate", "test_fix"), "code workflows only"),
        (SEED, AddNode("Format", "after", "generate", (("samples", 3),)), "cannot be set"),
        (SEED, AddNode("AnswerGenerate", "after", "generate", prompt="x"), "takes no prompt"),
    ],
)
def test_edits_that_do_not_apply_say_why(graph, action, reason):
    with pytest.raises(InvalidActionError, match=reason):
        apply_action(graph, action)


@pytest.mark.parametrize("task", ["math", "qa", "code"])
@pytest.mark.parametrize("name", ["seed", "cot", "cot_sc", "medprompt", "self_refine"])
def test_admissible_actions_are_valid_distinct_and_reproducible(task, name):
    graph = library.load(name, task)
    listed = admissible_actions(graph, 512)
    assert listed, "every library workflow can be edited"
    hashes = [c.child.content_hash for c in listed]
    assert len(set(hashes)) == len(hashes) and graph.content_hash not in hashes
    for candidate in listed:
        again = apply_action(graph, parse_action(candidate.text))
        assert again.content_hash == candidate.child.content_hash
    # The same workflow (even a fresh copy) always lists the same actions.
    copy = Graph.from_json(graph.to_json())
    assert [c.text for c in admissible_actions(copy, 512)] == [c.text for c in listed]


def test_a_bounded_list_keeps_every_family_in_enumeration_order():
    big = library.load("self_refine", "math")
    for _ in range(3):
        big = apply_action(big, admissible_actions(big, 512)[0].action)
    full = admissible_actions(big, 512)
    limited = admissible_actions(big, 8)
    assert len(full) > 8 and len(limited) == 8
    order = [c.text for c in full]
    assert [order.index(c.text) for c in limited] == sorted(order.index(c.text) for c in limited)
    families = {c.family for c in full}
    assert len({c.family for c in limited}) == min(8, len(families))
    assert [c.text for c in admissible_actions(big, 8)] == [c.text for c in limited]


def test_a_plan_step_gets_plan_prompts_and_its_generator_keeps_generate_prompts():
    from aflowrl.search.prompt_library import prompts_for

    plan = apply_action(SEED, parse_action('add Custom before generate prompt="Plan it."'))
    texts = [c.text for c in admissible_actions(plan, 512)]
    prompts = {a.node: a.prompt for a in map(parse_action, texts) if isinstance(a, SetPrompt)}
    offered = {
        node: {
            a.prompt
            for a in map(parse_action, texts)
            if isinstance(a, SetPrompt) and a.node == node
        }
        for node in prompts
    }
    assert offered["plan"] == set(prompts_for("math", "plan"))
    assert offered["generate"] <= set(prompts_for("math", "generate"))
    assert not any(
        t.startswith(("add ScEnsemble after plan", "add Format after plan")) for t in texts
    )
