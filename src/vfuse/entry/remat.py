"""Save or recompute: which forward values the backward keeps, decided by vfuse's cost model.

AOTAutograd hands the partitioner the joint forward+backward graph. Like torch's rematerializing
partitioner this is a min-cut (networkx), but the capacities are times on vfuse's target:

    keep a value       bytes x (write in forward + read back in backward) / Target.dram_bw
    recompute a value  its flops / Target.vector_f32 (transcendental ops: transcendental_f32)

Each forward node n becomes n_in -> n_out (capacity: keeping n) plus source -> n_in (capacity:
recomputing n); n_out -> user_in is infinite. Values the backward reads hang off the sink. A
cut through n_in -> n_out keeps n; a cut through source -> n_in recomputes n in the backward.
Never recomputed: graph inputs, contractions (the cost model's matrix peak is not what a
recomputed GEMM gets at these sizes, and torch's partitioner bans them too), mutations, random
ops (a recompute would draw another mask), higher-order ops. Every choice is recorded with its
figures (`RematPlan`), with the saved bytes: the activation memory held between forward and backward.
"""

from __future__ import annotations

import logging
import math
import operator
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import torch
from torch import fx
from torch._functorch import partitioners as tp
from torch._functorch.compile_utils import raise_getitems

try:
    from torch.fx.experimental.symbolic_shapes import optimization_hint
except ImportError:  # torch < 2.13 (e.g. a GPU machine's image): the older name of the same helper
    from torch.fx.experimental.symbolic_shapes import size_hint as optimization_hint
from torch.utils.flop_counter import flop_registry

from vfuse.frontend.attention_ops import register_flops
from vfuse.targets import Target

