"""Applying edit actions to workflow graphs, and enumerating the admissible ones.

:func:`apply_action` turns a parent graph and an :data:`~aflowrl.search.actions.EditAction`
into the child graph, or raises :class:`~aflowrl.search.errors.InvalidActionError` with a reason
the policy can read (the node that does not exist, the operator that does not fit there, the
validator's complaint about the result, or "changes nothing").

:func:`admissible_actions` lists, for one graph, the actions the policy may choose from: every
edit the enumeration proposes (ensembles after generators, a final Format, a refine step, a
plan before a generator, another generator alongside an ensembled one, loops, removals,
neighbouring parameter values, prompt rewrites from :mod:`aflowrl.search.prompt_library`,
operator swaps) that yields a valid graph different from the parent, deduplicated by the
child's canonical hash (the first action in enumeration order names each child). When more
than ``limit`` remain, a bounded subset is kept that takes actions from every family in turn
(the choice within a family is shuffled by a seed derived from the parent's hash), listed in
enumeration order. The list depends only on the graph and the limit, so the same workflow
always offers the same actions: GiGPO's step groups compare like with like.

Used by the episode state machine (:mod:`aflowrl.search.episode`), the projection and the
random proposer.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from aflowrl.search import prompt_library
from aflowrl.search.actions import (
    AddNode,
    EditAction,
    RemoveNode,
    ReplaceOp,
    SetParam,
    SetPrompt,
    WrapLoop,
)
from aflowrl.search.errors import InvalidActionError
from aflowrl.seeding import derive_seed
from aflowrl.workflow import OPS, Graph, Node, WorkflowValidationError
from aflowrl.workflow.graph import Draft
from aflowrl.workflow.ops import PROBLEM, OpName

ENSEMBLES: Final[frozenset[str]] = frozenset({"ScEnsemble", "MdEnsemble"})
GENERATORS: Final[tuple[OpName, ...]] = (
    "Custom",
    "AnswerGenerate",
    "CustomCodeGenerate",
    "Programmer",
)
_DEFAULT_FAN_OUT: Final = {"ScEnsemble": 5, "MdEnsemble": 3}
_LADDERS: Final[dict[str, tuple[int, ...]]] = {
    "samples": (1, 2, 3, 5, 7, 10, 15),
    "votes": (1, 3, 5, 7, 9, 15),
    "max_rounds": (1, 2, 3, 4, 5),
    "max_attempts": (1, 2, 3, 4, 5),
}
_BASE_IDS: Final[dict[str, str]] = {
    "ScEnsemble": "ensemble",
    "MdEnsemble": "ensemble",
    "Format": "format",
    "AnswerGenerate": "answer",
    "Programmer": "program",
    "CustomCodeGenerate": "code",
    "ReviseLoop": "revise",
    "Test": "test",
}


def _fail(message: str) -> InvalidActionError:
    return InvalidActionError(message)


def _node(graph: Graph, node_id: str) -> Node:
    if node_id not in graph:
        known = ", ".join(n.id for n in graph.nodes)
        raise _fail(f"no node {node_id!r} in the workflow (nodes: {known})")
    return graph.node(node_id)


def _has_field(op: str, name: str) -> bool:
    return name in OPS[op].params.model_fields


def _available(graph: Graph, op: OpName) -> None:
    if graph.task_type not in OPS[op].tasks:
        raise _fail(f"{op} is not available for {graph.task_type} workflows")


def _only(action: AddNode, allowed: set[str], why: str) -> None:
    extra = [name for name, _ in action.params if name not in allowed]
    if extra:
        raise _fail(f"{', '.join(extra)} cannot be set here ({why})")


def _new_id(draft: Draft, op: str, position: str) -> str:
    if op == "Custom":
        base = {"after": "refine", "before": "plan"}.get(position, "custom")
    else:
        base = _BASE_IDS.get(op, op.lower())
    return draft.unique_id(base)


def _instruction(draft: Draft, node_id: str, op: str, prompt: str | None) -> dict[str, Any]:
    """The ``instruction`` parameter of a new node, its text added to the prompt table."""
    if prompt is None:
        return {}
    if not _has_field(op, "instruction"):
        raise _fail(f"{op} takes no prompt")
    name, k = node_id, 2
    while name in draft.prompts:
        name, k = f"{node_id}_{k}", k + 1
    draft.set_prompt(name, prompt)
    return {"instruction": name}


def _ensemble_readers(graph: Graph, node_id: str) -> list[Node]:
    return [n for n, slot in graph.consumers(node_id) if n.op in ENSEMBLES and slot == "solutions"]


# ---------------------------------------------------------------------------------- apply
def _add_after(graph: Graph, action: AddNode) -> Graph:
    target = _node(graph, action.node)
    op = action.op
    if op not in ("Review", "Revise"):
        _available(graph, op)
    draft = graph.draft()
    new_id = _new_id(draft, op, "after")
    params: dict[str, Any] = {}
    if op in ENSEMBLES:
        _only(action, {"samples", "votes"} if op == "MdEnsemble" else {"samples"}, op)
        if not target.spec.generates:
            raise _fail(
                f"{op} after {target.id!r} would pool a single solution; put it after a "
                "generating node (Custom, AnswerGenerate, CustomCodeGenerate, Programmer)"
            )
        fan_out = action.param("samples") or (
            target.samples if target.samples > 1 else _DEFAULT_FAN_OUT[op]
        )
        if fan_out < 2:
            raise _fail("an ensemble needs samples of at least 2")
        draft.set_params(target.id, samples=fan_out)
        if action.param("votes") is not None:
            params["votes"] = action.param("votes")
        if action.prompt is not None:
            raise _fail(f"{op} takes no prompt")
        node = Node.create(new_id, op, {"solutions": [target.id]}, **params)
    elif op == "Format":
        _only(action, set(), "Format has no numeric parameters")
        params = _instruction(draft, new_id, op, action.prompt)
        node = Node.create(new_id, op, {"solution": target.id}, **params)
    elif op == "Programmer":
        _only(action, {"max_attempts"}, "a step after a node gives one solution")
        params = dict(action.params) | _instruction(draft, new_id, op, action.prompt)
        node = Node.create(new_id, op, {"input": [PROBLEM], "analysis": [target.id]}, **params)
    elif op in ("Custom", "AnswerGenerate", "CustomCodeGenerate"):
        _only(action, set(), "a step after a node gives one solution")
        params = _instruction(draft, new_id, op, action.prompt)
        node = Node.create(new_id, op, {"input": [PROBLEM, target.id]}, **params)
    else:  # Review, Revise (ReviseLoop and Test parse as wrap actions)
        raise _fail(
            f"{op} is not added on its own: use 'wrap {target.id} in review_revise' (or "
            "test_fix for code)"
        )
    return draft.insert_after(target.id, node).build()


def _add_before(graph: Graph, action: AddNode) -> Graph:
    target = _node(graph, action.node)
    op = action.op
    if not target.spec.generates:
        raise _fail(
            f"'before' adds a preparatory step to a generating node; {target.id!r} is a {target.op}"
        )
    if op not in GENERATORS:
        raise _fail(f"a preparatory step must be a generating operator, not {op}")
    _available(graph, op)
    _only(action, {"max_attempts"} if op == "Programmer" else set(), "it gives one result")
    draft = graph.draft()
    new_id = _new_id(draft, op, "before")
    params = {k: v for k, v in action.params} | _instruction(draft, new_id, op, action.prompt)
    helper = Node.create(new_id, op, {"input": [PROBLEM]}, **params)
    slot = "analysis" if target.spec.slot("analysis") is not None else "input"
    inputs: dict[str, Any] = {s: list(refs) for s, refs in target.inputs.items()}
    inputs[slot] = [*inputs.get(slot, []), new_id]
    updated = Node.create(target.id, target.op, inputs, **target.param_dict())
    draft.replace_node(updated)
    draft.nodes.insert(draft.nodes.index(updated), helper)
    return draft.build()


def _add_alongside(graph: Graph, action: AddNode) -> Graph:
    target = _node(graph, action.node)
    op = action.op
    readers = _ensemble_readers(graph, target.id)
    if not target.spec.generates or not readers:
        raise _fail(
            f"'alongside' adds another generator to the ensemble {target.id!r} feeds; it feeds "
            "none (add an ensemble after it first)"
        )
    if op not in GENERATORS:
        raise _fail(f"an alongside step must be a generating operator, not {op}")
    _available(graph, op)
    allowed = {"samples", "max_attempts"} if op == "Programmer" else {"samples"}
    _only(action, allowed, f"{op} alongside")
    draft = graph.draft()
    new_id = _new_id(draft, op, "alongside")
    params = {k: v for k, v in action.params} | _instruction(draft, new_id, op, action.prompt)
    context = [PROBLEM] if op == "Programmer" else list(target.inputs.get("input", (PROBLEM,)))
    branch = Node.create(new_id, op, {"input": context}, **params)
    ensemble = readers[0]
    pooled = [*ensemble.inputs["solutions"], new_id]
    draft.replace_node(
        Node.create(ensemble.id, ensemble.op, {"solutions": pooled}, **ensemble.param_dict())
    )
    draft.nodes.insert(draft.nodes.index(draft.node(target.id)) + 1, branch)
    return draft.build()


def _remove(graph: Graph, action: RemoveNode) -> Graph:
    node = _node(graph, action.node)
    refs = [ref for _, ref in node.refs()]
    draft = graph.draft()
    if refs and refs[0] != PROBLEM:
        pooled = [graph.node(r) for r in node.inputs.get("solutions", ()) if r != PROBLEM]
        if node.op in ENSEMBLES and len(pooled) == 1 and pooled[0].samples > 1:
            # The ensemble was the second half of a fan-out: remove the fan-out with it.
            draft.set_params(pooled[0].id, samples=None)
        return draft.remove(node.id).build()
    if node.id == graph.output:
        raise _fail(f"{node.id!r} is the output and reads only the problem; nothing replaces it")
    for reader, slot_name in graph.consumers(node.id):
        slot = reader.spec.slot(slot_name)
        assert slot is not None
        kept = [r for r in reader.inputs[slot_name] if r != node.id]
        if not kept and slot.required:
            raise _fail(
                f"{node.id!r} is the only {slot_name} of {reader.id!r}; remove {reader.id!r} "
                "or give it another input first"
            )
        inputs = {s: list(r) for s, r in reader.inputs.items() if s != slot_name}
        if kept:
            inputs[slot_name] = kept
        draft.replace_node(Node.create(reader.id, reader.op, inputs, **reader.param_dict()))
    draft.nodes = [n for n in draft.nodes if n.id != node.id]
    return draft.drop_unused_prompts().build()


def _set_param(graph: Graph, action: SetParam) -> Graph:
    node = _node(graph, action.node)
    if not _has_field(node.op, action.param):
        names = [n for n in OPS[node.op].params.model_fields if n != "instruction"]
        has = f"it has: {', '.join(names)}" if names else "it has none"
        raise _fail(f"{node.op} {node.id!r} has no parameter {action.param} ({has})")
    return graph.with_params(node.id, **{action.param: action.value})


def _set_prompt(graph: Graph, action: SetPrompt) -> Graph:
    node = _node(graph, action.node)
    if not _has_field(node.op, "instruction"):
        raise _fail(f"{node.op} {node.id!r} takes no instruction prompt")
    return graph.with_instruction(node.id, action.prompt)


def _replace(graph: Graph, action: ReplaceOp) -> Graph:
    node = _node(graph, action.node)
    op = action.op
    if op == node.op:
        raise _fail(f"{node.id!r} already is a {op}")
    _available(graph, op)
    params: dict[str, Any]
    if node.op in ENSEMBLES and op in ENSEMBLES:
        inputs: dict[str, Any] = {"solutions": list(node.inputs["solutions"])}
        params = {}
    elif node.spec.generates and op in GENERATORS:
        context = [*node.inputs.get("input", ()), *node.inputs.get("analysis", ())]
        inputs = {"input": context}
        if op == "Programmer" and node.inputs.get("analysis"):
            inputs = {
                "input": list(node.inputs["input"]),
                "analysis": list(node.inputs["analysis"]),
            }
        params = {"samples": node.samples} if node.samples > 1 else {}
        if node.instruction is not None and _has_field(op, "instruction"):
            params["instruction"] = node.instruction
    elif node.op in ENSEMBLES:
        raise _fail(f"{node.id!r} is an ensemble; it can only become the other ensemble")
    elif node.spec.generates:
        raise _fail(f"a generator can only become another generator ({', '.join(GENERATORS)})")
    else:
        raise _fail(f"{node.op} {node.id!r} cannot be replaced by another operator")
    draft = graph.draft().replace_node(Node.create(node.id, op, inputs, **params))
    return draft.drop_unused_prompts().build()


def _wrap(graph: Graph, action: WrapLoop) -> Graph:
    node = _node(graph, action.node)
    op: OpName = "ReviseLoop" if action.loop == "review_revise" else "Test"
    if op == "Test" and graph.task_type != "code":
        raise _fail("test_fix runs code against public tests: code workflows only")
    _available(graph, op)
    draft = graph.draft()
    params = {} if action.max_rounds is None else {"max_rounds": action.max_rounds}
    loop = Node.create(_new_id(draft, op, "after"), op, {"solution": node.id}, **params)
    return draft.insert_after(node.id, loop).build()


def apply_action(graph: Graph, action: EditAction) -> Graph:
    """The child graph ``action`` makes of ``graph``; raises :class:`InvalidActionError`."""
    try:
        if isinstance(action, AddNode):
            if action.position == "after":
                child = _add_after(graph, action)
            elif action.position == "before":
                child = _add_before(graph, action)
            else:
                child = _add_alongside(graph, action)
        elif isinstance(action, RemoveNode):
            child = _remove(graph, action)
        elif isinstance(action, SetParam):
            child = _set_param(graph, action)
        elif isinstance(action, SetPrompt):
            child = _set_prompt(graph, action)
        elif isinstance(action, ReplaceOp):
            child = _replace(graph, action)
        else:
            child = _wrap(graph, action)
    except WorkflowValidationError as exc:
        problems = "; ".join(f"{f}: {m}" for f, m in exc.problems[:3])
        raise _fail(f"the edited workflow would be invalid ({problems})") from None
    if child.content_hash == graph.content_hash:
        raise _fail("the action changes nothing: the workflow stays the same")
    return child


# ---------------------------------------------------------------------------------- enumerate
@dataclass(frozen=True)
class Candidate:
    """An admissible action with its canonical text and the child graph it makes."""

    action: EditAction
    text: str
    child: Graph

    @property
    def family(self) -> str:
        """Kind of edit (``add after``, ``remove``, ``set_prompt``...), for the bounded subset."""
        if isinstance(self.action, AddNode):
            return f"add {self.action.position}"
        return self.text.split(" ", 1)[0]


def _neighbours(name: str, current: int) -> list[int]:
    ladder = _LADDERS[name]
    below = [v for v in ladder if v < current]
    above = [v for v in ladder if v > current]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])


def _is_helper(graph: Graph, node: Node) -> bool:
    """A preparatory step: a generator on the problem alone, read only as other generators'
    context (what ``add ... before`` makes)."""
    if not node.spec.generates or node.id == graph.output:
        return False
    if any(ref != PROBLEM for _, ref in node.refs()):
        return False
    readers = graph.consumers(node.id)
    return bool(readers) and all(
        r.spec.generates and slot in ("input", "analysis") for r, slot in readers
    )


def _role(graph: Graph, node: Node) -> prompt_library.Role:
    if node.op == "Format":
        return "format"
    if _is_helper(graph, node):
        return "plan"
    refs = [graph.node(ref) for _, ref in node.refs() if ref != PROBLEM]
    if any(not _is_helper(graph, ref) for ref in refs):
        return "refine"
    return "generate"


def _proposals(graph: Graph) -> Iterator[EditAction]:
    """Every edit the enumeration considers, in a fixed order (validity not yet checked)."""
    task = graph.task_type
    generators = [op for op in GENERATORS if task in OPS[op].tasks]
    prompts = prompt_library.prompts_for
    for node in graph.topological():
        nid = node.id
        helper = _is_helper(graph, node)
        if node.spec.generates and not helper and not _ensemble_readers(graph, nid):
            fan = () if node.samples > 1 else (("samples", _DEFAULT_FAN_OUT["ScEnsemble"]),)
            yield AddNode("ScEnsemble", "after", nid, fan)
            md_fan = () if node.samples > 1 else (("samples", _DEFAULT_FAN_OUT["MdEnsemble"]),)
            yield AddNode("MdEnsemble", "after", nid, (*md_fan, ("votes", 5)))
        if node.output_kind == "solution" and not helper:
            if task != "code":
                yield AddNode("Format", "after", nid)
            for text in prompts(task, "refine"):
                yield AddNode("Custom", "after", nid, prompt=text)
            if task == "math":
                yield AddNode("Programmer", "after", nid)
            if task != "code":
                yield AddNode("AnswerGenerate", "after", nid)
            yield WrapLoop(nid, "review_revise")
            if task == "code":
                yield WrapLoop(nid, "test_fix")
        if node.spec.generates and not helper:
            for text in prompts(task, "plan"):
                yield AddNode("Custom", "before", nid, prompt=text)
            if _ensemble_readers(graph, nid):
                for op in generators:
                    prompt = prompts(task, "generate")[0] if _has_field(op, "instruction") else None
                    yield AddNode(op, "alongside", nid, prompt=prompt)
            for op in generators:
                yield ReplaceOp(nid, op)
        if node.op in ENSEMBLES:
            yield ReplaceOp(nid, "MdEnsemble" if node.op == "ScEnsemble" else "ScEnsemble")
        yield RemoveNode(nid)
        for name, value in node.param_dict(defaults=True).items():
            if name in _LADDERS:
                for other in _neighbours(name, int(value)):
                    yield SetParam(nid, name, other)
        if _has_field(node.op, "instruction"):
            for text in prompts(task, _role(graph, node)):
                yield SetPrompt(nid, text)


def _bounded(candidates: list[Candidate], limit: int, graph: Graph) -> list[Candidate]:
    """At most ``limit`` candidates: families in turn, shuffled within, in enumeration order."""
    if len(candidates) <= limit:
        return candidates
    rng = random.Random(derive_seed("admissible", graph.content_hash))
    families: dict[str, list[int]] = {}
    for index, candidate in enumerate(candidates):
        families.setdefault(candidate.family, []).append(index)
    queues = [rng.sample(indices, len(indices)) for indices in families.values()]
    chosen: list[int] = []
    while len(chosen) < limit:
        for queue in queues:
            if queue and len(chosen) < limit:
                chosen.append(queue.pop(0))
    return [candidates[i] for i in sorted(chosen)]


@lru_cache(maxsize=512)
def _every_admissible(graph: Graph) -> tuple[Candidate, ...]:
    seen = {graph.content_hash}
    found: list[Candidate] = []
    for action in _proposals(graph):
        try:
            child = apply_action(graph, action)
        except InvalidActionError:
            continue
        if child.content_hash in seen:
            continue
        seen.add(child.content_hash)
        found.append(Candidate(action, action.text(), child))
    return tuple(found)


def admissible_actions(
    graph: Graph, limit: int = 24, *, exclude: frozenset[str] = frozenset()
) -> Sequence[Candidate]:
    """The admissible actions of ``graph`` (at most ``limit``; see the module docstring).

    ``exclude``: hashes of children to leave out (the workflows a search already holds), unless
    that would leave none; the ``limit`` is then drawn from the others.
    """
    if limit < 1:
        raise InvalidActionError(f"limit {limit} is not positive")
    found = list(_every_admissible(graph))
    if exclude:
        kept = [c for c in found if c.child.content_hash not in exclude]
        found = kept or found
    return tuple(_bounded(found, limit, graph))
