"""The fusion planner: XLA-style priority fusion over producer -> consumer merges.

Start with one kernel per compute node (an OPAQUE node takes its GET_ITEMs). Each producer
kernel is scored by its best legal action and queued by predicted gain t(P) + t(C) - t(P u C):
- merge into one consumer (when P feeds others too, the merged kernel still writes P's values
  for them: a multi-output kernel; otherwise P's values never reach memory), or
- recompute: duplicate a cheap pointwise P into every consumer, so P disappears.
After a merge the new kernel is scored and its producers are marked for re-scoring when next
popped (lazy greedy: a kernel next to a growing one changes many times before its turn);
queue entries of dead or re-scored kernels are skipped. A linear pre-pass first folds kernels
with a single consumer kernel into it (no alternative to weigh there). Every candidate rejected
by a rule or by the cost model, and every accepted one, is logged as a Decision.
"""

from __future__ import annotations

import contextlib
import gc
import heapq
from collections.abc import Iterator
from dataclasses import dataclass

from vfuse.fusion.columns import fold_column_sums
from vfuse.fusion.cost import external_inputs
from vfuse.fusion.forms import POINTWISE_KINDS, Illegal
from vfuse.fusion.groups import Kernel, KernelTable
from vfuse.fusion.horizontal import horizontal
from vfuse.fusion.legality import Budgets, allowing_rule
from vfuse.fusion.plan import Decision, FusionPlan, Group
from vfuse.fusion.rules import Rule
from vfuse.ir import Graph, Kind, Op
from vfuse.targets import Target

# A producer is recomputed in each consumer only when it costs a few instructions per element
# (add, mul, cast, compare, select); transcendentals (exp = 8, see ir/defs/pointwise.py) are not.
RECOMPUTE_MAX_FLOPS_PER_ELEMENT = 4.0
CYCLE_REASON = "another kernel lies on a path from producer to consumer"


@dataclass(frozen=True, slots=True)
class _Option:
    """A scored action for one producer: the kernels it would create, one per consumer."""

    gain: float
    producer: int
    consumers: tuple[int, ...]
    merged: tuple[Kernel, ...]
    rule: Rule
    recompute: bool


def _us(t: float) -> str:
    return f"{t * 1e6:.3g}us"