aten = torch.ops.aten
log = logging.getLogger("vfuse")  # entry/observe.py registers it with torch's logging
register_flops()  # vfuse's attention-dropout op pair counts as a contraction in the cut
# IR flops per element of the ops vfuse evaluates with exp-like polynomials (ir/defs' weights).
TRANSCENDENTAL = {
    aten.exp: 8, aten.log: 8, aten.tanh: 8, aten.sigmoid: 8, aten.erf: 8, aten.pow: 8, aten.rsqrt: 4,
    aten.sqrt: 4, aten.gelu: 14, aten.silu: 9, aten.gelu_backward: 20, aten.silu_backward: 12,
}  # fmt: skip
# Per-element flops of whole ops the ATen graph keeps (norms: mean, variance, normalize).
WHOLE = {aten.native_layer_norm: 8, aten.native_batch_norm: 8, aten._native_batch_norm_legit_functional: 8}
# Reductions that are not row reductions: BatchNorm's batch statistics (over N, H, W) and sums, means,
# variances over other than a trailing run of dims. Their result is needed before any element that
# uses it, so recomputing one in the backward is a pass of its own over its input, whose bytes a flop
# count misses (conv_bn_relu at 20 GB/s recomputed the BatchNorm, 0.37 us of flops, rather than keep
# a 1-byte ReLU mask, 0.46 us, though the recompute's pass reads the conv output's 18 KiB again).
BATCH_STATS = {aten._native_batch_norm_legit_functional, aten.native_batch_norm, aten._native_batch_norm_legit}
REDUCTIONS = {aten.sum, aten.mean, aten.var, aten.var_mean, aten.amax, aten.amin}
SIZE_KEEP_S = 1e-12  # a computed size: kept only where it cannot be recomputed
# Capacities are integers in these units: keeping then costs exactly bytes x a per-byte figure, so
# values that split one tensor (three selects of a stacked qkv) tie exactly with it, whatever
# dram_bw; as floats the tie was decided by rounding (sdpa_attention's backward got 3 MiB more).
FS = 1e15
SEEDED = "dropout mask: recomputed from its seed, never stored"
VIEWS = {
    aten.view, aten._unsafe_view, aten.reshape, aten.permute, aten.t, aten.transpose, aten.expand, aten.squeeze,
    aten.unsqueeze, aten.slice, aten.select, aten.split, aten.split_with_sizes, aten.alias, aten.as_strided,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Choice:
    """One forward value the backward needs, or one the partitioner could have kept."""

    name: str
    op: str
    nbytes: int
    flops: int
    keep_s: float  # bytes x 2 / dram_bw (0.0 for graph inputs: they are alive anyway)
    recompute_s: float  # math.inf when never recomputed
    kept: bool
    why: str


@dataclass
class RematPlan:
    """The partitioner's decisions for one joint graph."""

    choices: list[Choice] = field(default_factory=list)
    saved_bytes: int = 0  # every saved tensor's bytes, graph inputs included
    activation_bytes: int = 0  # saved tensors that are not graph inputs: what training holds extra

    @property
    def kept(self) -> list[Choice]:
        return [c for c in self.choices if c.kept]

    @property
    def recomputed(self) -> list[Choice]:
        return [c for c in self.choices if not c.kept]

    def text(self) -> str:
        lines = [
            f"saved for backward: {len(self.kept)} values, {self.saved_bytes} bytes "
            f"({self.activation_bytes} bytes of activations, the rest graph inputs); "
            f"{len(self.recomputed)} values recomputed in backward",
            f"{'value':<28} {'op':<26} {'bytes':>10} {'flops':>10} {'keep us':>9} {'recompute us':>12}  choice",
        ]
        for c in self.choices:
            rec = "never" if math.isinf(c.recompute_s) else f"{c.recompute_s * 1e6:.3f}"
            what = "keep" if c.kept else "recompute"
            figures = f"{c.nbytes:>10} {c.flops:>10} {c.keep_s * 1e6:>9.3f} {rec:>12}"
            lines.append(f"{c.name:<28} {c.op:<26} {figures}  {what}: {c.why}")
        return "\n".join(lines)


def _hint(n: int | torch.SymInt) -> int:
    """A size's value at the shapes traced, without a guard (int() on a symbolic size would pin
    the graph to these shapes, and Dynamo would compile it again for every other)."""
    return optimization_hint(n, fallback=4096)


def nbytes_of(node: fx.Node) -> int:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return _hint(val.numel()) * val.element_size()
    return 0


def _packet(node: fx.Node) -> Any:
    return getattr(node.target, "overloadpacket", None)


def _numel(node: fx.Node) -> int:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return _hint(val.numel())
    if isinstance(val, tuple | list):
        return max((_hint(v.numel()) for v in val if isinstance(v, torch.Tensor)), default=0)
    return 0


def _meta(a: Any) -> Any:
    return a.meta.get("val") if isinstance(a, fx.Node) else a


def flops_of(node: fx.Node) -> int:
    """Flops of one evaluation of `node`: torch's flop formulas for contractions, per element
    weights otherwise (views and getitem are free)."""
    packet = _packet(node)
    if node.op != "call_function" or node.target is operator.getitem or packet in VIEWS:
        return 0
    if packet in flop_registry:
        args, kwargs = torch.utils._pytree.tree_map(_meta, (node.args, node.kwargs))
        return _hint(flop_registry[packet](*args, out_val=node.meta.get("val"), **kwargs))
    if packet in (aten.sum, aten.mean, aten.amax, aten.amin, aten.var, aten.var_mean, aten._softmax):
        return sum(_numel(a) for a in node.all_input_nodes) * (4 if packet is aten._softmax else 1)
    return _numel(node) * TRANSCENDENTAL.get(packet, WHOLE.get(packet, 1))


def never_recomputed(node: fx.Node) -> str:
    """Why `node` must not run again in the backward ("" when it may)."""
    if node.op == "placeholder":
        return "graph input"
    if node.op != "call_function":
        return "not a function call"
    if node.meta.get("recompute") == tp.CheckpointPolicy.MUST_SAVE:
        return "torch marks it must-save"
    if node.target is operator.getitem or tp.is_sym_node(node):  # size arithmetic: free to redo
        return ""
    if not isinstance(node.target, torch._ops.OpOverload):
        return "higher-order or Python op"
    if _random(node):
        return "random: another call draws other numbers"
    if node.target._schema.is_mutable:
        return "mutates an input"
    if _packet(node) in flop_registry:
        return "contraction"
    return ""


def _random(node: fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in node.target.tags


def recompute_only(joint: fx.Graph) -> dict[fx.Node, str]:
    """Values with no graph input behind them, random draws aside: aranges, constants, and a
    dropout mask hashed from its seed (entry/dropout.py). The backward recomputes them; keeping
    one would hold bytes that cost nothing but a few integer ops per element. Node -> reason."""
    pure: set[fx.Node] = set()  # no graph input among the ancestors
    found: dict[fx.Node, str] = {}
    for node in joint.nodes:
        if node.op != "call_function" or not all(i in pure for i in node.all_input_nodes):
            continue
        pure.add(node)
        if _random(node) or never_recomputed(node):
            continue
        seeded = any(_random(i) or found.get(i) == SEEDED for i in node.all_input_nodes)
        found[node] = SEEDED if seeded else "computed from constants: recomputed, never stored"
    return found


def _recompute_s(node: fx.Node, flops: int, target: Target) -> float:
    """Flops at the target's rate, plus the pass over its input a recomputed non-row reduction reads."""
    transcendental = _packet(node) in TRANSCENDENTAL and target.transcendental_f32
    rate = target.transcendental_f32 if transcendental else target.vector_f32
    return flops / rate + pass_bytes(node) / target.dram_bw


def pass_bytes(node: fx.Node) -> int:
    """Bytes a recompute of `node` reads in a pass of its own (0: it fuses into its users' pass):
    the input of a reduction whose result every element waits for and that is not a row reduction
    (a row kernel recomputes those in the pass that reads the row)."""
    packet, x = _packet(node), node.args[0] if node.args else None
    if not isinstance(x, fx.Node):
        return 0
    if packet in BATCH_STATS:
        return nbytes_of(x) if _arg(node, "training", True) else 0
    if packet in REDUCTIONS:
        val = x.meta.get("val")
        rank = val.dim() if isinstance(val, torch.Tensor) else 0
        dims = _arg(node, "dim", None)
        if isinstance(dims, int):
            dims = [dims]
        if not rank or not isinstance(dims, list | tuple) or not dims:
            return nbytes_of(x)  # a whole-tensor reduction
        reduced = sorted(d % rank for d in dims)
        return 0 if reduced == list(range(rank - len(reduced), rank)) else nbytes_of(x)
    return 0


def _arg(node: fx.Node, name: str, default: Any) -> Any:
    """Argument `name` of an ATen call, by its schema (overloads place it differently)."""
    for i, a in enumerate(node.target._schema.arguments):  # type: ignore[union-attr]
        if a.name == name:
            return node.args[i] if i < len(node.args) else node.kwargs.get(name, default)
    return default


def _units(seconds: float) -> float | int:
    """A capacity: whole femtoseconds (math.inf stays infinite)."""
    return seconds if math.isinf(seconds) else round(seconds * FS)


class _Cut:
    """The flow network of one joint graph, its cut, and the figures behind each capacity."""

    def __init__(self, joint: fx.Graph, info: Any, target: Target) -> None:
        self.g: nx.DiGraph = nx.DiGraph()
        self.figures: dict[str, tuple[fx.Node, int, float, float, str]] = {}
        self.forced = recompute_only(joint)
        for node in joint.nodes:
            if node.op != "output":
                self._add(node, info, target)

    def _add(self, node: fx.Node, info: Any, target: Target) -> None:
        name, g = node.name, self.g
        if node in info.required_bw_nodes:
            if node in info.tangents_closure:  # computed in the backward anyway
                g.add_edge(name + "_in", "sink", capacity=math.inf)
                return
            g.add_edge(name + "_out", "sink", capacity=math.inf)  # the backward reads it
        why = never_recomputed(node)
        flops = flops_of(node)
        is_input = node.op == "placeholder"
        recompute = math.inf if why else _recompute_s(node, flops, target)
        if info.is_required_fw(node) or is_input:
            g.add_edge("source", name + "_in", capacity=_units(recompute))
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            keep = 0.0 if is_input else nbytes_of(node) * round(2 * FS / target.dram_bw) / FS
        elif isinstance(val, torch.SymInt | torch.SymFloat | torch.SymBool | int | float):
            # A size: an input is kept for free; a computed one is recomputed from those (as torch's
            # partitions do, so a symbolic graph still matches the fixed-shape one it may reuse).
            keep = 0.0 if is_input else SIZE_KEEP_S
        else:
            keep = math.inf  # a tuple: its getitems are kept instead
        if node in self.forced:
            keep, why = math.inf, self.forced[node]
        g.add_edge(name + "_in", name + "_out", capacity=_units(keep))
        for user in node.users:
            g.add_edge(name + "_out", user.name + "_in", capacity=math.inf)
        self.figures[name] = (node, flops, keep, recompute, why)

    def solve(self) -> tuple[set[str], set[str]]:
        """(names kept, names recomputed in the backward). Of equal cuts, networkx returns the
        one nearest the sink (its side: what reaches the sink in the residual graph): the values
        the backward reads themselves, not a tensor they are views of, which the backward would
        copy them out of again."""
        _, (reachable, unreachable) = nx.minimum_cut(self.g, "source", "sink")
        kept, recomputed = set(), set()
        for u in reachable:
            for v in self.g[u]:
                if v in unreachable and u != "source":
                    kept.add(u[: -len("_in")])
        for name, (node, *_rest) in self.figures.items():
            if name + "_in" in unreachable and node.op == "call_function" and "source" in self.g.pred[name + "_in"]:
                recomputed.add(name)
        return kept, recomputed


def _plan(cut: _Cut, kept: set[str], recomputed: set[str]) -> RematPlan:
    plan = RematPlan()
    for name, (node, flops, keep, recompute, why) in cut.figures.items():
        if name not in kept and name not in recomputed:
            continue
        nbytes = nbytes_of(node)
        if name in kept:
            reason = why or ("graph input" if node.op == "placeholder" else "keeping is cheaper")
            plan.saved_bytes += nbytes
            plan.activation_bytes += 0 if node.op == "placeholder" else nbytes
        else:
            reason = why or ("recomputing is cheaper" if flops else "free (a view)")
        plan.choices.append(Choice(name, _op_name(node), nbytes, flops, keep, recompute, name in kept, reason))
    return plan


def _op_name(node: fx.Node) -> str:
    if node.op == "placeholder":
        return "input"
    return str(_packet(node) or getattr(node.target, "__name__", node.target))


def partition(
    joint_module: fx.GraphModule,
    joint_inputs: Any,
    *,
    num_fwd_outputs: int,
    target: Callable[[], Target],
    record: Callable[[RematPlan], None] = lambda plan: None,
    static_lifetime_input_indices: list[int] | None = None,
    **kwargs: Any,
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """AOTAutograd's partition_fn: the forward and backward modules, the saved values chosen by
    the min-cut above. Graphs torch's own rules must handle (activation-checkpoint tags, nothing
    to save) go to torch's partitioners."""
    joint_module.graph.eliminate_dead_code()
    joint_module.recompile()
    indices = static_lifetime_input_indices or []
    if tp.has_recomputable_ops(joint_module):  # torch.utils.checkpoint regions: torch's policy
        return tp.min_cut_rematerialization_partition(
            joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs, static_lifetime_input_indices=indices
        )
    tp.force_save_bw_mutation_src(joint_module)
    info = tp.classify_nodes(joint_module, indices, num_fwd_outputs)
    if not info.required_bw_nodes:
        return tp.default_partition(
            joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs, static_lifetime_input_indices=indices
        )
    try:
        cut = _Cut(joint_module.graph, info, target())
        kept, recomputed = cut.solve()
    except Exception as e:  # e.g. a value neither keepable nor recomputable: torch's rules, visibly
        warnings.warn(
            f"vfuse: save-or-recompute cut failed ({type(e).__name__}: {e}); torch's default partition", stacklevel=2
        )
        return tp.default_partition(
            joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs, static_lifetime_input_indices=indices
        )
    order = {n: i for i, n in enumerate(joint_module.graph.nodes)}
    saved = sorted((cut.figures[k][0] for k in kept), key=order.__getitem__)
    sym = [n for n in saved if tp.is_sym_node(n)]
    tensors = [n for n in saved if not tp.is_sym_node(n)]
    fw, bw = tp._extract_fwd_bwd_modules(
        joint_module,
        tensors,
        saved_sym_nodes=sym,
        num_fwd_outputs=num_fwd_outputs,
        static_lifetime_input_nodes=info.static_lifetime_input_nodes,
    )
    bw = tp.reordering_to_mimic_autograd_engine(bw)
    plan = _plan(cut, kept, recomputed)
    record(plan)
    # TORCH_LOGS=vfuse: the summary line; +vfuse: every choice with its figures.
    log.info("save or recompute: %s", plan.text().splitlines()[0])
    log.debug("save or recompute, every choice:\n%s", plan.text())
    return raise_getitems(fw), raise_getitems(bw)
