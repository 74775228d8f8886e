"""The workflow graph: typed operator nodes, a prompt table, JSON in and out, and edits.

A :class:`Graph` is a DAG of :class:`Node` values. Each node has a stable, human-readable id
(``generate``, ``ensemble``), an operator from :data:`aflowrl.workflow.ops.OPS`, explicit inputs
(slot name -> references to earlier nodes or to ``problem``) and typed parameters. Prompts live
in a table (name -> text) that nodes reference by name, like AFlow's ``prompt.py``. The value of
the ``output`` node is the workflow's answer.

Every :class:`Graph` that exists is valid: the constructor checks ids, references, cycles, value
kinds (a verdict cannot be ensembled, candidates cannot be reviewed), task types, ensemble sizes,
unused nodes and prompt references, and raises :class:`WorkflowValidationError` naming each node
and field at fault. So any graph the validator accepts can be run.

JSON form (``Graph.to_dict`` / ``Graph.from_dict``; key order is free)::

    {"version": 1, "name": "cot_sc", "task_type": "math",
     "prompts": {"cot": "Solve the problem step by step ..."},
     "nodes": [
       {"id": "generate", "op": "Custom", "inputs": {"input": ["problem"]},
        "params": {"instruction": "cot", "samples": 5}},
       {"id": "ensemble", "op": "ScEnsemble", "inputs": {"solutions": ["generate"]}}],
     "output": "ensemble"}

Single-reference slots take a string, multi-reference slots a list (a string is accepted).

Edits (for the search's action language) return new graphs: :meth:`Graph.insert_after`,
:meth:`Graph.remove`, :meth:`Graph.with_params`, :meth:`Graph.with_prompt`,
:meth:`Graph.with_instruction`, :meth:`Graph.replace_node`, :meth:`Graph.renamed`;
:meth:`Graph.unique_id` picks a fresh readable id. Edits that are only valid together (a fan-out
and the ensemble after it) go through a :class:`Draft`, validated once by :meth:`Draft.build`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Final, cast, get_args

from pydantic import ValidationError

from aflowrl import documents
from aflowrl.benchmarks.base import TaskType
from aflowrl.workflow import canonical
from aflowrl.workflow.errors import WorkflowValidationError
from aflowrl.workflow.ops import (
    MAX_CANDIDATES,
    NAME_PATTERN,
    OPS,
    PROBLEM,
    OpName,
    OpParams,
    OpSpec,
    ValueKind,
)

FORMAT_VERSION: Final = 1
"""Version of the JSON form written by :meth:`Graph.to_dict`."""

MAX_NODES: Final = 32
MAX_JSON_CHARS: Final = 1 << 20
"""Largest workflow JSON read (a graph at every other limit takes about 300 000 characters)."""
MAX_PROMPTS: Final = 32
MAX_PROMPT_CHARS: Final = 8000
MAX_LLM_CALLS: Final = 256
"""Most executor calls one run of a graph may make (worst case over loops and fan-outs)."""

_NAME = re.compile(NAME_PATTERN)
_TASKS: Final[tuple[str, ...]] = get_args(TaskType)
_TOP_KEYS: Final = frozenset(
    {"version", "name", "task_type", "description", "prompts", "nodes", "output"}
)
_NODE_KEYS: Final = frozenset({"id", "op", "inputs", "params"})

Problems = list[tuple[str, str]]


def _node_field(index: int, node_id: object, op: object) -> str:
    label = f"nodes[{index}]"
    if isinstance(node_id, str) and node_id:
        label += f" {node_id!r}"
    if isinstance(op, str) and op in OPS:
        label += f" ({op})"
    return label


@dataclass(frozen=True)
class Node:
    """One operator node. ``inputs`` maps a slot name to its references, in order."""

    id: str
    op: OpName
    inputs: Mapping[str, tuple[str, ...]]
    params: OpParams

    def __hash__(self) -> int:
        return hash((self.id, self.op, tuple(sorted(self.inputs.items())), self.params))

    @property
    def spec(self) -> OpSpec:
        return OPS[self.op]

    @property
    def output_kind(self) -> ValueKind:
        return self.spec.output_kind(self.params)

    @property
    def samples(self) -> int:
        """Fan-out of a generating node (1 for others)."""
        return int(getattr(self.params, "samples", 1))

    @property
    def instruction(self) -> str | None:
        """Prompt-table name this node's instruction comes from, if any."""
        value = getattr(self.params, "instruction", None)
        return str(value) if value is not None else None

    def refs(self) -> Iterator[tuple[str, str]]:
        """Every ``(slot, reference)`` pair, slots in operator order, references in order."""
        for slot in self.spec.slots:
            for ref in self.inputs.get(slot.name, ()):
                yield slot.name, ref

    def param_dict(self, *, defaults: bool = False) -> dict[str, Any]:
        """Parameters as JSON values (only those set explicitly unless ``defaults``)."""
        return self.params.model_dump(exclude_unset=not defaults)

    @staticmethod
    def create(
        id: str,
        op: str,
        inputs: Mapping[str, str | Sequence[str]] | None = None,
        **params: Any,
    ) -> Node:
        """Build a node from Python values; raises :class:`WorkflowValidationError`."""
        doc: dict[str, Any] = {"id": id, "op": op, "inputs": dict(inputs or {})}
        if params:
            doc["params"] = params
        problems: Problems = []
        node = _parse_node(doc, 0, problems, label=f"node {id!r} ({op})")
        if node is None:
            raise WorkflowValidationError(problems)
        return node

    def to_dict(self) -> dict[str, Any]:
        inputs: dict[str, Any] = {}
        for slot in self.spec.slots:
            refs = self.inputs.get(slot.name)
            if refs is None:
                continue
            inputs[slot.name] = list(refs) if slot.many else refs[0]
        doc: dict[str, Any] = {"id": self.id, "op": self.op, "inputs": inputs}
        params = self.param_dict()
        if params:
            doc["params"] = params
        return doc


