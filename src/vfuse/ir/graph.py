"""The IR graph: immutable SSA nodes in topological order, and a builder that type-checks.

A `Node` defines exactly one value, named by `Node.name`; its inputs are names of earlier
nodes. Passes never mutate a Graph: they build a new one (usually with `GraphBuilder`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from vfuse.ir.opdefs import opdef
from vfuse.ir.ops import Attrs, Kind, Op
from vfuse.ir.printer import format_graph
from vfuse.ir.types import TensorType, Type


@dataclass(frozen=True, slots=True)
class Node:
    """One SSA value. `origin` names the FX node it was lowered from (for errors and reports)."""

    name: str
    op: Op
    inputs: tuple[str, ...]
    attrs: Attrs
    type: Type
    origin: str = ""

    @property
    def kind(self) -> Kind:
        return opdef(self.op).kind

    @property
    def tensor_type(self) -> TensorType:
        if not isinstance(self.type, TensorType):
            raise TypeError(f"node %{self.name} ({self.op.value}) has tuple type {self.type}")
        return self.type


@dataclass(frozen=True)
class Graph:
    """Nodes in topological order (INPUT nodes first, by index) and the output value names."""

    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]
    _index: dict[str, Node] = field(init=False, repr=False, compare=False, hash=False)
    _users: dict[str, tuple[str, ...]] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        index = {n.name: n for n in self.nodes}
        users: dict[str, list[str]] = {n.name: [] for n in self.nodes}
        for n in self.nodes:
            for i in dict.fromkeys(n.inputs):
                if i in users:
                    users[i].append(n.name)
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_users", {k: tuple(v) for k, v in users.items()})

    def __getitem__(self, name: str) -> Node:
        return self._index[name]

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def users(self, name: str) -> tuple[str, ...]:
        """Names of the nodes that read `name` (each once, in topological order)."""
        return self._users[name]

    @property
    def inputs(self) -> tuple[Node, ...]:
        return tuple(sorted((n for n in self.nodes if n.op is Op.INPUT), key=lambda n: n.attrs["index"]))

    @property
    def compute_nodes(self) -> tuple[Node, ...]:
        """Nodes that do work in a kernel or through torch (not inputs or constants)."""
        return tuple(n for n in self.nodes if n.kind is not Kind.SOURCE)

    def ancestors(self, name: str, within: Collection[str]) -> set[str]:
        """Nodes in `within` that `name` depends on through paths staying inside `within`
        (e.g. a contraction's prologue inside its kernel group)."""
        seen: set[str] = set()
        stack = [i for i in self[name].inputs if i in within]
        while stack:
            v = stack.pop()
            if v not in seen:
                seen.add(v)
                stack.extend(i for i in self[v].inputs if i in within)
        return seen

    def is_output(self, name: str) -> bool:
        return name in self.outputs

    def __str__(self) -> str:
        return format_graph(self)


class GraphBuilder:
    """Appends type-checked nodes with unique names; `build` returns the immutable Graph."""

    def __init__(self, reserved: Iterable[str] = ()) -> None:
        self._nodes: list[Node] = []
        self._types: dict[str, Type] = {}
        self._taken: set[str] = set(reserved)
        self._counts: dict[str, int] = {}

    def fresh_name(self, base: str) -> str:
        base = base or "v"
        name, k = base, self._counts.get(base, 0)
        while name in self._taken:
            k += 1
            name = f"{base}_{k}"
        self._counts[base] = k
        self._taken.add(name)
        return name

    def type_of(self, name: str) -> Type:
        return self._types[name]

    def add(self, op: Op, inputs: Sequence[str] = (), origin: str = "", name: str = "", **attrs: Any) -> str:
        """Append `op(inputs)`; the type comes from the op's rule, so a bad node fails here."""
        a = Attrs.of(**attrs)
        in_types = tuple(self._types[i] for i in inputs)
        try:
            out_type = opdef(op).infer(in_types, a)  # type: ignore[arg-type]
        except Exception as e:
            where = f" (from FX node '{origin}')" if origin else ""
            shown = ", ".join(f"%{i}: {t}" for i, t in zip(inputs, in_types))
            raise type(e)(f"{op.value}({shown}){where}: {e}") from e
        return self.add_node(Node(self.fresh_name(name or op.value), op, tuple(inputs), a, out_type, origin))

    def add_node(self, node: Node) -> str:
        """Append a node built elsewhere, e.g. copied by a pass (its name must be unused here)."""
        if node.name in self._types:
            raise ValueError(f"value %{node.name} is defined twice")
        self._taken.add(node.name)
        self._nodes.append(node)
        self._types[node.name] = node.type
        return node.name

    def build(self, outputs: Sequence[str]) -> Graph:
        return Graph(tuple(self._nodes), tuple(outputs))