class _Planner:
    """One planning run; all state is local to it."""

    def __init__(self, graph: Graph, target: Target, budgets: Budgets) -> None:
        self.table = KernelTable(graph, target, budgets)
        self.queue: list[tuple[float, int, int]] = []  # (-gain, seq, producer id)
        self.best: dict[int, tuple[int, _Option]] = {}  # producer id -> (seq, its queued option)
        self.decisions: list[Decision] = []
        self.dirty: set[int] = set()  # producers to re-score when popped
        self._logged: set[tuple[int, int, str]] = set()
        self._built: dict[tuple[int, int, bool], Kernel | Illegal] = {}
        self._names: dict[int, tuple[str, ...]] = {}
        self._seq = 0

    def seed(self) -> None:
        g = self.table.graph
        for node in g.compute_nodes:
            if node.op is Op.GET_ITEM and g[node.inputs[0]].op is Op.OPAQUE:
                continue  # joins its OPAQUE node's kernel
            extra = [g[u] for u in g.users(node.name) if node.op is Op.OPAQUE and g[u].op is Op.GET_ITEM]
            self.table.seed([node, *extra])

    def chains(self) -> None:
        """Pre-pass: fold each kernel into its only consumer kernel when legal and profitable.
        With one consumer there is no alternative to weigh (no cycle, nothing to duplicate or
        keep writing), so taking these merges in one linear sweep leaves the priority queue
        only the real choices; the rules, budgets and gain are checked as there."""
        t = self.table
        for kid in sorted(t.kernels, key=t.rank.__getitem__):
            p = t.kernels.get(kid)
            while p is not None and p.form.kind is not Kind.OPAQUE:
                consumers = t.consumers(p)
                if len(consumers) != 1:
                    break
                c = t.kernels[consumers[0]]
                k = self._build(p, c, False)
                if isinstance(k, Illegal):
                    break
                gain = p.cost.time_s + c.cost.time_s - k.cost.time_s
                if gain <= 0:
                    break
                opt = _Option(gain, p.id, (c.id,), (k,), allowing_rule(p.summary, c.summary, k.form), False)
                p = self._apply_merge(p, c, opt, set())

    def score_all(self) -> None:
        for k in list(self.table.kernels.values()):
            self.score(k)

    def run(self) -> None:
        while self.queue:
            _, seq, pid = heapq.heappop(self.queue)
            if pid not in self.table.kernels:
                continue  # the producer died since
            if pid in self.dirty:
                # Its consumers changed after it was queued: score it now, at its turn, instead
                # of after every change (a kernel next to a growing one changes many times).
                self.dirty.discard(pid)
                self.score(self.table.kernels[pid])
                continue
            entry = self.best.get(pid)
            if entry is None or entry[0] != seq:
                continue  # stale: re-scored since
            opt = entry[1]
            del self.best[pid]
            if all(c in self.table.kernels for c in opt.consumers):
                self.apply(opt)

    # -- scoring -------------------------------------------------------------------------
    def score(self, p: Kernel) -> None:
        consumers = self.table.consumers(p)
        if not consumers:
            return
        options = [self._merge_option(p, self.table.kernels[c]) for c in consumers]
        if len(consumers) > 1:
            options.append(self._recompute_option(p, consumers))
        # The cycle search is the costly check and depends on the whole kernel graph, so it
        # runs only on the best options, until one passes.
        for opt in sorted((o for o in options if o is not None), key=lambda o: -o.gain):
            c = self.table.kernels[opt.consumers[0]]
            if opt.recompute or self.table.forward(p, c) is not None:
                self._seq += 1
                self.best[p.id] = (self._seq, opt)
                heapq.heappush(self.queue, (-opt.gain, self._seq, p.id))
                return
            self._reject(p, c, Rule.WOULD_CREATE_CYCLE, CYCLE_REASON)
        self.best.pop(p.id, None)

    def _build(self, p: Kernel, c: Kernel, recompute: bool) -> Kernel | Illegal:
        # Kernels never change (a merge makes new ids), so a pair's answer can be reused.
        key = (p.id, c.id, recompute)
        if key not in self._built:
            self._built[key] = self.table.build(p, c, recompute)
        return self._built[key]

    def _merge_option(self, p: Kernel, c: Kernel) -> _Option | None:
        k = self._build(p, c, False)
        if isinstance(k, Illegal):
            self._reject(p, c, k.rule, k.reason)
            return None
        gain = p.cost.time_s + c.cost.time_s - k.cost.time_s
        if gain <= 0:
            self._reject(p, c, Rule.UNPROFITABLE, self._figures(p, (c,), (k,)), gain)
            return None
        return _Option(gain, p.id, (c.id,), (k,), allowing_rule(p.summary, c.summary, k.form), False)

    def _recompute_option(self, p: Kernel, consumers: list[int]) -> _Option | None:
        cs = tuple(self.table.kernels[c] for c in consumers)
        blocked = self._recompute_blocker(p)
        if blocked:
            # a property of the producer alone: logged once, against its first consumer
            self._reject(p, cs[0], blocked[0], f"not recomputed in its {len(cs)} consumers: {blocked[1]}")
            return None
        merged: list[Kernel] = []
        for c in cs:
            k = self._build(p, c, True)
            if isinstance(k, Illegal):
                self._reject(p, c, k.rule, f"recompute into it: {k.reason}")
                return None
            merged.append(k)
        gain = p.cost.time_s + sum(c.cost.time_s for c in cs) - sum(k.cost.time_s for k in merged)
        if gain <= 0:
            for c in cs:
                self._reject(p, c, Rule.RECOMPUTE_UNPROFITABLE, self._figures(p, cs, tuple(merged)), gain)
            return None
        return _Option(gain, p.id, tuple(consumers), tuple(merged), Rule.RECOMPUTE_INTO_CONSUMERS, True)

    def _recompute_blocker(self, p: Kernel) -> tuple[Rule, str] | None:
        """Why `p` may not be duplicated into its consumers, or None."""
        g = self.table.graph
        if p.summary.top not in POINTWISE_KINDS:
            return Rule.RECOMPUTE_TOO_EXPENSIVE, f"only pointwise producers are recomputed, this is {p.form.label}"
        flops = sum(p.summary.pe.values())
        if flops > RECOMPUTE_MAX_FLOPS_PER_ELEMENT:
            return Rule.RECOMPUTE_TOO_EXPENSIVE, f"{flops:g} flops/element > {RECOMPUTE_MAX_FLOPS_PER_ELEMENT:g}"
        if any(g.is_output(n) for n in p.names):
            return Rule.RECOMPUTE_GRAPH_OUTPUT, "a graph output is written by exactly one kernel"
        return None

    @staticmethod
    def _figures(p: Kernel, cs: tuple[Kernel, ...], merged: tuple[Kernel, ...]) -> str:
        before = p.cost.time_s + sum(c.cost.time_s for c in cs)
        after = sum(k.cost.time_s for k in merged)
        worst = max(merged, key=lambda k: k.cost.time_s).cost
        return (
            f"t {_us(before)} -> {_us(after)} (fused: {worst.bound}-bound, "
            f"pressure {worst.pressure:.2f}, parallelism {worst.parallelism:.2g})"
        )

    # -- applying and logging ------------------------------------------------------------
    def apply(self, opt: _Option) -> None:
        t = self.table
        p = t.kernels[opt.producer]
        cs = [t.kernels[c] for c in opt.consumers]
        if opt.recompute:
            new = self._apply_recompute(p, cs, opt.merged)
        else:
            ahead = t.forward(p, cs[0])
            if ahead is None:
                # A merge elsewhere has since put a kernel on a path from P to C: look again.
                self._reject(p, cs[0], Rule.WOULD_CREATE_CYCLE, CYCLE_REASON)
                self.score(p)
                return
            new = [self._apply_merge(p, cs[0], opt, ahead)]
        if opt.recompute:
            for c, k in zip(cs, new, strict=True):
                self._accept(p, c, k, opt)
        for k in new:
            self.score(k)
            for q in t.producers(k):
                self._rescore_later(q)

    def _rescore_later(self, q: int) -> None:
        """Mark producer q for re-scoring when it is next popped. Its queued gain is kept as the
        key (lazy greedy); one that had no option is queued at about one launch of gain."""
        if q in self.dirty:
            return
        self.dirty.add(q)
        entry = self.best.get(q)
        gain = entry[1].gain if entry else self.table.target.launch_s
        self._seq += 1
        heapq.heappush(self.queue, (-gain, self._seq, q))

    def _apply_merge(self, p: Kernel, c: Kernel, opt: _Option, ahead: set[int]) -> Kernel:
        self._accept(p, c, opt.merged[0], opt)
        return self.table.merge(p, c, opt.merged[0], ahead)

    def _accept(self, p: Kernel, c: Kernel, k: Kernel, opt: _Option) -> None:
        what = "recomputed in" if opt.recompute else "merged into"
        reason = f"{what} {k.form.label} kernel; {self._figures(p, (c,), (k,))}"
        self.decisions.append(Decision(self.names(p), self.names(c), True, opt.rule, reason, opt.gain))

    def _apply_recompute(self, p: Kernel, cs: list[Kernel], merged: tuple[Kernel, ...]) -> list[Kernel]:
        """Each consumer takes a copy of P and keeps its place in the order (P ran before it)."""
        t = self.table
        ranks = [t.rank[c.id] for c in cs]
        t.remove(p)
        for c in cs:
            t.remove(c)
        t.duplicated |= p.names
        return [t.add(k, r) for k, r in zip(merged, ranks, strict=True)]

    def names(self, k: Kernel) -> tuple[str, ...]:
        if k.id not in self._names:
            self._names[k.id] = tuple(self.table.ordered(k.names))
        return self._names[k.id]

    def _reject(self, p: Kernel, c: Kernel, rule: Rule, reason: str, gain: float | None = None) -> None:
        key = (p.id, c.id, rule)
        if key in self._logged:
            return
        self._logged.add(key)
        self.decisions.append(Decision(self.names(p), self.names(c), False, rule, reason, gain))

    def _group(self, index: int, k: Kernel) -> Group:
        """The plan's record of a kernel, with the figures it was planned with."""
        g = self.table.graph
        inputs = external_inputs([g[v] for v in self.names(k)])
        outputs = tuple(self.table.ordered(k.outputs))
        return Group(index, self.names(k), k.form.kind, k.form.label, inputs, outputs, k.cost)

    def plan(self) -> FusionPlan:
        order = self.table.execution_order()
        groups = tuple(self._group(i, k) for i, k in enumerate(order))
        return FusionPlan(self.table.graph, self.table.target.name, groups, tuple(self.decisions))


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Planning allocates ~10^5 small acyclic objects (summaries, frozensets), which triggers
    the cyclic collector over and over, each time traversing the whole IR: ~1/3 of the time of
    a 10,000-node plan. Reference counting frees them all anyway; the collector's previous
    state is restored on exit."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def plan_fusion(graph: Graph, target: Target, budgets: Budgets | None = None) -> FusionPlan:
    """Group `graph`'s compute nodes into kernels for `target`, with the decision log."""
    with _cyclic_gc_paused():
        planner = _Planner(graph, target, budgets or Budgets())
        planner.seed()
        planner.chains()
        planner.score_all()
        planner.run()
        plan = planner.plan()
    # CPU only: the Triton renderer has no horizontal walk (a GPU would want one launch too),
    # and its GEMM template no column sums (fusion/columns.py).
    return plan if target.is_gpu else horizontal(fold_column_sums(plan), target.launch_s)