def _parse_node(doc: object, index: int, problems: Problems, *, label: str = "") -> Node | None:
    """One node from its JSON form, or None after appending its problems."""
    if not isinstance(doc, Mapping):
        problems.append((f"nodes[{index}]", "must be an object"))
        return None
    where = label or _node_field(index, doc.get("id"), doc.get("op"))
    start = len(problems)
    for key in doc:
        if key not in _NODE_KEYS:
            problems.append((f"{where}.{key}", f"unknown field (allowed: {sorted(_NODE_KEYS)})"))
    node_id = doc.get("id")
    if not isinstance(node_id, str) or not _NAME.match(node_id):
        problems.append(
            (f"{where}.id", f"{node_id!r} is not a name matching {NAME_PATTERN} (e.g. 'generate')")
        )
    elif node_id == PROBLEM:
        problems.append((f"{where}.id", f"{PROBLEM!r} is reserved for the problem statement"))
    op = doc.get("op")
    spec = OPS.get(op) if isinstance(op, str) else None
    if spec is None:
        problems.append((f"{where}.op", f"unknown operator {op!r} (one of {', '.join(OPS)})"))
        return None
    inputs = _parse_inputs(doc.get("inputs", {}), spec, f"{where}.inputs", problems)
    raw_params = doc.get("params", {})
    params: OpParams | None = None
    if not isinstance(raw_params, Mapping):
        problems.append((f"{where}.params", "must be an object"))
    else:
        try:
            params = spec.params.model_validate(dict(raw_params))
        except ValidationError as exc:
            for err in exc.errors():
                loc = ".".join(str(p) for p in err["loc"])
                problems.append((f"{where}.params.{loc}", err["msg"]))
    if len(problems) > start or params is None or inputs is None:
        return None
    return Node(id=cast(str, node_id), op=spec.name, inputs=inputs, params=params)


