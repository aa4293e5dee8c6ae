"""Lower a group's IR nodes to kernel statements by demand, through index maps.

Starting from the values a kernel must store, `Lowerer.value(node, coords)` returns the C++
variable holding `node` at index `coords` (a tuple of `Lin`, one per dim of the node's shape),
emitting the statements that compute it. Views never copy: RESHAPE/PERMUTE/EXPAND/SLICE and
implicit broadcasting rewrite coordinates, CAT selects between its inputs (branch-free, so
the loop stays vectorizable), EMBEDDING turns a loaded index into a `Dyn` coordinate. Values
outside the group are loads from their buffers. Memoized on (node, coords): a value read
twice at the same index is computed once, one read through a transpose is computed again.
"""

from __future__ import annotations

from dataclasses import dataclass

from vfuse.ir import Attrs, DType, Graph, Kind, Node, Op
from vfuse.ir.defs.layout import IndexBounds, index_bounds
from vfuse.ir.defs.pointwise import INT_DIVISION
from vfuse.ir.sym import same
from vfuse.schedule import expr
from vfuse.schedule.expr import Lin, Var
from vfuse.schedule.kernel import Compute, Const, IndexCheck, Iota, Load, Rand, RandKey, Reduce, Select, Stmt

Coords = tuple[Lin, ...]


class Unsupported(Exception):
    """This group cannot be generated as a native kernel; the caller runs it through torch."""


@dataclass(frozen=True)
class RowSpace:
    """The full space S of a row kernel's reductions and how its dims map to loop variables."""

    shape: tuple[int, ...]
    axes: tuple[int, ...]
    var_of_dim: tuple[int, ...]  # loop var id for each dim of S

    def full_coords(self) -> Coords:
        return tuple(Lin.var(Var(v)) for v in self.var_of_dim)

    def reduced_coords(self, keepdim: bool) -> Coords:
        return tuple(
            Lin() if d in self.axes else Lin.var(Var(v))
            for d, v in enumerate(self.var_of_dim)
            if keepdim or d not in self.axes
        )


