"""The planner's working set of kernels for one planning run (explicit state, never global).

A `Kernel` is immutable: every merge builds a new one with a fresh id, so a queued candidate
naming a dead id is stale. `KernelTable` knows which kernel(s) compute each node (several when
a cheap producer was recomputed in its consumers) and keeps the kernels in a valid execution
order (`rank`), maintained incrementally like Pearce-Kelly dynamic topological sorting: a
merge of P into C only reorders the kernels ranked between them, and those same bounded
searches decide whether the merge would create a cycle.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from vfuse.fusion.cost import external_inputs, kernel_cost, pressure_of
from vfuse.fusion.forms import PROLOGUE_MAX_FLOPS_PER_ELEMENT, Form, Illegal, classify, numel_of, packed_once
from vfuse.fusion.legality import Budgets, budget_violation
from vfuse.fusion.library import pointwise_choice
from vfuse.fusion.plan import Cost
from vfuse.fusion.rules import Rule
from vfuse.fusion.summary import (
    Facts,
    Summary,
    combine,
    form_of,
    leaf,
    node_facts,
    quick_illegal,
    summary_cost,
    with_prologue,
)
from vfuse.ir import Graph, Kind, Node
from vfuse.targets import Target


@dataclass(frozen=True, slots=True)
class Kernel:
    id: int
    summary: Summary
    form: Form
    cost: Cost

    @property
    def names(self) -> frozenset[str]:
        return self.summary.names

    @property
    def outputs(self) -> frozenset[str]:
        return self.summary.outputs


class KernelTable:
    """Alive kernels, node -> holders, and the kernels' execution order."""

    def __init__(self, graph: Graph, target: Target, budgets: Budgets) -> None:
        self.graph = graph
        self.target = target
        self.budgets = budgets
        self.pos = {n.name: i for i, n in enumerate(graph.nodes)}
        self.facts: dict[str, Facts] = {n.name: node_facts(n, graph, target) for n in graph.nodes}
        self.nbytes = {name: f.nbytes for name, f in self.facts.items()}
        self.kernels: dict[int, Kernel] = {}
        self.rank: dict[int, int] = {}
        self.holders: dict[str, set[int]] = {}
        self.duplicated: set[str] = set()
        self._next_id = 0

    # -- building kernels ------------------------------------------------------------------
    def seed(self, nodes: list[Node]) -> Kernel:
        """The kernel of one node (an OPAQUE node comes with its GET_ITEMs)."""
        names = frozenset(n.name for n in nodes)
        g = self.graph
        outputs = frozenset(
            n.name for n in nodes if g.is_output(n.name) or any(u not in names for u in g.users(n.name))
        )
        first = outputs if len(nodes) == 1 else frozenset()
        s = leaf(self.facts[nodes[0].name], nodes[0], first, self.facts)
        for n in nodes[1:]:
            s = combine(s, leaf(self.facts[n.name], n, frozenset(), self.facts), outputs, self.facts)
        k = self._finish(s, None, None)
        if isinstance(k, Illegal):
            raise AssertionError(f"node %{nodes[0].name} alone is not a kernel: {k.reason}")
        return self.add(k, self.pos[nodes[0].name])

    def build(self, p: Kernel, c: Kernel, recompute: bool = False) -> Kernel | Illegal:
        """The kernel P u C would be (P the producer), if legal. With `recompute`, P's values
        are computed wherever they are read (P is duplicated into each consumer), so they are
        never written out."""
        quick = quick_illegal(p.summary, c.summary)
        if quick:
            return quick
        names = p.names | c.names
        replacing = frozenset((p.id, c.id))
        # C's outputs stay outputs: their readers are downstream of C, so neither in P nor in
        # a copy of P. Only P's outputs may now be consumed entirely inside the merged kernel.
        outputs = c.outputs
        if not recompute:
            outputs = outputs | {v for v in p.outputs if self._leaves(v, names, replacing, frozenset())}
        return self._finish(combine(p.summary, c.summary, outputs, self.facts), p.summary, c.summary)

    def _finish(self, s: Summary, p: Summary | None, c: Summary | None) -> Kernel | Illegal:
        if s.opaque and p is None:
            return self._exact(s)
        form = form_of(s, p or s, c or s, self.facts)
        if form is None:
            return (p and c and self._prologue_precheck(p, c)) or self._exact(s)
        if isinstance(form, Illegal):
            return form
        cost, pressure = summary_cost(s, form, self.nbytes, self.target)
        bad = budget_violation(len(s.names), pressure, self.target, self.budgets)
        return bad or self.budgets.cap_violation(s.names) or Kernel(-1, s, form, cost)

    def _prologue_precheck(self, p: Summary, c: Summary) -> Illegal | None:
        """A quick no for an expensive producer feeding a contraction's operand, before the
        node-level check (the usual case: a big pointwise kernel upstream of a matmul)."""
        if p.contractions or sum(p.pe.values()) <= PROLOGUE_MAX_FLOPS_PER_ELEMENT:
            return None
        contractions = [self.graph[v] for v in c.names if self.facts[v].kind is Kind.CONTRACTION]
        reads = {i for n in contractions for i in n.inputs}
        names = set(p.names | c.names)
        # The Triton templates load B tiles once per block of rows: packed_once is a CPU fact.
        once = not self.target.is_gpu and all(
            p.names & reads <= packed_once(n, names, self.graph) for n in contractions
        )
        if reads & p.names and not once:
            return Illegal(Rule.PROLOGUE_TOO_EXPENSIVE, "the producer is not a cheap operand prologue")
        return None

    def _exact(self, s: Summary) -> Kernel | Illegal:
        """Contractions and torch fallbacks: classified and costed from their nodes."""
        nodes = [self.graph[v] for v in self.ordered(s.names)]
        outputs = self.ordered(s.outputs)
        if s.in_torch:
            return self._in_torch(s, nodes[0])
        form = classify(nodes, outputs, self.graph)
        if isinstance(form, Illegal):
            return form
        bad = budget_violation(len(nodes), pressure_of(nodes, form, self.graph, self.target), self.target, self.budgets)
        bad = bad or self.budgets.cap_violation(s.names)
        if bad:
            return bad
        cost = kernel_cost(nodes, external_inputs(nodes), outputs, form, self.graph, self.target)
        if form.kind is Kind.CONTRACTION:
            s = with_prologue(s, form, self.facts)
        return Kernel(-1, s, form, cost)

    def _in_torch(self, s: Summary, node: Node) -> Kernel:
        """A scalar-libm node torch runs (`library.pointwise_choice`), at torch's predicted time."""
        domain = numel_of(node)
        form = Form(Rule.LIBRARY_POINTWISE.value, node.kind, domain, 0, {node.name: domain})
        choice = pointwise_choice(node, self.graph, self.target)
        assert choice is not None
        return Kernel(-1, s, form, replace(choice.cost, time_s=choice.torch_s))

    def _leaves(self, v: str, names: frozenset[str], replacing: frozenset[int], recomputed: frozenset[str]) -> bool:
        """Must `v` be written to memory? Yes when a graph output, or when some reader runs in
        another kernel: outside `names`, or a recomputed copy of a reader held elsewhere."""
        if self.graph.is_output(v):
            return True
        if v in recomputed or v in self.duplicated:
            return False
        for u in self.graph.users(v):
            if u not in names:
                return True
            held = self.holders.get(u, ())
            # u is in P or C; only a recomputed u (several holders) can also run elsewhere
            if len(held) > 1 and any(h not in replacing for h in held):
                return True
        return False

    def ordered(self, names: Iterable[str]) -> list[str]:
        return sorted(names, key=self.pos.__getitem__)

    # -- the kernel graph ------------------------------------------------------------------
    def add(self, k: Kernel, rank: int) -> Kernel:
        k = Kernel(self._next_id, k.summary, k.form, k.cost)
        self._next_id += 1
        self.kernels[k.id] = k
        self.rank[k.id] = rank
        for n in k.names:
            self.holders.setdefault(n, set()).add(k.id)
        return k

    def remove(self, k: Kernel) -> None:
        del self.kernels[k.id]
        del self.rank[k.id]
        for n in k.names:
            self.holders[n].discard(k.id)

    def consumers(self, k: Kernel) -> list[int]:
        """Kernels that read a value `k` writes (sorted ids, for a deterministic plan)."""
        out: set[int] = set()
        for v in k.outputs:
            for u in self.graph.users(v):
                out |= self.holders.get(u, set())
        out.discard(k.id)
        return sorted(out)

    def producers(self, k: Kernel) -> list[int]:
        out: set[int] = set()
        for v in k.summary.inputs:
            if self.facts[v].kind is not Kind.SOURCE:
                out |= self.holders[v]
        return sorted(out)

    def forward(self, p: Kernel, c: Kernel) -> set[int] | None:
        """Kernels reachable from P (not via C) ranked before C; None if one of them reaches C,
        i.e. merging P and C would create a cycle. Anything reaching C is ranked before it."""
        limit = self.rank[c.id]
        seen: set[int] = set()
        stack = [x for x in self.consumers(p) if x != c.id]
        while stack:
            x = stack.pop()
            if x == c.id:
                return None
            if x in seen or self.rank[x] > limit:
                continue
            seen.add(x)
            stack.extend(self.consumers(self.kernels[x]))
        return seen

    def backward(self, p: Kernel, c: Kernel) -> set[int]:
        """Kernels that reach C (not via P) ranked after P."""
        limit = self.rank[p.id]
        seen: set[int] = set()
        stack = [x for x in self.producers(c) if x != p.id]
        while stack:
            x = stack.pop()
            if x in seen or self.rank[x] < limit:
                continue
            seen.add(x)
            stack.extend(self.producers(self.kernels[x]))
        return seen

    def merge(self, p: Kernel, c: Kernel, merged: Kernel, ahead: set[int]) -> Kernel:
        """Replace P and C by `merged`; `ahead` = self.forward(p, c). The kernels that reach C
        keep their order before the merged kernel, those reached from P move after it, in the
        rank slots these kernels already occupied."""
        behind = self.backward(p, c)
        slots = sorted(self.rank[x] for x in (*ahead, *behind, p.id, c.id))
        before = sorted(behind, key=self.rank.__getitem__)
        after = sorted(ahead, key=self.rank.__getitem__)
        self.remove(p)
        self.remove(c)
        for x, slot in zip(before, slots, strict=False):
            self.rank[x] = slot
        new = self.add(merged, slots[len(before)])
        for x, slot in zip(after, slots[len(before) + 1 :], strict=False):
            self.rank[x] = slot
        return new

    def execution_order(self) -> list[Kernel]:
        order = sorted(self.kernels.values(), key=lambda k: self.rank[k.id])
        for k in order:
            if any(self.rank[q] >= self.rank[k.id] for q in self.producers(k)):
                raise AssertionError(f"kernel order broken at kernel {k.id}")
        return order