def _parse_inputs(
    raw: object, spec: OpSpec, where: str, problems: Problems
) -> dict[str, tuple[str, ...]] | None:
    if not isinstance(raw, Mapping):
        problems.append((where, "must be an object mapping slot names to references"))
        return None
    start = len(problems)
    inputs: dict[str, tuple[str, ...]] = {}
    given: set[str] = set()
    for name, value in raw.items():
        given.add(str(name))
        slot = spec.slot(str(name))
        if slot is None:
            allowed = ", ".join(s.name for s in spec.slots)
            problems.append((f"{where}.{name}", f"{spec.name} has no input {name!r} ({allowed})"))
            continue
        refs: tuple[str, ...]
        if isinstance(value, str):
            refs = (value,)
        elif isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
            refs = tuple(value)
            if not slot.many and len(refs) != 1:
                problems.append((f"{where}.{name}", "takes exactly one reference"))
                continue
        else:
            problems.append((f"{where}.{name}", "must be a node id or a list of node ids"))
            continue
        if not refs:
            problems.append((f"{where}.{name}", "needs at least one reference"))
            continue
        if len(refs) > MAX_CANDIDATES:
            problems.append((f"{where}.{name}", f"at most {MAX_CANDIDATES} references"))
            continue
        inputs[slot.name] = refs
    for slot in spec.slots:
        if slot.required and slot.name not in inputs and slot.name not in given:
            problems.append((f"{where}.{slot.name}", f"required input of {spec.name} is missing"))
    return inputs if len(problems) == start else None