def broadcast_coords(coords: Coords, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> Coords:
    lead = len(out_shape) - len(in_shape)
    return tuple(Lin() if n == 1 else coords[lead + j] for j, n in enumerate(in_shape))


class Lowerer:
    """Emits statements for one kernel; `sizes` holds the extent of every loop variable.
    `faults`: the kernel can report faults (a gather's index out of range, an integer division
    by zero) to the runtime; contraction templates cannot, so their lowerers refuse those ops."""

    faults = True

    def __init__(self, graph: Graph, internal: set[str], sizes: dict[int, int], row: RowSpace | None) -> None:
        self.graph = graph
        self.internal = internal
        self.sizes = sizes
        self.row = row
        self.stmts: list[Stmt] = []
        self.loaded: set[str] = set()  # values read from memory
        self.checks: list[IndexCheck] = []  # checked whether or not a statement reads the row
        self._memo: dict[tuple[str, Coords], str] = {}
        self._count = 0

    def fresh(self) -> str:
        self._count += 1
        return f"t{self._count}"

    def emit(self, s: Stmt) -> str:
        self.stmts.append(s)
        return s.var

    def value(self, name: str, coords: Coords) -> str:
        # A size-1 dim is always index 0: one spelling keeps the memo (and row checks) exact.
        shape = self.graph[name].tensor_type.shape
        coords = tuple(Lin() if n == 1 else c for c, n in zip(coords, shape, strict=True))
        key = (name, coords)
        if key not in self._memo:
            self._memo[key] = self._lower(self.graph[name], coords)
        return self._memo[key]

    def _lower(self, node: Node, coords: Coords) -> str:
        if node.name not in self.internal or node.kind is Kind.SOURCE:
            self.loaded.add(node.name)
            index = expr.row_major(coords, node.tensor_type.shape)
            return self.emit(Load(self.fresh(), node.tensor_type.dtype, node.name, index))
        if node.kind is Kind.REDUCE:
            return self._reduce(node, coords)
        if node.kind in (Kind.CONTRACTION, Kind.OPAQUE):
            raise Unsupported(f"{node.op.value} inside a native kernel")
        view = _VIEWS.get(node.op)
        if view is not None:
            return view(self, node, coords)
        return self._pointwise(node, coords)

    def _pointwise(self, node: Node, coords: Coords) -> str:
        t = node.tensor_type
        if node.op is Op.FULL:
            return self.emit(Const(self.fresh(), t.dtype, node.attrs["value"]))
        if node.op is Op.IOTA:
            return self.emit(Iota(self.fresh(), t.dtype, coords[0], node.attrs["start"], node.attrs["step"]))
        if node.op is Op.RAND:
            seed = self.value(node.inputs[0], ())
            key = self.emit(RandKey(self.fresh(), seed, node.attrs["stream"]))
            return self.emit(Rand(self.fresh(), key, expr.row_major(coords, t.shape)))
        args, dtypes = [], []
        for i in node.inputs:
            it = self.graph[i].tensor_type
            args.append(self.value(i, broadcast_coords(coords, it.shape, t.shape)))
            dtypes.append(it.dtype)
        attrs = node.attrs
        if node.op in INT_DIVISION and not t.dtype.is_float:
            if not self.faults:
                raise Unsupported(f"%{node.name}: integer division (reports division by zero) in a template")
            attrs = attrs.replace(node=node.name)  # names the node when it divides by zero
        return self.emit(Compute(self.fresh(), t.dtype, node.op, tuple(args), tuple(dtypes), attrs))

    def _reduce(self, node: Node, coords: Coords) -> str:
        axes, keepdim = tuple(node.attrs["axes"]), node.attrs["keepdim"]
        src = self.graph[node.inputs[0]].tensor_type
        if self.row is None or not same(self.row.shape, src.shape) or self.row.axes != axes:
            raise Unsupported(f"reductions of different spaces in one kernel ({node.name})")
        want = tuple(
            Lin() if n == 1 else c
            for c, n in zip(self.row.reduced_coords(keepdim), node.tensor_type.shape, strict=True)
        )
        if coords != want:
            raise Unsupported(f"%{node.name} is read at another row than the one it reduces")
        arg = self.value(node.inputs[0], self.row.full_coords())
        rcoords = tuple(Lin.var(Var(self.row.var_of_dim[a])) for a in axes)
        rindex = expr.row_major(rcoords, tuple(src.shape[a] for a in axes))
        var = self.fresh()
        return self.emit(Reduce(var, node.tensor_type.dtype, node.op, arg, src.dtype, rindex))


def _reshape(lw: Lowerer, node: Node, coords: Coords) -> str:
    src = lw.graph[node.inputs[0]].tensor_type.shape
    flat = expr.row_major(coords, node.tensor_type.shape)
    return lw.value(node.inputs[0], expr.unflatten(flat, src, lw.sizes))


def _permute(lw: Lowerer, node: Node, coords: Coords) -> str:
    perm = node.attrs["perm"]
    src: list[Lin] = [Lin()] * len(perm)
    for k, p in enumerate(perm):
        src[p] = coords[k]
    return lw.value(node.inputs[0], tuple(src))


def _expand(lw: Lowerer, node: Node, coords: Coords) -> str:
    src = lw.graph[node.inputs[0]].tensor_type.shape
    return lw.value(node.inputs[0], broadcast_coords(coords, src, node.tensor_type.shape))


def _slice(lw: Lowerer, node: Node, coords: Coords) -> str:
    a = node.attrs
    src = list(coords)
    src[a["dim"]] = coords[a["dim"]] * a["step"] + a["start"]
    return lw.value(node.inputs[0], tuple(src))


def _cat(lw: Lowerer, node: Node, coords: Coords) -> str:
    dim = node.attrs["dim"]
    args, bounds, offset = [], [], 0
    for i in node.inputs:
        n = lw.graph[i].tensor_type.shape[dim]
        if n == 0:
            continue
        # Every branch is evaluated (branch-free select keeps the loop a SIMD loop), so each
        # reads at a clamped, always in-bounds index.
        src = list(coords)
        src[dim] = expr.clamp(coords[dim] - offset, 0, n - 1, lw.sizes)
        args.append(lw.value(i, tuple(src)))
        offset += n
        bounds.append(offset)
    if len(args) == 1:
        return args[0]
    t = node.tensor_type
    return lw.emit(Select(lw.fresh(), t.dtype, coords[dim], tuple(bounds[:-1]), tuple(args)))


def index_buffer(graph: Graph, internal: set[str], idx: str) -> str | None:
    """The buffer a kernel of `internal` reads the gather index `idx` from, through in-kernel
    views that keep its set of values (reshape, permute, expand); None when it computes `idx`."""
    while idx in internal and graph[idx].op in (Op.RESHAPE, Op.PERMUTE, Op.EXPAND):
        idx = graph[idx].inputs[0]
    return idx if idx not in internal or graph[idx].kind is Kind.SOURCE else None


def _embedding(lw: Lowerer, node: Node, coords: Coords) -> str:
    """A row read at a loaded index. A checked gather's kernel checks the whole index buffer
    before its loops (`Kernel.checks`: also where no statement reads the row, e.g. a table of
    one row), so here negative indices only wrap where the gather wraps."""
    table, idx = node.inputs
    row = lw.value(idx, coords[:-1])
    bounds = index_bounds(node.attrs)
    if bounds is not IndexBounds.TRUSTED:
        buf = index_buffer(lw.graph, lw.internal, idx)
        if buf is None or not lw.faults:
            raise Unsupported(f"%{node.name}: gather index %{idx} is not checked in one pass over a buffer")
        rows = lw.graph[table].tensor_type.shape[0]
        lw.loaded.add(buf)
        lw.checks.append(IndexCheck(buf, rows, bounds is IndexBounds.WRAP, node.name))
        if bounds is IndexBounds.WRAP:
            dtype = lw.graph[idx].tensor_type.dtype
            row = lw.emit(Compute(lw.fresh(), DType.I64, Op.EMBEDDING, (row,), (dtype,), Attrs.of(rows=rows)))
    return lw.value(table, (Lin(0, ((expr.Dyn(row), 1),)), coords[-1]))


_VIEWS = {
    Op.RESHAPE: _reshape,
    Op.PERMUTE: _permute,
    Op.EXPAND: _expand,
    Op.SLICE: _slice,
    Op.CAT: _cat,
    Op.EMBEDDING: _embedding,
}