@dataclass(frozen=True)
class Graph:
    """A validated workflow. Build with :meth:`from_dict`, :meth:`from_json` or directly."""

    name: str
    task_type: TaskType
    nodes: tuple[Node, ...]
    output: str
    prompts: Mapping[str, str] = field(default_factory=dict)
    description: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(
            self, "prompts", {name: text.strip() for name, text in self.prompts.items()}
        )
        problems = _validate(self)
        if problems:
            raise WorkflowValidationError(problems)

    # ------------------------------------------------------------------ reading
    @cached_property
    def _by_id(self) -> dict[str, Node]:
        return {node.id: node for node in self.nodes}

    def node(self, node_id: str) -> Node:
        try:
            return self._by_id[node_id]
        except KeyError:
            known = ", ".join(self._by_id)
            raise WorkflowValidationError(
                [("node", f"no node {node_id!r} in workflow {self.name!r} (nodes: {known})")]
            ) from None

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._by_id

    def __hash__(self) -> int:
        # Equal graphs have equal content hashes, so this agrees with ==.
        return hash(self.content_hash)

    def consumers(self, node_id: str) -> list[tuple[Node, str]]:
        """Nodes reading ``node_id``, with the slot they read it in."""
        return [(n, slot) for n in self.nodes for slot, ref in n.refs() if ref == node_id]

    def topological(self) -> list[Node]:
        """Nodes in an order where every node comes after its inputs (stable otherwise)."""
        return _topological(self.nodes)

    def candidate_count(self, node: Node, slot: str = "solutions") -> int:
        """How many texts a multi-reference slot pools (a candidates input counts its samples)."""
        return _pooled(node, self._by_id, slot)

    def max_llm_calls(self) -> int:
        """Worst-case executor calls of one run (loops to their bound, every fan-out)."""
        return _max_calls(self.nodes, self._by_id)

    @cached_property
    def content_hash(self) -> str:
        """Hash of the canonical form: equal graphs hash equal whatever their ids or key order."""
        return canonical.content_hash(self)

    @cached_property
    def upstream(self) -> Mapping[str, canonical.UpstreamHash]:
        """Node id -> hashes of the node's upstream subgraph (what its draws are keyed and
        seeded by; see :func:`aflowrl.workflow.canonical.upstream_hashes`)."""
        return canonical.upstream_hashes(self)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"version": FORMAT_VERSION, "name": self.name}
        if self.description:
            doc["description"] = self.description
        doc["task_type"] = self.task_type
        doc["prompts"] = dict(self.prompts)
        doc["nodes"] = [node.to_dict() for node in self.nodes]
        doc["output"] = self.output
        return doc

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    @staticmethod
    def from_dict(doc: object, *, source: str = "workflow") -> Graph:
        """Parse and validate the JSON form; errors name the node and field."""
        problems: Problems = []
        if not isinstance(doc, Mapping):
            raise WorkflowValidationError([(source, "a workflow must be a JSON object")])
        for key in doc:
            if key not in _TOP_KEYS:
                problems.append((str(key), f"unknown field (allowed: {sorted(_TOP_KEYS)})"))
        version = doc.get("version", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            problems.append(("version", f"unsupported version {version!r} (this reads 1)"))
        name = doc.get("name", "workflow")
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            problems.append(("name", "must be a non-empty string of at most 200 characters"))
        description = doc.get("description", "")
        if not isinstance(description, str):
            problems.append(("description", "must be a string"))
        task_type = doc.get("task_type")
        if task_type not in _TASKS:
            problems.append(("task_type", f"{task_type!r} is not one of {', '.join(_TASKS)}"))
        prompts = doc.get("prompts", {})
        if not isinstance(prompts, Mapping) or not all(
            isinstance(v, str) for v in prompts.values()
        ):
            problems.append(("prompts", "must map prompt names to texts"))
            prompts = {}
        raw_nodes = doc.get("nodes")
        nodes: list[Node] = []
        if not isinstance(raw_nodes, list) or not raw_nodes:
            problems.append(("nodes", "must be a non-empty list of nodes"))
        else:
            for index, raw in enumerate(raw_nodes):
                node = _parse_node(raw, index, problems)
                if node is not None:
                    nodes.append(node)
        output = doc.get("output")
        if not isinstance(output, str):
            problems.append(("output", "must be the id of the node whose value is the answer"))
        if problems:
            raise WorkflowValidationError(problems)
        return Graph(
            name=cast(str, name).strip(),
            task_type=cast(TaskType, task_type),
            nodes=tuple(nodes),
            output=cast(str, output),
            prompts=dict(prompts),
            description=cast(str, description),
        )

    @staticmethod
    def from_json(text: str | bytes, *, source: str = "workflow") -> Graph:
        """Parse and validate a workflow from outside (bounded: :mod:`aflowrl.documents`)."""
        try:
            doc = documents.load_json(text, source=source, max_chars=MAX_JSON_CHARS)
        except documents.DocumentError as exc:
            raise WorkflowValidationError([(source, exc.reason)]) from None
        return Graph.from_dict(doc, source=source)

    def found_as(self, name: str, how: str) -> Graph:
        """This workflow called ``name`` and described by ``how`` (a sentence), followed by
        where it came from. Edits keep the seed's name and description (neither is part of the
        content hash), so the files written for a workflow the search found say what it is
        with this."""
        origin = f"'{self.name}'" + (
            f" ({self.description.rstrip('.')})" if self.description else ""
        )
        return replace(self, name=name, description=f"{how.rstrip('.')}, edited from {origin}.")

    # ------------------------------------------------------------------ edits
    def draft(self) -> Draft:
        """A mutable copy for several edits validated once (see :class:`Draft`)."""
        return Draft(self)

    def unique_id(self, base: str) -> str:
        """``base`` if free, else ``base_2``, ``base_3``... (ids stay readable)."""
        return self.draft().unique_id(base)

    def replace_node(self, node: Node) -> Graph:
        """The graph with the node of the same id replaced."""
        return self.draft().replace_node(node).build()

    def with_params(self, node_id: str, **changes: Any) -> Graph:
        """Change parameters of one node (e.g. ``samples=5``); None resets one to its default."""
        return self.draft().set_params(node_id, **changes).build()

    def with_prompt(self, name: str, text: str) -> Graph:
        """Add or replace a prompt-table entry."""
        return self.draft().set_prompt(name, text).build()

    def with_instruction(self, node_id: str, text: str) -> Graph:
        """Give a node its own instruction text (see :meth:`Draft.set_instruction`)."""
        return self.draft().set_instruction(node_id, text).build()

    def insert_after(self, target: str, node: Node) -> Graph:
        """Insert ``node`` after ``target`` (see :meth:`Draft.insert_after`)."""
        return self.draft().insert_after(target, node).build()

    def remove(self, node_id: str) -> Graph:
        """Remove a node, reconnecting its readers (see :meth:`Draft.remove`)."""
        return self.draft().remove(node_id).build()

    def renamed(self, mapping: Mapping[str, str]) -> Graph:
        """The same graph with node ids renamed (``{"old": "new"}``)."""
        return self.draft().rename(mapping).build()


class Draft:
    """A mutable copy of a graph: apply several edits, then :meth:`build` validates once.

    Edits that only make sense together (set ``samples=5`` *and* add an ensemble after the
    node) pass through invalid intermediate states; a draft allows that. Each method checks
    what it can at once (the node exists, the new node reads its target) and returns the draft,
    so edits chain: ``graph.draft().set_params("generate", samples=5).insert_after("generate",
    ensemble).build()``.
    """

    def __init__(self, graph: Graph) -> None:
        self.name = graph.name
        self.task_type: TaskType = graph.task_type
        self.description = graph.description
        self.nodes: list[Node] = list(graph.nodes)
        self.output = graph.output
        self.prompts: dict[str, str] = dict(graph.prompts)

    def _index(self, node_id: str) -> int:
        for i, node in enumerate(self.nodes):
            if node.id == node_id:
                return i
        known = ", ".join(n.id for n in self.nodes)
        raise WorkflowValidationError(
            [("node", f"no node {node_id!r} in workflow {self.name!r} (nodes: {known})")]
        )

    def node(self, node_id: str) -> Node:
        return self.nodes[self._index(node_id)]

    def unique_id(self, base: str) -> str:
        """``base`` if free, else ``base_2``, ``base_3``... (ids stay readable)."""
        stem = re.sub(r"[^a-z0-9_]", "_", base.lower()).strip("_")[:32] or "node"
        if not stem[0].isalpha():
            stem = f"n_{stem}"[:32]
        taken = {n.id for n in self.nodes} | {PROBLEM}
        candidate, k = stem, 2
        while candidate in taken:
            candidate, k = f"{stem}_{k}", k + 1
        return candidate

    def replace_node(self, node: Node) -> Draft:
        self.nodes[self._index(node.id)] = node
        return self

    def set_params(self, node_id: str, **changes: Any) -> Draft:
        """Change parameters of one node; None resets one to its default."""
        node = self.node(node_id)
        params = node.param_dict()
        for key, value in changes.items():
            if value is None:
                params.pop(key, None)
            else:
                params[key] = value
        return self.replace_node(Node.create(node.id, node.op, node.inputs, **params))

    def set_prompt(self, name: str, text: str) -> Draft:
        """Add or replace a prompt-table entry."""
        if not _NAME.match(name):
            raise WorkflowValidationError([(f"prompts.{name}", f"name must match {NAME_PATTERN}")])
        self.prompts[name] = text
        return self

    def set_instruction(self, node_id: str, text: str) -> Draft:
        """Give a node its instruction text: its prompt is rewritten when no other node shares
        it, else the node gets a new prompt named after it. Prompts left unused are dropped."""
        node = self.node(node_id)
        if "instruction" not in node.spec.params.model_fields:
            raise WorkflowValidationError(
                [(f"node {node_id!r} ({node.op})", "this operator takes no instruction prompt")]
            )
        old = node.instruction
        shared = sum(1 for n in self.nodes if old is not None and n.instruction == old) > 1
        name = old if old is not None and not shared else self._free_prompt_name(node_id)
        self.set_prompt(name, text).set_params(node_id, instruction=name)
        return self.drop_unused_prompts()

    def _free_prompt_name(self, base: str) -> str:
        candidate, k = base, 2
        while candidate in self.prompts:
            candidate, k = f"{base}_{k}", k + 1
        return candidate

    def insert_after(self, target: str, node: Node) -> Draft:
        """Insert ``node`` (which must read ``target``) and rewire ``target``'s readers to it.

        ``insert_after("generate", Node.create("ensemble", "ScEnsemble", {"solutions":
        "generate"}))`` puts an ensemble between ``generate`` and whatever read it (or the
        output).
        """
        position = self._index(target) + 1
        if any(n.id == node.id for n in self.nodes):
            raise WorkflowValidationError([("node.id", f"{node.id!r} already exists")])
        if target not in {ref for _, ref in node.refs()}:
            raise WorkflowValidationError(
                [(f"node {node.id!r} ({node.op}).inputs", f"must read {target!r} to follow it")]
            )
        self.nodes = [_rewire(n, target, node.id) for n in self.nodes]
        self.nodes.insert(position, node)
        if self.output == target:
            self.output = node.id
        return self

    def add(self, node: Node) -> Draft:
        """Append a node as is (wire it with :meth:`replace_node` or :meth:`set_output`)."""
        if any(n.id == node.id for n in self.nodes):
            raise WorkflowValidationError([("node.id", f"{node.id!r} already exists")])
        self.nodes.append(node)
        return self

    def set_output(self, node_id: str) -> Draft:
        self._index(node_id)
        self.output = node_id
        return self

    def remove(self, node_id: str) -> Draft:
        """Remove a node; its readers (and the output) read its first input instead.

        Fails at once when the node reads only the problem; :meth:`build` reports a graph left
        invalid, e.g. an answer that became a set of candidates.
        """
        node = self.node(node_id)
        first = next(node.refs(), None)
        if first is None or first[1] == PROBLEM:
            raise WorkflowValidationError(
                [
                    (
                        f"node {node_id!r} ({node.op})",
                        "reads only the problem; nothing can take its place",
                    )
                ]
            )
        substitute = first[1]
        self.nodes = [_rewire(n, node_id, substitute) for n in self.nodes if n.id != node_id]
        if self.output == node_id:
            self.output = substitute
        return self.drop_unused_prompts()

    def rename(self, mapping: Mapping[str, str]) -> Draft:
        """Rename node ids (``{"old": "new"}``)."""

        def new(ref: str) -> str:
            return mapping.get(ref, ref)

        self.nodes = [
            Node(
                id=new(n.id),
                op=n.op,
                inputs={s: tuple(new(r) for r in refs) for s, refs in n.inputs.items()},
                params=n.params,
            )
            for n in self.nodes
        ]
        self.output = new(self.output)
        return self

    def drop_unused_prompts(self) -> Draft:
        used = {n.instruction for n in self.nodes}
        self.prompts = {k: v for k, v in self.prompts.items() if k in used}
        return self

    def build(self) -> Graph:
        """The edited graph, validated (raises :class:`WorkflowValidationError`)."""
        return Graph(
            name=self.name,
            task_type=self.task_type,
            nodes=tuple(self.nodes),
            output=self.output,
            prompts=dict(self.prompts),
            description=self.description,
        )


def _rewire(node: Node, old: str, new: str) -> Node:
    if all(ref != old for _, ref in node.refs()):
        return node
    inputs = {s: tuple(new if r == old else r for r in refs) for s, refs in node.inputs.items()}
    return Node(id=node.id, op=node.op, inputs=inputs, params=node.params)


def _topological(nodes: Sequence[Node]) -> list[Node]:
    """Kahn's algorithm, ties broken by list order; nodes on a cycle are left out."""
    by_id = {n.id: n for n in nodes}
    indegree = {n.id: sum(1 for _, r in n.refs() if r in by_id) for n in nodes}
    readers: dict[str, list[str]] = {n.id: [] for n in nodes}
    for n in nodes:
        for _, ref in n.refs():
            if ref in readers:
                readers[ref].append(n.id)
    order = {n.id: i for i, n in enumerate(nodes)}
    ready = sorted((i for i, d in indegree.items() if d == 0), key=order.__getitem__)
    result: list[Node] = []
    while ready:
        current = ready.pop(0)
        result.append(by_id[current])
        for reader in readers[current]:
            indegree[reader] -= 1
            if indegree[reader] == 0:
                ready.append(reader)
                ready.sort(key=order.__getitem__)
    return result


def _validate(graph: Graph) -> Problems:
    """Every problem of a graph whose nodes each parsed; empty when valid."""
    problems: Problems = []
    if graph.task_type not in _TASKS:
        problems.append(("task_type", f"{graph.task_type!r} is not one of {', '.join(_TASKS)}"))
        return problems
    if not graph.nodes:
        problems.append(("nodes", "a workflow needs at least one node"))
        return problems
    if len(graph.nodes) > MAX_NODES:
        problems.append(("nodes", f"{len(graph.nodes)} nodes; at most {MAX_NODES}"))
    if len(graph.prompts) > MAX_PROMPTS:
        problems.append(("prompts", f"{len(graph.prompts)} prompts; at most {MAX_PROMPTS}"))
    for name, text in graph.prompts.items():
        if not _NAME.match(name):
            problems.append((f"prompts.{name}", f"name must match {NAME_PATTERN}"))
        if not text:
            problems.append((f"prompts.{name}", "is empty"))
        if len(text) > MAX_PROMPT_CHARS:
            problems.append(
                (f"prompts.{name}", f"{len(text)} characters; at most {MAX_PROMPT_CHARS}")
            )

    labels = {n.id: _node_field(i, n.id, n.op) for i, n in enumerate(graph.nodes)}
    seen: set[str] = set()
    for i, node in enumerate(graph.nodes):
        if node.id in seen:
            problems.append((_node_field(i, node.id, node.op) + ".id", "duplicate id"))
        seen.add(node.id)
    if problems:
        return problems
    by_id = {n.id: n for n in graph.nodes}

    for node in graph.nodes:
        where = labels[node.id]
        spec = node.spec
        if graph.task_type not in spec.tasks:
            problems.append(
                (
                    f"{where}.op",
                    f"{spec.name} is not available for {graph.task_type} workflows "
                    f"(only {', '.join(sorted(spec.tasks))})",
                )
            )
        for slot_name, ref in node.refs():
            slot = spec.slot(slot_name)
            assert slot is not None
            field_name = f"{where}.inputs.{slot_name}"
            if ref == PROBLEM:
                if not slot.problem_ok:
                    problems.append((field_name, f"cannot read the problem ({slot.description})"))
                continue
            source = by_id.get(ref)
            if source is None:
                problems.append((field_name, f"references unknown node {ref!r}"))
                continue
            if ref == node.id:
                problems.append((field_name, "a node cannot read itself"))
                continue
            kind = source.output_kind
            if kind not in slot.accepts:
                problems.append(
                    (
                        field_name,
                        f"{ref!r} gives {kind} but this input takes "
                        f"{' or '.join(sorted(slot.accepts))}"
                        + (" (set samples=1 or add an ensemble)" if kind == "candidates" else ""),
                    )
                )
        instruction = node.instruction
        if instruction is not None and instruction not in graph.prompts:
            problems.append(
                (
                    f"{where}.params.instruction",
                    f"no prompt named {instruction!r} in the prompt table",
                )
            )
        if spec.name in ("ScEnsemble", "MdEnsemble"):
            count = _pooled(node, by_id, "solutions")
            if count > MAX_CANDIDATES:
                problems.append(
                    (
                        f"{where}.inputs.solutions",
                        f"{count} candidates; at most {MAX_CANDIDATES} (labelled A-Z)",
                    )
                )
    if problems:
        return problems

    ordered = _topological(graph.nodes)
    if len(ordered) != len(graph.nodes):
        stuck = [n.id for n in graph.nodes if n not in ordered]
        problems.append(("nodes", f"cycle through {', '.join(repr(s) for s in stuck)}"))
        return problems

    output = by_id.get(graph.output)
    if output is None:
        problems.append(("output", f"references unknown node {graph.output!r}"))
        return problems
    if output.output_kind != "solution":
        problems.append(
            (
                "output",
                f"{graph.output!r} gives {output.output_kind}; the answer must be one solution "
                "(add an ensemble, or set samples=1)",
            )
        )
    reachable: set[str] = set()
    stack = [graph.output]
    while stack:
        current = stack.pop()
        if current in reachable or current == PROBLEM:
            continue
        reachable.add(current)
        stack.extend(ref for _, ref in by_id[current].refs())
    for node in graph.nodes:
        if node.id not in reachable:
            problems.append(
                (labels[node.id], f"unused: the output {graph.output!r} does not depend on it")
            )
    if not problems:
        calls = _max_calls(graph.nodes, by_id)
        if calls > MAX_LLM_CALLS:
            problems.append(
                (
                    "nodes",
                    f"up to {calls} executor calls per problem; at most {MAX_LLM_CALLS} (lower "
                    "samples, votes or rounds)",
                )
            )
    return problems


def _pooled(node: Node, by_id: Mapping[str, Node], slot: str) -> int:
    """Texts a multi-reference slot pools: one per solution, ``samples`` per candidates input."""
    return sum(by_id[r].samples if r in by_id else 1 for r in node.inputs.get(slot, ()))


def _max_calls(nodes: Sequence[Node], by_id: Mapping[str, Node]) -> int:
    return sum(n.spec.max_llm_calls(n.params, _pooled(n, by_id, "solutions")) for n in nodes)
